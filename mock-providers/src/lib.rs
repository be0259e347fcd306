//! Fake LINE, SMTP and SMS providers: the harness's source of truth.
//!
//! What these servers accepted is what a customer received. Every request and callback is written
//! to the [`ledger::Ledger`] before any response goes back, so the ledger never under-reports a send.
//! Faults are decided by [`faults`] from (seed, provider, recipient, attempt) and never from timing,
//! so a failing run can be replayed exactly.
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
pub mod live;
pub mod ratelimit;
mod run;
pub mod signing;
pub mod sms;
pub mod smtp;
pub mod units;

pub use run::{start, start_on, Listeners, Providers};
