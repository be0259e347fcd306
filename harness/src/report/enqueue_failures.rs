//! What the load's enqueue requests failed with: every failed attempt of a `POST /v1/batches`
//! (answered 5xx or 429, or not answered), and the batches the stack never accepted within the
//! harness's retry window. `responsiveness` judges them (`enqueue_failed`,
//! `enqueue_not_accepted`); the run drops a never-accepted batch's deliveries from what it
//! expects, so `no_loss` does not call them lost. Only data here: no judging.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The load's failed enqueue requests and the batches that were never accepted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EnqueueFailures {
    /// Every failed attempt, in the order it was sent.
    #[serde(default)]
    pub attempts: Vec<FailedEnqueue>,
    /// Batches no attempt got accepted (202/200) within the retry window.
    #[serde(default)]
    pub not_accepted: Vec<NotAccepted>,
}

impl EnqueueFailures {
    /// Adds `other`'s (the trickle's), keeping both lists in the order they were sent.
    pub fn merge(&mut self, other: EnqueueFailures) {
        self.attempts.extend(other.attempts);
        self.attempts.sort_by_key(|a| a.sent_ns);
        self.not_accepted.extend(other.not_accepted);
        self.not_accepted.sort_by_key(|b| b.first_sent_ns);
    }

    /// Whether `batch_id` was never accepted.
    pub fn never_accepted(&self, batch_id: &str) -> bool {
        self.not_accepted.iter().any(|b| b.batch_id == batch_id)
    }
}

/// One `POST /v1/batches` attempt that was not accepted, on the ledger clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FailedEnqueue {
    pub batch_id: String,
    /// When the attempt was sent.
    pub sent_ns: u64,
    /// When its answer (or the error) came.
    pub done_ns: u64,
    /// The HTTP status; `None` when no answer came (`error` says why).
    pub status: Option<u16>,
    /// The answer's `Retry-After` (whole seconds, as sent), when it had one.
    pub retry_after_s: Option<u64>,
    /// The transport error, or the start of the answer's body.
    pub error: String,
    /// One of the trickle's orders (`[load] trickle`), not one of the batches.
    #[serde(default)]
    pub trickle: bool,
}

impl FailedEnqueue {
    /// The stack shed load the way the contract allows: `503` or `429` with a `Retry-After`.
    pub fn shed(&self) -> bool {
        matches!(self.status, Some(503 | 429)) && self.retry_after_s.is_some()
    }
}

/// A batch the stack never accepted: the harness gave up on it after its retry window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NotAccepted {
    pub batch_id: String,
    /// When its first attempt was sent (ledger clock).
    pub first_sent_ns: u64,
    /// When the harness gave up.
    pub gave_up_ns: u64,
    /// Attempts made.
    pub attempts: u32,
    /// Deliveries it held (recipients × channels): not expected by the other checkers.
    pub deliveries: u64,
    /// What the last attempt got.
    pub last_error: String,
    #[serde(default)]
    pub trickle: bool,
}
