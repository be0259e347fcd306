//! The dispatcher that sends delivery reports to the stack: SMS status callbacks and e-mail
//! delivery events, on the seeded schedule of [`plan`], with retries when the stack answers 5xx or
//! times out. A try that could not connect at all (the stack's API down, restarting) is tried
//! again every 250 ms for up to [`RECEIVER_DOWN_PATIENCE`] without using up `max_retries`.
//!
//! Every try of every callback is a ledger entry (`EntryKind::Callback`) with how late it began
//! and how long the stack took to answer. The dispatcher counts the reports still due
//! ([`Dispatcher::pending`]) so the harness can wait for quiescence before it judges a run. It
//! must never block a provider's request path: scheduling only pushes onto a queue under a
//! short lock.
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
//!
//! A report waiting is a small job in its provider's [`queue`] (a heap keyed by due time, then a
//! line in chunks of those due), not a task: one driver task per provider begins each try when
//! it falls due and a slot is free, so a flood of a hundred thousand reports due at once costs
//! 80 bytes each (8 MB), not a task each. A report is rendered ([`report`]) when a try begins.

mod fifo;
pub mod plan;
mod queue;
mod report;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::{SmsConfig, SmtpConfig};
use crate::ledger::{CallbackVariant, EntryKind, Ledger, LedgerEntry, Outcome, Provider};
use crate::sms::store::Stored;
use queue::{Job, Lane, Pending, Start};
use report::{Form, Message, Policy, Report};

/// Tries of one provider's reports in flight at once; the rest wait their turn in due order.
pub const MAX_IN_FLIGHT: usize = 32;

/// What the reports' driver and tries share with the dispatcher.
struct Core {
    ledger: Ledger,
    client: reqwest::Client,
    pending: Arc<Pending>,
    /// One queue per provider: SMS status callbacks, e-mail events.
    sms: Lane,
    email: Lane,
    /// Bumped by [`Dispatcher::cancel_all`]: a job of an earlier epoch never begins, and a try
    /// in flight drops out when it moves.
    epoch: watch::Sender<u64>,
    /// The latest time a report was scheduled to be first tried (retries not included: they
    /// follow the stack's answers, not the plan), and the longest delay any was planned at.
    plan: Mutex<Option<ReportPlan>>,
}

/// When the fakes' planned delivery reports fall due ([`Dispatcher::report_plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportPlan {
    /// The latest first try planned so far.
    pub last_due: std::time::Instant,
    /// The longest delay, from its message, any report was planned at.
    pub longest: Duration,
}

impl Core {
    fn lane(&self, provider: Provider) -> &Lane {
        match provider {
            Provider::Sms => &self.sms,
            _ => &self.email,
        }
    }

    fn epoch(&self) -> u64 {
        *self.epoch.borrow()
    }

    /// Now and the current epoch: when, and in which epoch, reports scheduled now are.
    fn now_and_epoch(&self) -> (Instant, u64) {
        (Instant::now(), self.epoch())
    }
}

struct Inner {
    seed: u64,
    core: Arc<Core>,
    /// The signing keys, account ids and receiver URLs the messages share, one copy of each
    /// while there is room ([`crate::shared::Shared`]: e-mail event URLs made per message fill
    /// it, and later values are then each message's own).
    keys: Mutex<crate::shared::Shared<str>>,
    handle: Option<tokio::runtime::Handle>,
    /// Dropped with the dispatcher: the drivers end, and the reports' own runtime stops.
    _closed: watch::Sender<()>,
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
        let core = Arc::new(Core {
            ledger,
            client,
            pending: Arc::new(Pending::default()),
            sms: Lane::default(),
            email: Lane::default(),
            epoch: watch::Sender::new(0),
            plan: Mutex::new(None),
        });
        let (closed, _) = watch::channel(());
        if let Some(h) = &handle {
            for provider in [Provider::Sms, Provider::Smtp] {
                h.spawn(drive(core.clone(), provider, closed.subscribe()));
            }
        }
        Dispatcher {
            inner: Arc::new(Inner {
                seed,
                core,
                keys: Mutex::default(),
                handle,
                _closed: closed,
                _stop: stop,
            }),
        }
    }

    /// Reports scheduled and not yet finished (including ones waiting for a retry).
    pub fn pending(&self) -> usize {
        self.inner.core.pending.get()
    }

    /// The latest time any report was scheduled to be first tried (until then the fakes still
    /// have reports of their own plan to send, whatever the stack does), and the longest delay
    /// one was planned at.
    pub fn report_plan(&self) -> Option<ReportPlan> {
        *self
            .inner
            .core
            .plan
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves once no report is pending.
    pub async fn quiesced(&self) {
        self.inner.core.pending.idle().await
    }

    /// Drops every report still due (control API reset, shutdown).
    pub fn cancel_all(&self) {
        let core = &self.inner.core;
        core.epoch.send_modify(|e| *e += 1);
        core.sms.clear();
        core.email.clear();
        *core.plan.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Schedules the status callbacks of `msg`, an SMS the store accepted, if callbacks are on.
    /// `reports` are its plan's (the store keeps only the timeline). The reports hold the
    /// store's own packed SID and number and its shared origin and URL, not copies.
    pub fn sms_accepted(&self, cfg: &SmsConfig, msg: &Stored, reports: Vec<plan::Planned>) {
        let cb = &cfg.callbacks;
        let Some(url) = msg
            .status_callback
            .as_ref()
            .filter(|u| cb.enabled && !u.is_empty())
        else {
            return;
        };
        let (since, epoch) = self.inner.core.now_and_epoch();
        let message = Arc::new(Message {
            attempt: msg.attempt,
            since,
            epoch,
            url: url.clone(),
            policy: Policy {
                retry_on_error: cb.retry_on_error,
                max_retries: cb.max_retries,
                timeout: cb.timeout.0,
            },
            form: Form::Sms {
                sid: msg.sid,
                to: msg.to,
                origin: msg.origin.clone(),
                account_sid: self.key(&cfg.account_sid),
                auth_token: self.key(&cfg.auth_token),
            },
        });
        self.schedule(&message, reports);
    }

    /// Schedules the delivery events of an accepted e-mail (one recipient of one message), if
    /// events are on. `entry` is the SMTP fake's accepted ledger entry: `message_id` is the
    /// Message-ID header, `recipient` the RCPT address, and `callback_url`, when set (from an
    /// `X-Events-Url` header), overrides `events.url`.
    pub fn email_accepted(&self, cfg: &SmtpConfig, entry: &LedgerEntry) {
        let ev = &cfg.events;
        let Some(url) = entry.callback_url.as_deref().or(ev.url.as_deref()) else {
            return;
        };
        if !ev.enabled || entry.outcome != Outcome::Accepted {
            return;
        }
        let message_id = entry.message_id.as_deref().unwrap_or_default();
        let planned = plan::email(
            self.inner.seed,
            &entry.recipient,
            entry.attempt,
            message_id,
            ev,
        );
        let (since, epoch) = self.inner.core.now_and_epoch();
        let message = Arc::new(Message {
            attempt: entry.attempt,
            since,
            epoch,
            url: self.key(url),
            policy: Policy {
                retry_on_error: ev.retry_on_error,
                max_retries: ev.max_retries,
                timeout: ev.timeout.0,
            },
            form: Form::email(
                &entry.recipient,
                message_id,
                chrono::Utc::now(),
                self.key(&cfg.events_secret),
            ),
        });
        self.schedule(&message, planned);
    }

    /// The one shared copy of a configured key, account id or receiver URL (while there is room:
    /// [`crate::shared::Shared`]).
    fn key(&self, s: &str) -> Arc<str> {
        let mut keys = self.inner.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.text(s)
    }

    /// Queues `planned`, the reports about `message`, each at its time from when the message
    /// says they were scheduled (just now).
    fn schedule(&self, message: &Arc<Message>, planned: Vec<plan::Planned>) {
        if self.inner.handle.is_none() {
            tracing::warn!("callback dropped: dispatcher created outside a tokio runtime");
            return;
        }
        let core = &self.inner.core;
        let lane = core.lane(message.provider());
        let now = message.since;
        if let Some(longest) = planned.iter().map(|p| p.at).max() {
            let mut plan = core.plan.lock().unwrap_or_else(|p| p.into_inner());
            let due = (now + longest).into_std();
            *plan = Some(match *plan {
                None => ReportPlan {
                    last_due: due,
                    longest,
                },
                Some(p) => ReportPlan {
                    last_due: p.last_due.max(due),
                    longest: p.longest.max(longest),
                },
            });
        }
        for p in planned {
            let due = now + p.at;
            let report = Report::new(message.clone(), p);
            let job = Job::new(report, core.pending.ticket());
            lane.push(due, job);
        }
    }
}

/// One provider's driver: begins each report's try when it falls due, at most
/// [`MAX_IN_FLIGHT`] at once, until the dispatcher is dropped.
async fn drive(core: Arc<Core>, provider: Provider, mut closed: watch::Receiver<()>) {
    let lane = core.lane(provider);
    loop {
        let (starts, next) = lane.start_due(Instant::now(), MAX_IN_FLIGHT, core.epoch());
        for start in starts {
            tokio::spawn(attempt(core.clone(), start));
        }
        // Far enough to mean "until woken", near enough never to overflow an Instant.
        let until = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            _ = lane.wake.notified() => {}
            _ = tokio::time::sleep_until(until) => {}
            gone = closed.changed() => if gone.is_err() { return },
        }
    }
}

/// Gives a try's slot back however the try ends (answered, cancelled, its runtime stopped).
struct Slot<'a>(&'a Lane, Option<(Instant, Job)>);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.finished(self.1.take());
    }
}

/// One try of a report begun by the driver; dropped when the dispatcher cancels its epoch.
async fn attempt(core: Arc<Core>, start: Start) {
    let mut slot = Slot(core.lane(start.job.report.message.provider()), None);
    let mut epoch = core.epoch.subscribe();
    if *epoch.borrow_and_update() != start.job.epoch() {
        return;
    }
    tokio::select! {
        _ = epoch.changed() => {}
        retry = try_once(&core, start) => slot.1 = retry,
    }
}

/// Sends one try of a report and records it; returns the job and when to try it again when
/// the receiver answered 5xx, timed out or could not be reached (after a backoff or the answer's
/// `Retry-After`, whole seconds, when that is longer, as a webhook sender does).
async fn try_once(core: &Core, start: Start) -> Option<(Instant, Job)> {
    let Start {
        mut job,
        due,
        awake,
    } = start;
    let started = Instant::now();
    job.tries.made += 1;
    job.tries.counted += 1;
    let Answer {
        code,
        err,
        retry_after,
        refused,
    } = Box::pin(send_once(&core.client, &job.report)).await;
    let answered = Instant::now();
    let times = Times {
        late: awake.saturating_duration_since(due),
        queued: started.saturating_duration_since(awake),
        took: answered.duration_since(started),
    };
    record_try(
        &core.ledger,
        &job.report,
        job.tries.made,
        (code, err),
        times,
    );
    let policy = job.report.message.policy;
    if refused && policy.retry_on_error && job.since().elapsed() < RECEIVER_DOWN_PATIENCE {
        // Nobody was listening (the stack's API restarting): not a try the stack failed.
        job.tries.counted -= 1;
        return Some((answered + RECEIVER_DOWN_GAP, job));
    }
    let retryable = code.is_none_or(|c| c >= 500);
    if !retryable || job.tries.counted >= policy.tries() {
        return None;
    }
    let gap = backoff(job.tries.counted).max(retry_after.unwrap_or_default());
    Some((answered + gap, job))
}

/// How late a try began, how long it waited for a slot, how long the answer took.
struct Times {
    late: Duration,
    queued: Duration,
    took: Duration,
}

/// Records try `n` of `report` and how it was answered. Apart from [`try_once`] so that a
/// try's future keeps no room for the entry.
fn record_try(
    ledger: &Ledger,
    report: &Report,
    n: u32,
    (code, err): (Option<u16>, Option<String>),
    times: Times,
) {
    let message = &report.message;
    let mut d = LedgerEntry::draft(
        message.provider(),
        EntryKind::Callback,
        message.recipient().into_owned(),
    );
    d.attempt = message.attempt;
    d.outcome = Outcome::Info;
    d.status = code
        .map(|c| c.to_string())
        .unwrap_or_else(|| "no answer".into());
    d.error = err;
    d.fault = (report.variant != CallbackVariant::Genuine)
        .then(|| format!("callback {:?}", report.variant).to_lowercase());
    d.idempotency_key = Some(report.token.to_string());
    d.message_id = Some(report.message_id().into_owned());
    d.callback_status = Some(report.status().to_string());
    d.callback_variant = Some(report.variant);
    d.callback_url = Some(message.url.to_string());
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

/// One try of `report`: the request, rendered now, and the answer's status and `Retry-After`.
async fn send_once(client: &reqwest::Client, report: &Report) -> Answer {
    let request = report.request();
    let result = client
        .post(&*report.message.url)
        .timeout(report.message.policy.timeout)
        .header("content-type", request.content_type)
        .header("user-agent", "ting-chaos-mock-providers")
        .headers(
            request
                .headers
                .iter()
                .filter_map(|(k, v)| {
                    Some((reqwest::header::HeaderName::from_static(k), v.parse().ok()?))
                })
                .collect(),
        )
        .body(request.body)
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

#[cfg(test)]
mod flood {
    use super::*;

    /// A flood of reports due at once to a receiver that never answers is a queue, not a task
    /// each: the callbacks runtime holds the two drivers and at most [`MAX_IN_FLIGHT`] tries
    /// per provider (and their connections), however many reports are pending.
    #[tokio::test]
    async fn a_flood_of_due_reports_holds_a_bounded_number_of_tasks() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/events", silent.local_addr().unwrap());
        let d = Dispatcher::new(3, Ledger::new());
        let mut cfg = SmtpConfig::default();
        cfg.events.enabled = true;
        cfg.events.url = Some(url);
        cfg.events.delay_min = crate::units::HumanDuration::from_millis(0);
        cfg.events.delay_max = crate::units::HumanDuration::from_millis(0);
        cfg.events.timeout = crate::units::HumanDuration::from_millis(60_000);
        const N: usize = 5_000;
        for i in 0..N {
            let mut e = LedgerEntry::draft(Provider::Smtp, EntryKind::Send, format!("r{i}@x.test"));
            e.outcome = Outcome::Accepted;
            e.message_id = Some(format!("<m{i}@x.test>"));
            d.email_accepted(&cfg, &e);
        }
        let pending = d.pending();
        assert!(pending >= N, "{pending} pending");
        let handle = d.inner.handle.clone().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while d.inner.core.email.counts().1 < MAX_IN_FLIGHT && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(d.inner.core.email.counts().1, MAX_IN_FLIGHT);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let tasks = handle.metrics().num_alive_tasks();
        assert!(
            tasks <= 2 + 3 * MAX_IN_FLIGHT,
            "{tasks} tasks for {pending} pending reports"
        );
        assert_eq!(d.pending(), pending, "none answered, none lost");
        d.cancel_all();
        tokio::time::timeout(Duration::from_secs(5), d.quiesced())
            .await
            .expect("a cancel leaves nothing pending");
    }
}

#[cfg(test)]
mod sharing {
    use super::*;

    /// An SMS's reports hold the store's own origin and callback URL (one more reference each),
    /// not copies of them, however many reports the plan has.
    #[tokio::test]
    async fn sms_reports_share_the_stores_origin_and_url() {
        let d = Dispatcher::new(5, Ledger::new());
        let mut cfg = SmsConfig::default();
        cfg.callbacks.enabled = true;
        cfg.callbacks.duplicate_rate = crate::units::Ratio(1.0);
        cfg.callbacks.delay_min = crate::units::HumanDuration::from_millis(60_000);
        cfg.callbacks.delay_max = crate::units::HumanDuration::from_millis(60_000);
        let msg = Stored {
            sid: crate::packed::Sid::random(),
            to: crate::packed::Phone::parse("+15550000001").unwrap(),
            origin: Arc::new(crate::sms::store::Origin {
                account_sid: "AC1".into(),
                from: Some("+15559999999".into()),
                messaging_service_sid: None,
            }),
            status_callback: Some("http://127.0.0.1:1/cb".into()),
            body: "hi".into(),
            created: chrono::Utc::now(),
            attempt: 1,
            created_at: Instant::now(),
            timeline: plan::SmsTimeline::new(None, Duration::ZERO, Duration::ZERO),
        };
        let url = msg.status_callback.clone().unwrap();
        let (origins, urls) = (Arc::strong_count(&msg.origin), Arc::strong_count(&url));
        let plan = plan::sms(
            5,
            &msg.to.to_string(),
            1,
            &msg.sid.to_string(),
            &cfg.callbacks,
        );
        assert!(plan.reports.len() >= 4, "genuine and duplicate reports");
        d.sms_accepted(&cfg, &msg, plan.reports);
        assert!(d.pending() >= 4);
        assert_eq!(Arc::strong_count(&msg.origin), origins + 1);
        assert_eq!(Arc::strong_count(&url), urls + 1);
        d.cancel_all();
        assert_eq!(d.pending(), 0);
        assert_eq!(Arc::strong_count(&msg.origin), origins);
    }
}
