//! The fake SMTP provider: a real SMTP server on TCP with seeded fault injection at every stage.
//!
//! This is the one place the project writes protocol code by hand, because it must expose fault
//! hooks no library offers. It is split so each layer is testable alone:
//! [`command`] parses a line (pure), [`session`] is the state machine (pure, asks a
//! [`session::Policy`]), [`plan`] makes the seeded decisions (pure), [`policy`] and [`commit`]
//! record them to the ledger, [`mime`] decodes accepted messages, and [`conn`] is the only code
//! that touches the socket.
//!
//! What the ledger gets (provider `smtp`, kind `send`):
//! - one entry per recipient per transaction that reached a decision: `Accepted` at the end of
//!   DATA, or `Transient` / `Permanent` with `fault` set (`"rcpt 451"`, `"bad_address"`,
//!   `"data 554"`, `"data_end 452"`, `"drop_mid_data"`) and `error` = the reply line;
//! - accepted entries carry `message_id` = `idempotency_key` = the `Message-ID` header without
//!   angle brackets (a generated id and no key if the message had none), `subject`, `body` (the
//!   decoded text/plain part), `html` (the decoded text/html part), both with `\n` line endings,
//!   `payload_hash` = [`mime::payload_hash`] of those, `status` `"250 2.0.0"`, `peer`,
//!   `callback_url` = the message's `X-Events-Url` header if it has one, and `email`
//!   ([`crate::ledger::EmailDetail`]): the envelope (`MAIL FROM`, every accepted `RCPT TO`),
//!   every header field in order as sent, and the size, SHA-256 and body SHA-256 of the message
//!   as received;
//! - during an outage (`outage` in the profile): `Transient` at the RCPT, `fault` `outage_421`
//!   (answered `421 4.3.2` and closed) or `outage_hang` (never answered; recorded with `status`
//!   `no_answer` when the client hangs up, `client_hung_up` set);
//! - accept-then-drop: `Accepted`, `fault` `"accept_then_drop"`, `status` `"dropped"`;
//! - greeting and MAIL faults (no recipient known yet): recipient `""`, `attempt` = the
//!   connection's ordinal / the ordinal of the MAIL among the sender's (see [`plan`]);
//!   MAIL SIZE rejections: recipient `""`, attempt 0;
//! - syntax and sequence errors: `ProtocolError`, recipient `""`, attempt 0, `error` = reply and
//!   the offending command; an over-long line inside DATA: `ProtocolError` per recipient.
//!
//! Which faults are deterministic and on what key is documented in [`plan`]: RCPT decisions are
//! each recipient's own; DATA-and-after decisions are the transaction's; greeting and MAIL
//! faults follow arrival order by nature.
//!
//! PIPELINING (RFC 2920) is served by answering buffered commands in order and flushing only
//! when no complete command is waiting. It is tested with a raw client writing several commands
//! at once (`tests/smtp_protocol.rs`): lettre, the third-party client of the tests, does not
//! pipeline.
//!
//! A transaction the client abandons (RSET, QUIT, disconnect before the final dot) reached no
//! decision and leaves no entry, though its recipients' attempt numbers stay used.

pub mod command;
mod commit;
mod conn;
pub mod data;
pub mod mime;
pub mod plan;
pub mod policy;
pub mod reply;
pub mod session;

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::TcpListener;

use crate::config::SmtpConfig;
use crate::ledger::{Ledger, LedgerEntry};

pub use commit::{EndOfData, DROPPED};
pub use conn::{read_line, Line};
pub use session::SessionLimits;

/// Everything the SMTP server shares with the rest of the mock providers.
#[derive(Clone)]
pub struct SmtpContext {
    pub seed: u64,
    /// Read at each connection's greeting and at each MAIL (can change mid-run).
    pub config: Arc<RwLock<SmtpConfig>>,
    pub ledger: Ledger,
    /// Called after each accepted message is recorded and answered (schedules delivery events).
    pub on_commit: Arc<dyn Fn(&LedgerEntry) + Send + Sync>,
    /// Called for each recipient an outage answered 421 or began to hold ([`crate::outage`]).
    pub on_outage: Arc<dyn Fn() + Send + Sync>,
}

/// Server limits that are not part of a scenario's fault profile.
#[derive(Clone, Debug)]
pub struct Limits {
    /// A connection silent this long gets `421 4.4.2` and is closed (RFC 5321 §4.5.3.2.7: 5 min).
    pub idle_timeout: Duration,
    /// After shutdown, how long open connections get to finish before they are aborted.
    pub shutdown_grace: Duration,
    pub session: SessionLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            idle_timeout: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(5),
            session: SessionLimits::default(),
        }
    }
}

/// Serves SMTP on `listener` until `shutdown` completes, with default [`Limits`].
pub async fn run(
    listener: TcpListener,
    ctx: SmtpContext,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve(listener, ctx, Limits::default(), shutdown).await
}

/// Serves SMTP on `listener` until `shutdown` completes. Each accepted connection's task awaits
/// the ledger's connection hooks ([`Ledger::on_connect`], bounded) before the greeting. Idle
/// connections are then told `421 4.3.2` and closed; connections inside a transaction get
/// `limits.shutdown_grace`.
pub async fn serve(
    listener: TcpListener,
    ctx: SmtpContext,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let ctx = Arc::new(ctx);
    let ledger = ctx.ledger.clone();
    let grace = Some(limits.shutdown_grace);
    crate::accept::accept_until(
        listener,
        ledger,
        "smtp",
        shutdown,
        grace,
        move |stream, peer, stop| conn::serve(stream, peer, ctx.clone(), limits.clone(), stop),
    )
    .await
}
