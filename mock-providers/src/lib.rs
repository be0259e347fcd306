//! Fake LINE, SMTP and SMS providers: the harness's source of truth.
//!
//! What these servers accepted is what a customer received. Every request and callback is written
//! to the [`ledger::Ledger`] before any response goes back, so the ledger never under-reports a send.
//! Faults are decided by [`faults`] from (seed, provider, recipient, attempt) and never from timing,
//! so a failing run can be replayed exactly.
//!
//! The exceptions, each by nature and documented where it is decided:
//! - a provider-wide `outage` (503 or no answer) lasts while it is set ([`outage`]);
//! - the LINE / SMS `rate_limit` is a token bucket: timing-based, and the 429s it answers use
//!   attempt numbers ([`ratelimit`]);
//! - an SMTP greeting fault is decided before anything about the message is known, keyed on the
//!   connection's ordinal, and a MAIL fault on the ordinal of the MAIL among that sender's: the
//!   sequence of faults is fixed per seed, but which connection or transaction meets the n-th is
//!   arrival order ([`smtp::plan`]);
//! - an SMTP transaction with several recipients gets one reply after DATA, so its DATA-and-after
//!   faults are keyed on its set of (recipient, attempt) pairs: deterministic, but a recipient's
//!   fate there depends on the recipients it was batched with ([`smtp::plan`]).
//!
//! `README.md` beside this crate summarises the contracts, the ledger and the control API.
//!
//! This crate must never import the harness or the stack: it knows them only by wire protocol.

mod accept;
pub mod bench;
pub mod callbacks;
pub mod config;
pub mod control;
pub mod decide;
pub mod faults;
mod http;
pub mod hub;
pub mod latency;
pub mod ledger;
pub mod line;
pub mod link;
pub mod live;
pub mod outage;
pub mod packed;
pub mod ratelimit;
mod run;
pub mod shared;
pub mod signing;
pub mod sms;
pub mod smtp;
pub mod units;
pub mod validate;

pub use run::{start, start_on, start_with_ports, Listeners, Ports, Providers};
