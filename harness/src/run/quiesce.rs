//! The run's fourth phase: waiting for quiescence. Every expected delivery must reach a final
//! outcome in the ledger (and, where the stack has a status API, a settled state there), no
//! delivery report may still be due and no chaos step running; then [`settled`] decides when that
//! calm is enough: a lease and a heartbeat past the last event that could have left a lease
//! behind (a kill, a freeze, a cut link), long enough for a stack that would resend after a
//! rescue to do so where the ledger sees it, and either the stack's own status API, asked after
//! the calm began, agreeing that nothing is open, or — without one — the calm itself lasting a
//! lease and a heartbeat. What "final" means is [`settle::Tracker`]'s, the same classification `no_loss`
//! uses. A stack still settling at the deadline is slow, not stuck: the wait goes on while it
//! makes progress, up to three times the deadline. The deadline counts from the fakes' last
//! planned delivery report and from the end of the last chaos action when those are later than
//! the wait's start ([`Deadline::not_before`]): the stack is never timed on reports it has not
//! been sent, nor through an outage the scenario holds it in.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use super::drive::Driven;
use super::provision::Fakes;
use super::start::{Stack, Workload};
use super::status_file::StatusFile;
use super::{infra, not_accepted, progress, settle, status, Resources};
use crate::check::{EventKind, Expected, LostBatch, Quiescence, StatusAnswers, StatusDelivery};
use crate::load::{Enqueued, TrickleRun};
use crate::scenario::{Channel, Scenario};

/// Past its deadline a run keeps waiting while some delivery settled, or the stack answered a
/// delivery report, within this long.
const QUIESCENCE_PROGRESS: Duration = Duration::from_secs(10);

/// A request a `hang` outage has held for less than this is the stack waiting on a provider for
/// its own timeout; one held longer is a client without a timeout (the contract requires one),
/// and no longer counts as progress.
const HOLD_IS_WAITING: Duration = Duration::from_secs(30);

/// The status API returns every delivery with its transitions (megabytes for a big batch): once
/// a second is plenty, and keeps the poll from competing with the stack for the CPU.
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// How often the status API is asked once the ledger is calm: then the stack is idle but for the
/// rows it is settling, each answer may be the one that ends the run, and with a cursor the
/// answers are the few rows that changed.
const STATUS_EVERY_CALM: Duration = Duration::from_millis(250);

/// What the wait saw, for the judges.
pub(super) struct Settled {
    pub quiescence: Quiescence,
    /// The batches' enqueues and the trickle's, in the order they were sent.
    pub enqueue: Enqueued,
    /// The stack's last whole answer for every accepted batch (None: no status API), without
    /// what no checker reads (transition details, payload digests).
    pub status: Option<Vec<StatusDelivery>>,
    /// `status.json`, the same rows whole, to commit with the report.
    pub status_file: Option<StatusFile>,
    /// Accepted batches the status API no longer knew.
    pub lost_batches: Vec<LostBatch>,
    /// How the status API answered (the answers that were not the contract's).
    pub status_answers: StatusAnswers,
}

/// Waits until the run is quiescent, gives up at its deadline, or stops because a crash left
/// nothing able to make progress; then finishes the trickle and reads the status API whole.
pub(super) async fn wait(
    (scenario, report_dir): (&Scenario, &Path),
    (fakes, res): (&Fakes, &Resources),
    stack: &Stack,
    work: &mut Workload,
    driven: Driven,
    progress: &mut progress::Progress,
    t0: Instant,
) -> anyhow::Result<Settled> {
    let world = &stack.world;
    let Driven {
        mut enqueue,
        mut stopped_early,
        trickle,
        mut watch,
    } = driven;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    // Only batches the stack accepted (202/200): a 404 for one of them is a lost batch. The
    // trickle's orders join as they are accepted.
    let mut batch_ids: Vec<String> = enqueue.batches.iter().map(|b| b.batch_id.clone()).collect();
    let reporting = reporting_channels(fakes);
    let mut tracker = settle::Tracker::new(&work.expected, scenario.expect.max_attempts);
    let mut deadline = Deadline::new(scenario.expect.quiescence);
    let settle_for = scenario.stack.lease + scenario.stack.heartbeat;
    let mut status_view = status::StatusPoller::new(work.expected.len(), world.journal.names());
    let mut last_status: Option<Instant> = None;
    let mut last_print = Instant::now();
    let mut calm_since: Option<Instant> = None;
    // The status API, asked after the calm began, agreed that nothing is open.
    let mut confirmed = false;
    let quiescence = loop {
        // Read before taking its orders: a trickle finished by now has published them all.
        let trickling = trickle.as_ref().is_some_and(|t| !t.is_finished());
        take_trickle(trickle.as_ref(), &mut tracker, work, &mut batch_ids);
        if let Some(t) = &trickle {
            let (ids, max) = (t.take_not_accepted(), scenario.expect.max_attempts);
            let journal = &stack.world.journal;
            not_accepted::forget_tracked(&mut work.expected, &ids, &mut tracker, max, journal);
        }
        let journal = &stack.world.journal;
        journal.since(tracker.next_seq(), |new| tracker.feed(new));
        if stopped_early.is_none() {
            stopped_early = watch.poll();
        }
        if let Some(why) = &stopped_early {
            world.event(EventKind::StoppedEarly, None, None, why.clone());
            break Quiescence {
                reached: false,
                at_ns: world.now_ns(),
                open: names(tracker.open(&work.expected, None, &reporting)),
                awaiting_report: Vec::new(),
                past_deadline_ms: None,
                deadline_ms: None,
                still_settling: false,
                callbacks_pending: 0,
                stopped_early: stopped_early.clone(),
            };
        }
        // Once the ledger has nothing open, nothing due and nothing running, only the stack's
        // own view can still hold the run: ask it sooner, so the run ends when the two agree.
        let ledger_calm = tracker.ledger_settled()
            && !trickling
            && !stack.chaos.busy()
            && res
                .providers
                .as_ref()
                .is_none_or(|p| p.pending_callbacks() == 0);
        let every = if ledger_calm {
            STATUS_EVERY_CALM
        } else {
            STATUS_EVERY
        };
        if status_view.enabled() && last_status.is_none_or(|t| t.elapsed() >= every) {
            last_status = Some(Instant::now());
            // Batches with a delivery the ledger has not settled are open whatever the stack
            // says; of the others, those the view still has open are what quiescence waits on.
            let unsettled: HashSet<&str> =
                tracker.open_batches(&work.expected).into_iter().collect();
            let view_open = tracker.open_in(&work.expected, status_view.by_batch(), &reporting);
            let waiting = |id: &str| !unsettled.contains(id) && view_open.contains(id);
            let in_flight = |id: &str| unsettled.contains(id);
            let now = world.now_ns();
            if let Err(e) = status_view
                .poll_some(
                    &client,
                    &stack.api_base,
                    &batch_ids,
                    (waiting, in_flight),
                    now,
                )
                .await
            {
                tracing::warn!("status API: {e:#}");
            }
        }
        let status = status_view.by_batch();
        if let Some(t) = &trickle {
            // The trickle runs while the batches drain (and past that, up to its minimum).
            let batches = &work.expected[..work.batch_deliveries];
            if tracker.open(batches, status, &reporting).is_empty() {
                t.stop();
            }
        }
        let open = tracker.open(&work.expected, status, &reporting);
        let pending = res
            .providers
            .as_ref()
            .map(|p| p.pending_callbacks())
            .unwrap_or(0);
        let calm = open.is_empty() && pending == 0 && !stack.chaos.busy() && !trickling;
        calm_since = if calm {
            calm_since.or(Some(Instant::now()))
        } else {
            None
        };
        confirmed &= calm;
        let (open, status) = if calm && !confirmed && status_view.enabled() {
            // Ask now, not at the next poll: the answer decides whether the calm is quiescence.
            let now = world.now_ns();
            if let Err(e) = status_view
                .poll_due(&client, &stack.api_base, &batch_ids, now)
                .await
            {
                tracing::warn!("status API: {e:#}");
            }
            last_status = Some(Instant::now());
            let status = status_view.by_batch();
            let open = tracker.open(&work.expected, status, &reporting);
            confirmed = status.is_some() && open.is_empty();
            (open, status)
        } else {
            (open, status)
        };
        if last_print.elapsed() >= Duration::from_millis(250) {
            last_print = Instant::now();
            progress.update(&snapshot(stack, work, pending, t0));
        }
        let disturbed = world.last_event_ns(EventKind::unsettles_leases);
        let since_disturbed =
            Duration::from_nanos(world.now_ns().saturating_sub(disturbed.unwrap_or(0)));
        let calm_for = calm_since.filter(|_| open.is_empty()).map(|t| t.elapsed());
        if settled(calm_for, confirmed, since_disturbed, settle_for) {
            break Quiescence {
                reached: true,
                at_ns: world.now_ns(),
                open: names(open),
                awaiting_report: Vec::new(),
                past_deadline_ms: deadline.past_ms(),
                deadline_ms: deadline.moved_ms(),
                still_settling: false,
                callbacks_pending: pending,
                stopped_early: None,
            };
        }
        // The harness's own schedule is not the stack's lateness: its deadline counts from the
        // fakes' last planned report and from the end of the last chaos action.
        // The plan moves the deadline as far as its longest delay from the wait's start, never
        // further: reports planned for sends the stack keeps making (a stack that resends for
        // ever) must not hold the wait open for ever.
        let plan = res.providers.as_ref().and_then(|p| p.report_plan());
        if let Some(plan) = plan {
            deadline.not_before(plan.last_due.min(deadline.start + plan.longest));
        }
        if stack.chaos.busy() {
            deadline.not_before(Instant::now());
        }
        let settled = work.expected.len().saturating_sub(open.len());
        deadline.note(settled, tracker.answered_reports());
        let held = res
            .providers
            .as_ref()
            .map(|p| p.ledger.held_requests(HOLD_IS_WAITING));
        if held.is_some_and(|n| n > 0) {
            deadline.waiting_on_providers();
        }
        if deadline.given_up(calm_since.is_some()) {
            // Open only for a delivery report the fakes did send and no longer have due
            // (delivered, or given up after its retries): the stack may be waiting for a report
            // it never got. A row no report was ever sent for stays open.
            let awaiting_report = if pending == 0 {
                let without: HashSet<String> = tracker
                    .open(&work.expected, status, &[])
                    .into_iter()
                    .map(settle::delivery_name)
                    .collect();
                let reported = stack
                    .world
                    .journal
                    .since(0, |all| settle::reported(all, &work.expected));
                open.iter()
                    .map(|d| settle::delivery_name(d))
                    .filter(|d| !without.contains(d) && reported.contains(d.as_str()))
                    .collect()
            } else {
                Vec::new()
            };
            let still_settling = (!open.is_empty() || pending > 0) && deadline.progressing();
            break Quiescence {
                reached: false,
                at_ns: world.now_ns(),
                open: names(open),
                awaiting_report,
                past_deadline_ms: deadline.past_ms(),
                deadline_ms: deadline.moved_ms(),
                still_settling,
                callbacks_pending: pending,
                stopped_early: None,
            };
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    if quiescence.stopped_early.is_none() {
        let kind = if quiescence.reached {
            EventKind::Quiescent
        } else {
            EventKind::Deadline
        };
        world.event(kind, None, None, format!("{} open", quiescence.open.len()));
    }
    match trickle {
        // After a crash that stopped the run its orders would only wait for a dead API.
        Some(t) if quiescence.stopped_early.is_some() => t.abort(),
        Some(t) => {
            // At the deadline the trickle may still be sending: its last orders are judged too.
            let (orders, late) = t.finish().await.map_err(|e| infra(format!("{e}")))?;
            for order in late {
                work.expected.extend(order.expected);
            }
            batch_ids.extend(orders.batches.iter().map(|b| b.batch_id.clone()));
            batch_ids.sort();
            batch_ids.dedup();
            enqueue.merge(orders);
        }
        None => {}
    }
    let gone = enqueue.failures.not_accepted.iter();
    not_accepted::forget(&mut work.expected, gone.map(|b| b.batch_id.as_str()));
    let mut status_file = None;
    if status_view.enabled() {
        let file = StatusFile::create(&report_dir.join("status.json"))?;
        let now = world.now_ns();
        let (file, polled) = status_view
            .poll_last(&client, &stack.api_base, &batch_ids, now, file)
            .await;
        if let Err(e) = polled {
            tracing::warn!("status API: {e:#}");
        }
        status_file = file;
    }
    let lost_batches = status_view.lost();
    let status_answers = status_view.answers().clone();
    Ok(Settled {
        quiescence,
        enqueue,
        status: status_view.into_rows(),
        status_file,
        lost_batches,
        status_answers,
    })
}

/// Whether a calm run is quiescent. `calm_for`: how long nothing has been open, due or running
/// (`None`: something is); `confirmed`: the stack's status API, asked after the calm began,
/// agrees that nothing is open; `since_disturbed`: how long since the last event that may have
/// left a lease behind ([`EventKind::unsettles_leases`]); `settle_for`: a lease and a heartbeat.
///
/// A rescue acts only on a row its stack still has open, so once the stack's own view has every
/// delivery settled and every lease a disturbed process held has expired, waiting longer shows
/// nothing new. Without a status API the ledger alone cannot see a row the stack still holds:
/// the calm itself must then last a lease and a heartbeat.
fn settled(
    calm_for: Option<Duration>,
    confirmed: bool,
    since_disturbed: Duration,
    settle_for: Duration,
) -> bool {
    let Some(calm_for) = calm_for else {
        return false;
    };
    since_disturbed >= settle_for && (confirmed || calm_for >= settle_for)
}

/// The channels whose deliveries are settled only by a delivery report (SMS status callbacks,
/// e-mail delivery events), when the fakes send them.
fn reporting_channels(fakes: &Fakes) -> Vec<Channel> {
    [
        (Channel::Sms, fakes.config.sms.callbacks.enabled),
        (Channel::Email, fakes.config.smtp.events.enabled),
    ]
    .into_iter()
    .filter(|(_, on)| *on)
    .map(|(c, _)| c)
    .collect()
}

/// Takes the trickle's new orders into the expected deliveries (they are known before their
/// requests are sent, so before the ledger can hold any of their sends) and its accepted orders
/// into the batches the status API is asked about.
fn take_trickle(
    trickle: Option<&TrickleRun>,
    tracker: &mut settle::Tracker,
    work: &mut Workload,
    batch_ids: &mut Vec<String>,
) {
    let Some(t) = trickle else { return };
    for order in t.take_new() {
        tracker.extend(&order.expected);
        work.expected.extend(order.expected);
    }
    batch_ids.extend(t.take_accepted());
}

/// The deliveries still open, named as the report names them ([`settle::delivery_name`]).
fn names(open: Vec<&Expected>) -> Vec<String> {
    open.into_iter().map(settle::delivery_name).collect()
}

fn snapshot(stack: &Stack, work: &Workload, pending: usize, t0: Instant) -> progress::Snapshot {
    let world = &stack.world;
    progress::Snapshot {
        elapsed_s: t0.elapsed().as_secs_f64(),
        accepted: work
            .acceptable_by
            .iter()
            .map(|(c, n)| (*c, (world.accepted_on(c.provider()), *n)))
            .collect(),
        faults: world.faults_injected(),
        callbacks_due: pending,
        workers_alive: world.live_workers().len(),
    }
}

/// `expect.quiescence` as a stall detector, not a throughput requirement: past it the wait goes
/// on while the stack makes progress — more deliveries settled, or more delivery reports answered,
/// than ever before within QUIESCENCE_PROGRESS (settled, not fewer open: orders the trickle adds
/// faster than a slow stack settles them raise the open count while it settles), or a provider holding its requests unanswered — up to three
/// times it in all. A stack working through a backlog of reports (duplicates and stale ones for
/// rows already settled among them), or waiting out its timeouts on requests a hung provider
/// holds, is slow, not stuck.
struct Deadline {
    start: Instant,
    quiescence: Duration,
    soft: Instant,
    hard: Instant,
    most_settled: usize,
    most_answered: u64,
    last_progress: Instant,
}

impl Deadline {
    fn new(quiescence: Duration) -> Deadline {
        let now = Instant::now();
        Deadline {
            start: now,
            quiescence,
            soft: now + quiescence,
            hard: now + quiescence * 3,
            most_settled: 0,
            most_answered: 0,
            last_progress: now,
        }
    }

    /// Counts the deadline from `t` when that is later than the wait's start: the fakes' last
    /// planned delivery report, or a moment a chaos action was still running. Either is the
    /// harness's own schedule (a scenario's `delay_max` or an outage's `for` longer than its
    /// `expect.quiescence`), and the stack gets the whole `expect.quiescence` after it, as after
    /// the load.
    fn not_before(&mut self, t: Instant) {
        self.soft = self.soft.max(t + self.quiescence);
        self.hard = self.hard.max(self.soft + self.quiescence * 2);
    }

    /// The soft deadline from the wait's start, when the fakes' own reports moved it.
    fn moved_ms(&self) -> Option<u64> {
        let at = self.soft.duration_since(self.start);
        (at > self.quiescence).then_some(at.as_millis() as u64)
    }

    /// Notes how many of the deliveries expected so far are settled now and how many report
    /// tries the stack has answered.
    fn note(&mut self, settled: usize, answered: u64) {
        if settled > self.most_settled || answered > self.most_answered {
            self.most_settled = self.most_settled.max(settled);
            self.most_answered = self.most_answered.max(answered);
            self.last_progress = Instant::now();
        }
    }

    /// A provider holds requests unanswered (a `hang` outage outlives its window: each held
    /// request ends only when its sender's own timeout does): the stack is waiting on it, which
    /// is progress as far as a stall is concerned.
    fn waiting_on_providers(&mut self) {
        self.last_progress = Instant::now();
    }

    /// Whether to stop waiting. `calm`: nothing is open or due and the run is only waiting out
    /// its settle time (lease + heartbeat, which can be longer than QUIESCENCE_PROGRESS): that is
    /// the most progress there can be, so only the hard deadline ends it.
    fn given_up(&self, calm: bool) -> bool {
        let now = Instant::now();
        now >= self.soft && (!(calm || self.progressing()) || now >= self.hard)
    }

    /// Whether some delivery settled, or a report was answered, within [`QUIESCENCE_PROGRESS`].
    fn progressing(&self) -> bool {
        self.last_progress.elapsed() < QUIESCENCE_PROGRESS
    }

    /// How long past the soft deadline it is now, if it is.
    fn past_ms(&self) -> Option<u64> {
        Instant::now()
            .checked_duration_since(self.soft)
            .map(|d| d.as_millis() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn past(soft_ago: u64, hard_in: i64, progress_ago: u64) -> Deadline {
        let now = Instant::now();
        let hard = if hard_in >= 0 {
            now + Duration::from_secs(hard_in as u64)
        } else {
            now - Duration::from_secs((-hard_in) as u64)
        };
        Deadline {
            start: now - Duration::from_secs(soft_ago + 60),
            quiescence: Duration::from_secs(60),
            soft: now - Duration::from_secs(soft_ago),
            hard,
            most_settled: 0,
            most_answered: 0,
            last_progress: now - Duration::from_secs(progress_ago),
        }
    }

    #[test]
    fn a_calm_run_settles_at_once_only_when_the_stack_agrees_and_no_lease_is_left_behind() {
        let ms = Duration::from_millis;
        let settle_for = ms(2500);
        // (calm for, status confirmed, since the last disturbing event) → quiescent
        let cases = [
            // The stack's view agrees and the last kill is a lease and a heartbeat ago: at once.
            (Some(ms(0)), true, ms(9_000), true),
            // Something is open or due: never.
            (None, true, ms(9_000), false),
            // A kill 1 s ago: its leases may not have expired; a rescue could still resend.
            (Some(ms(5_000)), true, ms(1_000), false),
            (Some(ms(5_000)), false, ms(1_000), false),
            // No status API (or it has not agreed yet): the calm itself must last.
            (Some(ms(2_000)), false, ms(9_000), false),
            (Some(ms(2_500)), false, ms(9_000), true),
        ];
        for (calm_for, confirmed, since_disturbed, want) in cases {
            let got = settled(calm_for, confirmed, since_disturbed, settle_for);
            assert_eq!(got, want, "{calm_for:?} {confirmed} {since_disturbed:?}");
        }
    }

    #[test]
    fn every_chaos_action_unsettles_leases_and_the_harness_own_events_do_not() {
        use EventKind::*;
        for k in [
            Sigkill,
            Sigstop,
            Sigterm,
            RestartBegin,
            DbLinkPartition,
            ProviderLinkReset,
        ] {
            assert!(k.unsettles_leases(), "{k:?}");
        }
        for k in [LoadStart, LoadDone, ApiReady, Spawn, Quiescent] {
            assert!(!k.unsettles_leases(), "{k:?}");
        }
    }

    #[test]
    fn a_calm_run_waiting_out_its_settle_time_past_the_deadline_is_not_given_up() {
        // Everything settled past the soft deadline; the settle time (lease 10 s + heartbeat
        // 2 s in slow-provider) outlasts the 10 s progress window: not a stall.
        let d = past(20, 100, 11);
        assert!(!d.given_up(true));
        // Open work and no progress for 11 s past the deadline: a stall.
        assert!(d.given_up(false));
        // At the hard deadline even a calm run stops, and one still settling.
        assert!(past(20, -1, 11).given_up(true));
        let settling = past(20, -1, 2);
        assert!(settling.given_up(false) && settling.progressing());
        assert!(!d.progressing());
        // Before the soft deadline nothing gives up.
        let early = Deadline::new(Duration::from_secs(60));
        assert!(!early.given_up(false));
    }

    /// A slow stack behind a trickle that adds orders faster than it settles them: the open count
    /// only grows, yet every delivery it settles is progress (counted as fewer open, such a run
    /// was a stall at the soft deadline: quiescence and no_loss violated for a stack settling a
    /// delivery a second).
    #[test]
    fn settling_while_the_trickle_adds_more_is_progress() {
        let mut d = past(5, 100, 11);
        assert!(!d.progressing());
        // 10 of 100 settled, then 12 of 130 (30 more orders, 2 more settled).
        d.note(10, 0);
        d.last_progress = Instant::now() - Duration::from_secs(11);
        d.note(12, 0);
        assert!(d.progressing() && !d.given_up(false));
        // Nothing more settled, however many more are expected: no progress.
        d.last_progress = Instant::now() - Duration::from_secs(11);
        d.note(12, 0);
        assert!(!d.progressing() && d.given_up(false));
    }

    /// A scenario whose delivery reports fall due after `expect.quiescence` (its `delay_max`
    /// longer than the deadline): the stack gets the whole deadline after the last of them, as
    /// after the load.
    #[test]
    fn the_fakes_own_late_reports_move_the_deadline() {
        let q = Duration::from_secs(2);
        let mut d = Deadline::new(q);
        let start = d.start;
        // Reports planned by the wait's start (during the load): nothing moves.
        d.not_before(start);
        assert_eq!(
            (d.soft, d.hard, d.moved_ms()),
            (start + q, start + q * 3, None)
        );
        d.not_before(start + Duration::from_secs(14));
        assert_eq!(d.soft, start + Duration::from_secs(16));
        assert_eq!(d.hard, start + Duration::from_secs(20));
        assert_eq!(d.moved_ms(), Some(16_000));
        // Before it, nothing gives up, whatever the stack is doing.
        assert!(!d.given_up(false));
        // An earlier report never moves it back.
        d.not_before(start + Duration::from_secs(3));
        assert_eq!(d.soft, start + Duration::from_secs(16));
    }

    /// A hung provider holding the stack's requests past its outage (each ends at the stack's own
    /// timeout) is the stack waiting on it: progress as far as a stall is concerned, so the wait
    /// is not given up before the hard deadline, and the run is still settling there.
    #[test]
    fn requests_a_provider_holds_are_no_stall() {
        let mut d = past(20, 100, 11);
        assert!(d.given_up(false), "nothing moving: a stall");
        d.waiting_on_providers();
        assert!(d.progressing() && !d.given_up(false));
    }

    /// The same deliveries open, but the stack answered more delivery reports: it is working
    /// through a backlog (a slow drain), not stalled. Reports it sheds or leaves unanswered are
    /// not counted, so a stack that only answers 503 stalls.
    #[test]
    fn answering_more_reports_is_progress_even_with_the_same_deliveries_open() {
        let mut d = past(20, 100, 11);
        d.most_settled = 93;
        d.most_answered = 500;
        d.note(93, 500);
        assert!(d.given_up(false), "nothing new: a stall");
        d.note(93, 501);
        assert!(d.progressing() && !d.given_up(false));
    }
}
