//! A batch's enqueue as a real client makes it: a `POST /v1/batches` answered 5xx or 429, or not
//! at all, is sent again with the same `batch_id` (the contract makes that safe) after a growing
//! backoff, or after the answer's `Retry-After` when that is longer, until the stack accepts it
//! or [`super::RETRY_FOR`] has passed. Every failed attempt is recorded; a batch still not
//! accepted is recorded as such and the run goes on, because that is a verdict about the stack
//! (`responsiveness`), not a failure of the harness. Any other answer than 202 or 200 (a 4xx,
//! a 201, a redirect) is final: the stack refused a batch the contract says it must take, which
//! is recorded the same way, after that one attempt. Never sleeps past the window.

use std::time::{Duration, Instant};

use super::{Answer, Poster};
use crate::report::{EnqueueFailures, FailedEnqueue, NotAccepted};

/// The first backoff gap; it doubles per failed attempt up to [`MAX_GAP`].
const FIRST_GAP: Duration = Duration::from_millis(200);
const MAX_GAP: Duration = Duration::from_secs(2);

/// The batch an enqueue is for: what its failure records name.
#[derive(Clone)]
pub(super) struct Who {
    pub batch_id: String,
    pub trickle: bool,
    /// Deliveries the batch holds.
    pub deliveries: u64,
}

impl Who {
    /// The batch given up on after `attempts`, `last_error` saying why.
    fn not_accepted(
        &self,
        first_ns: u64,
        done_ns: u64,
        attempts: u32,
        last_error: String,
    ) -> NotAccepted {
        NotAccepted {
            batch_id: self.batch_id.clone(),
            first_sent_ns: first_ns,
            gave_up_ns: done_ns,
            attempts,
            deliveries: self.deliveries,
            last_error,
            trickle: self.trickle,
        }
    }

    pub fn failed(
        &self,
        sent_ns: u64,
        done_ns: u64,
        status: Option<u16>,
        retry_after_s: Option<u64>,
        error: String,
    ) -> FailedEnqueue {
        FailedEnqueue {
            batch_id: self.batch_id.clone(),
            sent_ns,
            done_ns,
            status,
            retry_after_s,
            error,
            trickle: self.trickle,
        }
    }
}

/// What a retried enqueue came to: the accepted answer (latency and send time from the first
/// attempt), or none; and every failed attempt, with the batch in `not_accepted` when none was
/// accepted.
pub(super) struct Tried {
    pub accepted: Option<Answer>,
    pub failures: EnqueueFailures,
}

impl Tried {
    /// When the first attempt was sent.
    pub fn first_sent_ns(&self) -> u64 {
        match (&self.accepted, self.failures.attempts.first()) {
            (Some(a), _) => a.sent_ns,
            (None, Some(f)) => f.sent_ns,
            (None, None) => 0,
        }
    }

    /// Why the batch was not accepted (empty when it was).
    pub fn last_error(&self) -> String {
        self.failures
            .not_accepted
            .last()
            .map(|b| b.last_error.clone())
            .unwrap_or_default()
    }
}

/// A status a client retries: the stack is failing or shedding load, and may take the batch later.
fn retryable(status: u16) -> bool {
    status >= 500 || status == 429
}

/// `Retry-After` as whole seconds (the form the contract asks for); an HTTP date or anything else
/// is ignored, and the attempt then counts as a failure, not as load shed.
pub(super) fn retry_after_s(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// How long to wait after a failed attempt: the backoff, or the `Retry-After` when longer.
fn wait(gap: Duration, retry_after_s: Option<u64>) -> Duration {
    gap.max(Duration::from_secs(retry_after_s.unwrap_or(0)))
}

impl Poster {
    /// [`Poster::post`] until the answer is 202 or 200, as a client does (see the module doc).
    pub(super) async fn answered(&self, who: &Who, body: Vec<u8>) -> Tried {
        let first = Instant::now();
        let first_ns = (self.now_ns)();
        let mut failures = EnqueueFailures::default();
        let mut gap = FIRST_GAP;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let sent_ns = (self.now_ns)();
            let (status, retry_after, why) = match self.post(&who.batch_id, body.clone()).await {
                Ok(a) if a.accepted() => {
                    let accepted = Answer {
                        latency_us: first.elapsed().as_micros() as u64,
                        sent_ns: first_ns,
                        ..a
                    };
                    return Tried {
                        accepted: Some(accepted),
                        failures,
                    };
                }
                Ok(a) => {
                    let why = format!(
                        "HTTP {}: {}",
                        a.status,
                        a.body.chars().take(500).collect::<String>()
                    );
                    (Some(a.status), a.retry_after_s, why)
                }
                Err(e) => (None, None, e),
            };
            let done_ns = (self.now_ns)();
            failures
                .attempts
                .push(who.failed(sent_ns, done_ns, status, retry_after, why.clone()));
            if let Some(refused) = status.filter(|s| !retryable(*s)) {
                tracing::warn!(
                    "enqueue of batch {}: {why}; refused, not retried",
                    who.batch_id
                );
                let last_error = format!(
                    "{why} (refused: only 202 or 200 accepts a batch, and a {refused} is final)"
                );
                let gone = who.not_accepted(first_ns, done_ns, attempts, last_error);
                failures.not_accepted.push(gone);
                return Tried {
                    accepted: None,
                    failures,
                };
            }
            let pause = wait(gap, retry_after);
            if first.elapsed() + pause > self.retry_for {
                tracing::warn!("enqueue of batch {}: {why}; giving up", who.batch_id);
                let last_error = format!(
                    "{why} (not accepted after {attempts} attempts in {:.1}s)",
                    first.elapsed().as_secs_f64()
                );
                let gone = who.not_accepted(first_ns, done_ns, attempts, last_error);
                failures.not_accepted.push(gone);
                return Tried {
                    accepted: None,
                    failures,
                };
            }
            tracing::warn!(
                "enqueue of batch {}: {why}; retrying in {} ms",
                who.batch_id,
                pause.as_millis()
            );
            tokio::time::sleep(pause).await;
            gap = (gap * 2).min(MAX_GAP);
        }
    }
}

#[cfg(test)]
#[path = "retry_tests.rs"]
mod tests;
