//! The load: recipients split into batches and enqueued through the stack's API, each request's
//! latency measured; beside the batches, the trickle's small orders ([`trickle`]).

pub mod recipients;
mod repeat;
mod retry;
mod status_page;
mod stream_json;
mod trickle;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

pub use status_page::{fetch_batch_status, StatusAnswer, StatusPage};

use crate::report::EnqueueFailures;
use crate::scenario::{Pacing, Scenario};
pub use recipients::Recipient;
pub use repeat::RepeatMode;
pub use trickle::{order_id, Order, TrickleRun};

/// The batches of a run: their ids and which recipients each holds.
pub struct Plan {
    pub batches: Vec<(String, std::ops::Range<usize>)>,
}

impl Plan {
    pub fn new(scenario: &Scenario, n: usize) -> Plan {
        let count = scenario.load.pacing.batch_count().max(1) as usize;
        let per = n.div_ceil(count);
        let batches = (0..count)
            .map(|k| {
                let start = (k * per).min(n);
                let end = ((k + 1) * per).min(n);
                (
                    format!("{}-{}-b{}", scenario.name, scenario.seed, k + 1),
                    start..end,
                )
            })
            .filter(|(_, r)| !r.is_empty())
            .collect();
        Plan { batches }
    }

    /// The batch recipient `index` is enqueued in, and whether that batch carries the edited
    /// template.
    pub fn batch_of(&self, scenario: &Scenario, index: usize) -> (String, bool) {
        self.batches
            .iter()
            .enumerate()
            .find(|(_, (_, r))| r.contains(&index))
            .map(|(k, (id, _))| (id.clone(), scenario.load.template_edited(k)))
            .unwrap_or_default()
    }
}

/// An enqueue the harness could not carry out (one of its own tasks failed): the harness's own
/// failure. A batch the stack refused or kept failing (a 4xx, 5xx, 429, no answer) is not one: it
/// is recorded in [`Enqueued::failures`] and judged.
#[derive(Debug, thiserror::Error)]
#[error("enqueue of batch {batch_id} failed: {detail}")]
pub struct EnqueueError {
    pub batch_id: String,
    pub detail: String,
}

/// What the load recorded: every enqueue request's latency, when each batch was posted, and
/// what the stack answered to the repeated ones.
pub struct Enqueued {
    /// Enqueue request latencies (µs).
    pub latency_us: hdrhistogram::Histogram<u64>,
    /// Every batch's request in order, its times read from `now_ns` (the run's ledger clock).
    pub batches: Vec<crate::report::BatchEnqueue>,
    /// The batches POSTed again, in the order their repeats were answered.
    pub repeats: Vec<crate::report::RepeatRecord>,
    /// Every failed attempt, and the batches never accepted.
    pub failures: EnqueueFailures,
}

impl Enqueued {
    pub fn new() -> Enqueued {
        Enqueued {
            latency_us: hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)
                .expect("histogram bounds"),
            batches: Vec::new(),
            repeats: Vec::new(),
            failures: EnqueueFailures::default(),
        }
    }

    /// Records one answered enqueue of a batch; `trickle`: it was one of the trickle's orders.
    fn record(&mut self, sent: Answer, trickle: bool) {
        let _ = self.latency_us.record(sent.latency_us.max(1));
        self.batches.push(crate::report::BatchEnqueue {
            batch_id: sent.batch_id,
            sent_ns: sent.sent_ns,
            acked_ns: sent.acked_ns,
            trickle,
            latency_us: sent.latency_us.max(1),
        });
    }

    /// Records what a batch's start and its repeat (awaited here) gave.
    async fn record_started(
        &mut self,
        started: Started,
        trickle: bool,
    ) -> Result<(), EnqueueError> {
        if let Some(sent) = started.answered {
            self.record(sent, trickle);
        }
        self.failures.merge(started.failures);
        if let Some(repeat) = started.repeat {
            let done = repeat.await.map_err(|e| EnqueueError {
                batch_id: "repeat".into(),
                detail: format!("repeat task failed: {e}"),
            })?;
            self.failures.merge(done.failures);
            if let Some(sent) = done.answered {
                // The repeat was accepted after all: the batch is in.
                let id = &sent.batch_id;
                self.failures.not_accepted.retain(|b| &b.batch_id != id);
                self.record(sent, trickle);
            }
            self.repeats.push(done.record);
        }
        Ok(())
    }

    /// Adds `other`'s requests (the trickle's) to these, all in the order they were sent.
    pub fn merge(&mut self, other: Enqueued) {
        let _ = self.latency_us.add(&other.latency_us);
        self.batches.extend(other.batches);
        self.batches.sort_by_key(|b| b.sent_ns);
        self.repeats.extend(other.repeats);
        self.repeats.sort_by_key(|r| r.sent_ns);
        self.failures.merge(other.failures);
    }
}

impl Default for Enqueued {
    fn default() -> Self {
        Enqueued::new()
    }
}

/// How long an enqueue answered 5xx or 429, or not at all, is retried before the batch counts as
/// never accepted (the contract's promise to a client: docs/stack-contract.md).
pub const RETRY_FOR: Duration = Duration::from_secs(30);

/// How long one enqueue request may take, from connecting to the last byte of its answer.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The run's clock (the ledger's), read by the load's tasks.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Sends the load's requests: one client, the scenario, the API, the clock.
#[derive(Clone)]
pub struct Poster {
    client: reqwest::Client,
    scenario: Arc<Scenario>,
    api_base: Arc<str>,
    now_ns: Clock,
    /// [`RETRY_FOR`], shorter in tests.
    retry_for: Duration,
    /// Told the moment the API answers a batch 2xx (a chaos step on the API aims right after).
    on_accepted: Option<Arc<tokio::sync::Notify>>,
}

/// An answered `POST /v1/batches`.
struct Answer {
    batch_id: String,
    status: u16,
    /// `deliveries` of the answer body.
    deliveries: Option<u64>,
    body: String,
    latency_us: u64,
    sent_ns: u64,
    acked_ns: u64,
    /// The answer's `Retry-After` in whole seconds, when it had one that parses.
    retry_after_s: Option<u64>,
}

impl Answer {
    fn accepted(&self) -> bool {
        self.status == 202 || self.status == 200
    }
}

/// A batch whose first request is done: its answer (none when the harness dropped it) and its
/// repeat, still under way.
struct Started {
    answered: Option<Answer>,
    repeat: Option<tokio::task::JoinHandle<Repeated>>,
    /// Its failed attempts, and the batch itself when no attempt was accepted.
    failures: EnqueueFailures,
}

/// A finished repeat: the record, and for `lost_answer` the retry's answer, which is the batch's
/// enqueue.
struct Repeated {
    answered: Option<Answer>,
    record: crate::report::RepeatRecord,
    /// For `lost_answer` (whose repeat retries like any enqueue): its failed attempts.
    failures: EnqueueFailures,
}

impl Poster {
    pub fn new(scenario: &Scenario, api_base: &str, now_ns: Clock) -> Poster {
        Poster {
            client: reqwest::Client::builder()
                .timeout(REQUEST_TIMEOUT)
                // A redirect is an answer, not an invitation to POST the batch elsewhere.
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("http client"),
            scenario: Arc::new(scenario.clone()),
            api_base: api_base.into(),
            now_ns,
            retry_for: RETRY_FOR,
            on_accepted: None,
        }
    }

    /// Notifies `n`'s waiters each time the API answers a batch 2xx, as soon as the status is
    /// read.
    pub fn on_accepted(mut self, n: Arc<tokio::sync::Notify>) -> Poster {
        self.on_accepted = Some(n);
        self
    }

    /// The POST body of a batch; `edited`: with the edited template (`[load] template_edit`).
    fn body(&self, batch_id: &str, recipients: &[Recipient], edited: bool) -> Vec<u8> {
        let t = self.scenario.load.template_of(edited);
        let channels: Vec<&str> = self
            .scenario
            .load
            .channels
            .iter()
            .map(|c| c.as_str())
            .collect();
        serde_json::to_vec(&json!({
            "batch_id": batch_id,
            "template": {"id": t.id, "version": t.version, "subject": t.subject, "text": t.text,
                          "html": t.html, "line": t.line, "sms": t.sms},
            "channels": channels,
            "recipients": recipients,
        }))
        .expect("batch serializes")
    }

    /// POSTs `body` and measures it; `Err` when no answer came.
    async fn post(&self, batch_id: &str, body: Vec<u8>) -> Result<Answer, String> {
        let sent = Instant::now();
        let sent_ns = (self.now_ns)();
        let resp = self
            .client
            .post(format!("{}/v1/batches", self.api_base))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("request error: {e}"))?;
        let status = resp.status().as_u16();
        if let (true, Some(n)) = ((200..300).contains(&status), &self.on_accepted) {
            n.notify_waiters();
        }
        let retry_after_s = retry::retry_after_s(resp.headers());
        let body = read_capped(resp, ANSWER_CAP).await;
        let latency_us = sent.elapsed().as_micros() as u64;
        let deliveries = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["deliveries"].as_u64());
        Ok(Answer {
            batch_id: batch_id.to_string(),
            status,
            deliveries,
            body,
            latency_us,
            sent_ns,
            acked_ns: (self.now_ns)(),
            retry_after_s,
        })
    }

    /// Sends a batch's first request (retried as [`Poster::answered`] says) and starts its repeat
    /// when the seed plans one. `sequence` and `k`: the batch is the `k`-th of the batches or of
    /// the trickle's orders.
    async fn start(
        &self,
        (sequence, k): (&str, usize),
        batch_id: &str,
        recipients: &[Recipient],
    ) -> Started {
        let edited = sequence == "batches" && self.scenario.load.template_edited(k);
        let body = self.body(batch_id, recipients, edited);
        let plan = repeat::plan(&self.scenario, sequence, k, batch_id);
        let expected_deliveries = (recipients.len() * self.scenario.load.channels.len()) as u64;
        let who = retry::Who {
            batch_id: batch_id.to_string(),
            trickle: sequence == "trickle",
            deliveries: expected_deliveries,
        };
        let first_at = Instant::now();
        let Some(plan) = plan else {
            let tried = self.answered(&who, body).await;
            return Started {
                answered: tried.accepted,
                repeat: None,
                failures: tried.failures,
            };
        };
        let record =
            |original: Option<&Answer>, original_sent_ns: u64| crate::report::RepeatRecord {
                batch_id: batch_id.to_string(),
                mode: plan.mode,
                expected_deliveries,
                original_sent_ns,
                original_acked_ns: original.map(|a| a.acked_ns),
                original_status: original.map(|a| a.status),
                sent_ns: 0,
                acked_ns: None,
                status: None,
                deliveries: None,
                error: None,
            };
        match plan.mode {
            RepeatMode::Concurrent => {
                // The repeat leaves on its own clock, whether or not the original was answered.
                let again = self.spawn_post(&who, body.clone(), first_at + plan.after, false);
                let tried = self.answered(&who, body).await;
                let (rec, repeat_is_enqueue) = match &tried.accepted {
                    Some(original) => (record(Some(original), original.sent_ns), false),
                    // Never accepted: an accepted repeat is the batch's enqueue.
                    None => (record(None, tried.first_sent_ns()), true),
                };
                Started {
                    answered: tried.accepted,
                    repeat: Some(finish(again, rec, repeat_is_enqueue)),
                    failures: tried.failures,
                }
            }
            RepeatMode::AfterAnswer => {
                let tried = self.answered(&who, body.clone()).await;
                // Nothing to repeat after an answer that never came.
                let repeat = tried.accepted.as_ref().map(|original| {
                    let again = self.spawn_post(&who, body, Instant::now() + plan.after, false);
                    finish(again, record(Some(original), original.sent_ns), false)
                });
                Started {
                    answered: tried.accepted,
                    repeat,
                    failures: tried.failures,
                }
            }
            RepeatMode::LostAnswer => {
                let sent_ns = (self.now_ns)();
                let mut failures = EnqueueFailures::default();
                if let Err(e) = repeat::post_and_hang_up(
                    &self.api_base,
                    &body,
                    plan.hang_up_after,
                    REQUEST_TIMEOUT,
                )
                .await
                {
                    // The request never reached the stack: a failed attempt like any other; the
                    // retry below is the batch's enqueue either way.
                    failures.attempts.push(who.failed(
                        sent_ns,
                        (self.now_ns)(),
                        None,
                        None,
                        format!("request error: {e}"),
                    ));
                }
                let again = self.spawn_post(&who, body, Instant::now() + plan.after, true);
                Started {
                    answered: None,
                    repeat: Some(finish(again, record(None, sent_ns), true)),
                    failures,
                }
            }
        }
    }

    /// Sends `body` again at `at`: once (`retrying` false: a repeat the stack must answer), or
    /// as the batch's enqueue, retried like the first ([`Poster::answered`]).
    fn spawn_post(
        &self,
        who: &retry::Who,
        body: Vec<u8>,
        at: Instant,
        retrying: bool,
    ) -> tokio::task::JoinHandle<Posted> {
        let (me, who) = (self.clone(), who.clone());
        tokio::spawn(async move {
            repeat::until(at).await;
            let sent_ns = (me.now_ns)();
            if !retrying {
                let answer = me.post(&who.batch_id, body).await;
                return (sent_ns, answer, EnqueueFailures::default());
            }
            let tried = me.answered(&who, body).await;
            let last = tried.last_error();
            (sent_ns, tried.accepted.ok_or(last), tried.failures)
        })
    }
}

/// Of an enqueue answer's body, the bytes read: an answer is `{"batch_id", "deliveries"}` or an
/// error, and a stack that answers megabytes (or a body that never ends) must not fill the
/// harness's memory.
const ANSWER_CAP: usize = 64 * 1024;

/// The first `cap` bytes of `resp`'s body as text (lossy), and no more: the rest is left unread
/// (the connection is dropped), and a body cut off by an error or the timeout is what arrived.
async fn read_capped(mut resp: reqwest::Response, cap: usize) -> String {
    let mut body = Vec::new();
    while body.len() < cap {
        match resp.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk[..chunk.len().min(cap - body.len())]),
            Ok(None) | Err(_) => break,
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// A repeat's send time, its answer (or why none), and its failed attempts when it retried.
type Posted = (u64, Result<Answer, String>, EnqueueFailures);

/// Completes a repeat's record with its answer. `repeat_is_enqueue`: the repeat is the batch's
/// enqueue (its send time the original's): the original's answer was dropped (`lost_answer`) or
/// never came.
fn finish(
    again: tokio::task::JoinHandle<Posted>,
    mut rec: crate::report::RepeatRecord,
    repeat_is_enqueue: bool,
) -> tokio::task::JoinHandle<Repeated> {
    tokio::spawn(async move {
        let (sent_ns, answer, failures) = match again.await {
            Ok(r) => r,
            Err(e) => (
                0,
                Err(format!("repeat task failed: {e}")),
                EnqueueFailures::default(),
            ),
        };
        rec.sent_ns = sent_ns;
        let answered = match answer {
            Ok(a) => {
                rec.acked_ns = Some(a.acked_ns);
                rec.status = Some(a.status);
                rec.deliveries = a.deliveries;
                let sent_ns = rec.original_sent_ns;
                (repeat_is_enqueue && a.accepted()).then_some(Answer { sent_ns, ..a })
            }
            Err(e) => {
                rec.error = Some(e);
                None
            }
        };
        Repeated {
            answered,
            record: rec,
            failures,
        }
    })
}

/// Enqueues every batch with the scenario's pacing; returns enqueue latencies, when each batch's
/// request was sent and answered, and the answers to the repeated ones.
pub async fn enqueue(
    poster: &Poster,
    recipients: &[Recipient],
    plan: &Plan,
) -> Result<Enqueued, EnqueueError> {
    let mut out = Enqueued::new();
    let gap = match poster.scenario.load.pacing {
        Pacing::Batches(_) => Duration::ZERO,
        Pacing::Rate { per_second, .. } => Duration::from_secs_f64(1.0 / per_second),
    };
    let start = Instant::now();
    let mut repeats = Vec::new();
    for (k, (batch_id, range)) in plan.batches.iter().enumerate() {
        // Paced from the intended start, so a slow enqueue does not hide behind the schedule.
        let due = start + gap * k as u32;
        tokio::time::sleep_until(due.into()).await;
        let mut started = poster
            .start(("batches", k), batch_id, &recipients[range.clone()])
            .await;
        // A repeat never holds up the next batch.
        repeats.push(started.repeat.take());
        out.record_started(started, false).await?;
    }
    for repeat in repeats.into_iter().flatten() {
        let only_repeat = Started {
            answered: None,
            repeat: Some(repeat),
            failures: EnqueueFailures::default(),
        };
        out.record_started(only_repeat, false).await?;
    }
    out.batches.sort_by_key(|b| b.sent_ns);
    Ok(out)
}
