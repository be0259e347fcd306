//! A provider-wide outage: while a profile's `outage` is set (by the harness's `provider_outage`
//! chaos step, or `PUT /_mock/faults {"outage": {"mode": "hang"}}`), every well-formed send
//! request is answered 503 (`unavailable`) or read and never answered (`hang`). The SMTP fake
//! decides at each RCPT (the first moment it knows the recipient): `421 4.3.2` and the connection
//! closed, or the RCPT never answered.
//!
//! An outage is the one fault besides the rate limit that is timing-based, by nature: it lasts
//! while it is set, whatever the seed. Every request it touches is recorded like any other
//! attempt (attempt number, arrival time), with `fault` `outage_503` or `outage_hang`, so the
//! checkers know what the fake did.
//!
//! A held (`hang`) request stays unanswered even after the outage ends, as a black-holed
//! connection does: only its sender can end it, by hanging up (its own timeout), and then the
//! entry is recorded with `client_hung_up`. A stack without a read timeout waits for ever. Must
//! never block a thread: the hold is an async wait on the request's own task.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a provider in an outage treats a send.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OutageMode {
    /// Answer `503 Service Unavailable` at once.
    Unavailable,
    /// Read the request and never answer; the connection stays open until the sender closes it.
    Hang,
}

/// `outage` in a provider's profile.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Outage {
    pub mode: OutageMode,
}

impl OutageMode {
    /// The ledger's `fault` label for an HTTP send (LINE, SMS) this outage answered.
    pub fn label(self) -> &'static str {
        self.label_for(crate::ledger::Provider::Line)
    }

    /// The ledger's `fault` label for a send to `provider` this outage answered: an HTTP
    /// provider's `unavailable` answers 503, the SMTP fake's answers the RCPT `421` and closes.
    pub fn label_for(self, provider: crate::ledger::Provider) -> &'static str {
        match (self, provider) {
            (OutageMode::Unavailable, crate::ledger::Provider::Smtp) => "outage_421",
            (OutageMode::Unavailable, _) => "outage_503",
            (OutageMode::Hang, _) => "outage_hang",
        }
    }

    /// The mode whose label (for any provider) is `fault`, if any.
    pub fn of_label(fault: &str) -> Option<OutageMode> {
        use crate::ledger::Provider::*;
        [OutageMode::Unavailable, OutageMode::Hang]
            .into_iter()
            .find(|m| [Line, Smtp, Sms].iter().any(|p| m.label_for(*p) == fault))
    }
}

/// How often a held request looks whether its sender hung up.
const HANG_POLL: Duration = Duration::from_millis(20);

/// The longest a held request waits for its sender to hang up before it is answered 503 anyway,
/// so a fake never keeps a task for ever (a stack without timeouts has long failed by then).
pub const MAX_HOLD: Duration = Duration::from_secs(600);

/// What the fake does for a send during `outage`: at once for `unavailable`; for `hang`, holds
/// the request until its sender hangs up. Returns the ledger's `status` (`503`, or `no_answer`
/// when the sender hung up first) and whether the sender hung up.
pub(crate) async fn answer(
    hub: &crate::hub::Hub,
    provider: crate::ledger::Provider,
    outage: Outage,
) -> (String, bool) {
    hub.outage_hit(provider);
    let hung_up = match outage.mode {
        OutageMode::Unavailable => crate::http::client_gone(),
        OutageMode::Hang => {
            let _held = hub.ledger.holding();
            hold_until_hung_up().await
        }
    };
    let status = if hung_up { NO_ANSWER } else { "503" };
    (status.to_string(), hung_up)
}

/// The ledger's `status` of a held request whose sender hung up before any answer.
pub const NO_ANSWER: &str = "no_answer";

/// Holds the request this task serves until its sender hangs up (or [`MAX_HOLD`]). Returns
/// whether the sender hung up. Only meaningful inside [`crate::http::detached`] with
/// `inline = false`, where the hang-up is seen.
pub(crate) async fn hold_until_hung_up() -> bool {
    let until = tokio::time::Instant::now() + MAX_HOLD;
    while tokio::time::Instant::now() < until {
        if crate::http::client_gone() {
            return true;
        }
        tokio::time::sleep(HANG_POLL).await;
    }
    crate::http::client_gone()
}
