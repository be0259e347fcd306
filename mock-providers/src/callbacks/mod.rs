//! The dispatcher that sends delivery reports to the stack: SMS status callbacks and e-mail
//! delivery events, on the seeded schedule of [`plan`], with retries when the stack answers 5xx or
//! times out. A try that could not connect at all (the stack's API down, restarting) is tried
//! again every 250 ms for up to [`RECEIVER_DOWN_PATIENCE`] without using up `max_retries`.
//!
//! Every try of every callback is a ledger entry (`EntryKind::Callback`) with how late it began
//! and how long the stack took to answer. The dispatcher counts the reports still due
//! ([`Dispatcher::pending`]) so the harness can wait for quiescence before it judges a run. It
//! must never block a provider's request path: scheduling only spawns tasks.
//!
//! The reports go out from a thread and runtime of their own. The fakes share the harness's
//! runtime with its status polls, ledger serialisation and checks; a report waiting behind those
//! would time out for the harness's sake and be blamed on the stack.
//!
//! At most [`MAX_IN_FLIGHT`] tries per provider are in flight at once, as a real webhook sender
//! bounds its connections to one endpoint: a report due while the stack is still answering
//! earlier ones waits for a slot (`callback_queued_ms`) instead of piling another connection onto
//! a stack that is already behind — which made thousands of tries time out at once and kept the
//! dispatcher's one thread too busy to start the next report on time.

pub mod plan;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;

use crate::config::{SmsConfig, SmtpConfig};
use crate::ledger::{CallbackVariant, EntryKind, Ledger, LedgerEntry, Outcome, Provider};
use crate::signing;
use plan::Planned;

/// Tries of one provider's reports in flight at once; the rest wait their turn in due order.
pub const MAX_IN_FLIGHT: usize = 32;

/// What the SMS fake knows about an accepted message that its status callbacks repeat.
#[derive(Clone, Debug)]
pub struct SmsReport {
    pub sid: String,
    pub to: String,
    /// The sender number: `From`, or the Messaging Service's number for a service send.
    pub from: String,
    pub messaging_service_sid: Option<String>,
    pub status_callback: String,
    pub attempt: u32,
}

/// A ready-to-send report: the body and headers are fixed when it is scheduled, so a duplicate or
/// a retry is byte-identical to its original.
struct Job {
    provider: Provider,
    recipient: String,
    attempt: u32,
    url: String,
    planned: Planned,
    content_type: &'static str,
    body: Vec<u8>,
    headers: Vec<(&'static str, String)>,
    retry_on_error: bool,
    max_retries: u32,
    timeout: Duration,
}

struct Inner {
    seed: u64,
    ledger: Ledger,
    client: reqwest::Client,
    pending: AtomicUsize,
    idle: Notify,
    /// Connection slots per provider ([`MAX_IN_FLIGHT`] each): SMS status callbacks, e-mail events.
    sms_slots: Semaphore,
    email_slots: Semaphore,
    /// Bumped by [`Dispatcher::cancel_all`]; every job watches it and drops out when it moves.
    epoch: watch::Sender<u64>,
    handle: Option<tokio::runtime::Handle>,
    /// Dropped with the dispatcher: the reports' own runtime then stops.
    _stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// A current-thread runtime on a thread of its own, running until the returned sender is
/// dropped. `None` when the thread or runtime cannot be created (the caller falls back to the
/// runtime it is on).
fn own_runtime() -> Option<(tokio::runtime::Handle, tokio::sync::oneshot::Sender<()>)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let handle = rt.handle().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("callbacks".into())
        .spawn(move || {
            rt.block_on(async {
                let _ = stopped.await;
            })
        })
        .ok()?;
    Some((handle, stop))
}

/// Schedules and sends delivery reports. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

/// Decrements the pending count when a job ends, however it ends.
struct PendingGuard(Arc<Inner>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Dispatcher {
    /// Creates a dispatcher with its own runtime thread for the reports (falling back to the
    /// runtime it is created in, if any, should that thread not start).
    pub fn new(seed: u64, ledger: Ledger) -> Dispatcher {
        let (handle, stop) = match own_runtime() {
            Some((h, s)) => (Some(h), Some(s)),
            None => (tokio::runtime::Handle::try_current().ok(), None),
        };
        let client = reqwest::Client::builder()
            .no_proxy()
            .pool_idle_timeout(Duration::from_secs(30))
            // A report goes to the URL the stack gave; a redirect is its answer, recorded as such.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("reqwest client without TLS always builds");
        Dispatcher {
            inner: Arc::new(Inner {
                seed,
                ledger,
                client,
                pending: AtomicUsize::new(0),
                idle: Notify::new(),
                sms_slots: Semaphore::new(MAX_IN_FLIGHT),
                email_slots: Semaphore::new(MAX_IN_FLIGHT),
                epoch: watch::Sender::new(0),
                handle,
                _stop: stop,
            }),
        }
    }

    /// Reports scheduled and not yet finished (including ones waiting for a retry).
    pub fn pending(&self) -> usize {
        self.inner.pending.load(Ordering::Acquire)
    }

    /// Resolves once no report is pending.
    pub async fn quiesced(&self) {
        loop {
            let notified = self.inner.idle.notified();
            if self.pending() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Drops every report still due (control API reset, shutdown).
    pub fn cancel_all(&self) {
        self.inner.epoch.send_modify(|e| *e += 1);
    }

    /// Schedules the status callbacks of an accepted SMS, if callbacks are on.
    pub fn sms_accepted(&self, cfg: &SmsConfig, msg: &SmsReport, plan: &plan::SmsPlan) {
        let cb = &cfg.callbacks;
        if !cb.enabled || msg.status_callback.is_empty() {
            return;
        }
        for p in &plan.reports {
            let mut params: Vec<(&str, String)> = vec![
                ("MessageSid", p.message_id.clone()),
                ("SmsSid", p.message_id.clone()),
                ("MessageStatus", p.status.to_string()),
                ("SmsStatus", p.status.to_string()),
                ("AccountSid", cfg.account_sid.clone()),
                ("To", msg.to.clone()),
                ("From", msg.from.clone()),
                ("ApiVersion", "2010-04-01".to_string()),
            ];
            if let Some(ms) = &msg.messaging_service_sid {
                params.push(("MessagingServiceSid", ms.clone()));
            }
            if let Some(code) = p.error_code {
                params.push(("ErrorCode", code.to_string()));
            }
            let mut headers = Vec::with_capacity(2);
            if let Some(key) = signing_key(p.variant, &cfg.auth_token) {
                let signature = signing::twilio_signature(&key, &msg.status_callback, &params);
                headers.push(("x-twilio-signature", signature));
            }
            headers.push(("i-twilio-idempotency-token", p.token.clone()));
            let body = serde_urlencoded::to_string(&params).expect("string pairs always encode");
            self.spawn(Job {
                provider: Provider::Sms,
                recipient: msg.to.clone(),
                attempt: msg.attempt,
                url: msg.status_callback.clone(),
                planned: p.clone(),
                content_type: "application/x-www-form-urlencoded",
                body: body.into_bytes(),
                headers,
                retry_on_error: cb.retry_on_error,
                max_retries: cb.max_retries,
                timeout: cb.timeout.0,
            });
        }
    }

    /// Schedules the delivery events of an accepted e-mail (one recipient of one message), if
    /// events are on. `entry` is the SMTP fake's accepted ledger entry: `message_id` is the
    /// Message-ID header, `recipient` the RCPT address, and `callback_url`, when set (from an
    /// `X-Events-Url` header), overrides `events.url`.
    pub fn email_accepted(&self, cfg: &SmtpConfig, entry: &LedgerEntry) {
        let ev = &cfg.events;
        let Some(url) = entry.callback_url.clone().or_else(|| ev.url.clone()) else {
            return;
        };
        if !ev.enabled || entry.outcome != Outcome::Accepted {
            return;
        }
        let message_id = entry.message_id.clone().unwrap_or_default();
        let accepted_wall = chrono::Utc::now();
        for p in plan::email(
            self.inner.seed,
            &entry.recipient,
            entry.attempt,
            &message_id,
            ev,
        ) {
            let stamp = accepted_wall
                + chrono::Duration::from_std(p.stamp).unwrap_or_else(|_| chrono::Duration::zero());
            let body = serde_json::json!({
                "id": p.token,
                "type": p.status,
                "message_id": p.message_id,
                "recipient": entry.recipient,
                "timestamp": stamp.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                "reason": p.reason,
            });
            let body = serde_json::to_vec(&body).expect("json value always serializes");
            let headers = signing_key(p.variant, &cfg.events_secret)
                .map(|key| ("x-ting-signature", signing::ting_signature(&key, &body)))
                .into_iter()
                .collect();
            self.spawn(Job {
                provider: Provider::Smtp,
                recipient: entry.recipient.clone(),
                attempt: entry.attempt,
                url: url.clone(),
                planned: p,
                content_type: "application/json",
                body,
                headers,
                retry_on_error: ev.retry_on_error,
                max_retries: ev.max_retries,
                timeout: ev.timeout.0,
            });
        }
    }

    fn spawn(&self, job: Job) {
        let Some(handle) = &self.inner.handle else {
            tracing::warn!("callback dropped: dispatcher created outside a tokio runtime");
            return;
        };
        self.inner.pending.fetch_add(1, Ordering::AcqRel);
        let guard = PendingGuard(self.inner.clone());
        let inner = self.inner.clone();
        let mut epoch = inner.epoch.subscribe();
        let due = Instant::now() + job.planned.at;
        // Boxed, like every big state of `deliver`: a flood keeps a hundred thousand reports
        // waiting at once, each a task that holds little more than its job.
        let job = Box::new(job);
        handle.spawn(async move {
            let _guard = guard;
            tokio::select! {
                _ = epoch.changed() => {}
                _ = deliver(&inner, job, due) => {}
            }
        });
    }
}

/// Sends one report at `due`, retrying on 5xx / timeout / connection errors, after a backoff or
/// the answer's `Retry-After` (whole seconds) when that is longer, as a webhook sender does.
async fn deliver(inner: &Inner, job: Box<Job>, due: Instant) {
    let tries = if job.retry_on_error {
        1 + job.max_retries
    } else {
        1
    };
    let mut due = due;
    let slots = match job.provider {
        Provider::Sms => &inner.sms_slots,
        _ => &inner.email_slots,
    };
    // Tries the receiver could not be reached for at all (refused) while it may be restarting;
    // they do not use up `max_retries` within RECEIVER_DOWN_PATIENCE of the first.
    let mut n = 0;
    let mut counted = 0;
    let first = Instant::now();
    loop {
        n += 1;
        counted += 1;
        Box::pin(tokio::time::sleep_until(due)).await;
        let awake = Instant::now();
        let late = awake.saturating_duration_since(due);
        let Ok(_slot) = Box::pin(slots.acquire()).await else {
            return;
        };
        let started = Instant::now();
        let queued = started.saturating_duration_since(awake);
        // Boxed: a report waiting for its turn holds only its job, not room for a request in
        // flight (a flood keeps a hundred thousand reports waiting at once).
        let Answer {
            code,
            err,
            retry_after,
            refused,
        } = Box::pin(send_once(&inner.client, &job)).await;
        let answered = Instant::now();
        let times = Times {
            late,
            queued,
            took: answered.duration_since(started),
        };
        record_try(&inner.ledger, &job, n, (code, err), times);
        let retryable = code.is_none_or(|c| c >= 500);
        if refused && job.retry_on_error && first.elapsed() < RECEIVER_DOWN_PATIENCE {
            // Nobody was listening (the stack's API restarting): not a try the stack failed.
            counted -= 1;
            due = answered + RECEIVER_DOWN_GAP;
            continue;
        }
        if !retryable || counted >= tries {
            return;
        }
        due = answered + backoff(counted).max(retry_after.unwrap_or_default());
    }
}

/// How late a try began, how long it waited for a slot, how long the answer took.
struct Times {
    late: Duration,
    queued: Duration,
    took: Duration,
}

/// Records try `n` of `job` and how it was answered. Apart from [`deliver`] so that a waiting
/// report's future keeps no room for the entry.
fn record_try(
    ledger: &Ledger,
    job: &Job,
    n: u32,
    (code, err): (Option<u16>, Option<String>),
    times: Times,
) {
    let mut d = LedgerEntry::draft(job.provider, EntryKind::Callback, job.recipient.clone());
    d.attempt = job.attempt;
    d.outcome = Outcome::Info;
    d.status = code
        .map(|c| c.to_string())
        .unwrap_or_else(|| "no answer".into());
    d.error = err;
    d.fault = (job.planned.variant != CallbackVariant::Genuine)
        .then(|| format!("callback {:?}", job.planned.variant).to_lowercase());
    d.idempotency_key = Some(job.planned.token.clone());
    d.message_id = Some(job.planned.message_id.clone());
    d.callback_status = Some(job.planned.status.to_string());
    d.callback_variant = Some(job.planned.variant);
    d.callback_url = Some(job.url.clone());
    d.callback_response = code;
    d.callback_try = Some(n);
    d.callback_late_ms = Some(times.late.as_millis() as u64);
    d.callback_queued_ms = Some(times.queued.as_millis() as u64);
    d.callback_took_ms = Some(times.took.as_millis() as u64);
    ledger.record(d);
}

/// What one try of a report came to.
struct Answer {
    code: Option<u16>,
    err: Option<String>,
    retry_after: Option<Duration>,
    /// Nobody was listening: the connection was refused.
    refused: bool,
}

/// One try of `job`: the request, and the answer's status and `Retry-After`.
async fn send_once(client: &reqwest::Client, job: &Job) -> Answer {
    let result = client
        .post(&job.url)
        .timeout(job.timeout)
        .header("content-type", job.content_type)
        .header("user-agent", "ting-chaos-mock-providers")
        .headers(
            job.headers
                .iter()
                .filter_map(|(k, v)| {
                    Some((reqwest::header::HeaderName::from_static(k), v.parse().ok()?))
                })
                .collect(),
        )
        .body(job.body.clone())
        .send()
        .await;
    let answer = |code, err, retry_after, refused| Answer {
        code,
        err,
        retry_after,
        refused,
    };
    match result {
        Ok(resp) => {
            let code = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
                .map(|s| Duration::from_secs(s.min(60)));
            drain(resp).await;
            answer(Some(code), None, retry_after, false)
        }
        Err(e) if e.is_timeout() => answer(None, Some("timeout".to_string()), None, false),
        Err(e) => answer(
            None,
            Some(format!("connection error: {e}")),
            None,
            e.is_connect(),
        ),
    }
}

/// Of a receiver's answer body, the bytes read: an answer is a status code, and a stack that
/// answers megabytes must not fill the fakes' memory (32 reports in flight per provider).
pub const ANSWER_DRAIN: usize = 64 * 1024;

/// Reads the answer body so a small one lets the connection go back to the pool; past
/// [`ANSWER_DRAIN`] bytes it stops, and the connection is closed instead.
async fn drain(mut resp: reqwest::Response) {
    let mut read = 0;
    while read <= ANSWER_DRAIN {
        match resp.chunk().await {
            Ok(Some(chunk)) => read += chunk.len(),
            Ok(None) | Err(_) => return,
        }
    }
}

/// How long a report whose receiver refuses connections (its API process restarting) keeps
/// being tried without using up its retries: the load's own patience with the API
/// (`RETRY_FOR` in the harness) — a webhook sender retries for hours.
pub const RECEIVER_DOWN_PATIENCE: Duration = Duration::from_secs(30);

/// The gap between tries to a receiver that refused the connection.
const RECEIVER_DOWN_GAP: Duration = Duration::from_millis(250);

/// Gap before retry `n + 1`: 100 ms doubling, at most 5 s.
fn backoff(n: u32) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << n.min(6).saturating_sub(1)))
        .min(Duration::from_secs(5))
}

/// The key a report is signed with: the provider's own, a wrong one
/// ([`CallbackVariant::ForgedSignature`]), or none, so no signature header at all
/// ([`CallbackVariant::Unsigned`]).
fn signing_key(variant: CallbackVariant, key: &str) -> Option<String> {
    match variant {
        CallbackVariant::Unsigned => None,
        CallbackVariant::ForgedSignature => Some(format!("{key}-forged")),
        _ => Some(key.to_string()),
    }
}

#[cfg(test)]
mod waiting_size {
    use super::*;

    /// A report waiting for its turn is a task holding `deliver`'s future: a flood keeps a
    /// hundred thousand of them at once, so its big states (the job, the request in flight, the
    /// ledger entry) live behind pointers.
    #[test]
    fn a_waiting_report_holds_little_more_than_a_pointer_to_its_job() {
        let d = Dispatcher::new(1, Ledger::new());
        let planned = plan::email(1, "a@b.test", 1, "m", &Default::default())
            .into_iter()
            .next()
            .expect("an accepted e-mail has a delivery event");
        let job = Box::new(Job {
            provider: Provider::Smtp,
            recipient: "a@b.test".into(),
            attempt: 1,
            url: "http://127.0.0.1:1/".into(),
            planned,
            content_type: "application/json",
            body: Vec::new(),
            headers: Vec::new(),
            retry_on_error: false,
            max_retries: 0,
            timeout: Duration::from_secs(1),
        });
        let waiting = deliver(&d.inner, job, Instant::now());
        let size = std::mem::size_of_val(&waiting);
        assert!(size <= 320, "deliver's future grew to {size} bytes");
    }
}
