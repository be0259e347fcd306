//! The reports one provider owes the stack, in the order they fall due: a heap of small jobs
//! keyed by due time, a line of those due and waiting for a connection slot ([`Fifo`]), and the
//! count of tries in flight — never more than [`super::MAX_IN_FLIGHT`].
//!
//! A flood keeps a hundred thousand reports or more due at once (the stack's receiver slower
//! than they fall due). Each is a [`Job`] here, not a task: the only tasks are the lane's driver
//! and its tries in flight. A job is a [`Report`] and its try counts, 64 bytes kept inline in the
//! heap's buffer and the line's chunks, with no allocation of its own but a made-up message id;
//! its times are nanoseconds after the lane's base instant, 8 bytes each instead of an
//! [`Instant`]'s 16, so a report due and waiting is 80 bytes and 170,000 of them under 14 MB,
//! given back chunk by chunk as the line drains. When it was scheduled and in which epoch are
//! its message's ([`super::report::Message`]), the same for all of a message's reports.
//!
//! Pure bookkeeping under one short lock; the driver and the tries live in [`super`]. A job's
//! times are what a task per report measured: `late` from its due time to when the driver saw
//! it due, `queued` from then to when a slot was free.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::fifo::Fifo;
use super::report::Report;

/// The reports scheduled and not finished, over every lane; [`Ticket`]s keep it.
#[derive(Default)]
pub(super) struct Pending {
    count: AtomicUsize,
    idle: Notify,
}

impl Pending {
    pub fn get(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Resolves once no report is pending.
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.get() == 0 {
                return;
            }
            notified.await;
        }
    }

    pub fn ticket(self: &Arc<Pending>) -> Ticket {
        self.count.fetch_add(1, Ordering::AcqRel);
        Ticket(self.clone())
    }
}

/// One pending report: the count goes down when its job is dropped, however it ends (sent for
/// the last time, cancelled, its runtime stopped).
pub(super) struct Ticket(Arc<Pending>);

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Where a report stands among its tries. (`max_retries` is not bounded by the configuration's
/// validation, so the counts stay `u32`.)
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Tries {
    /// Tries made.
    pub made: u32,
    /// Tries counted against the receiver (one it refused while restarting is not).
    pub counted: u32,
}

/// A report in the queue.
pub(super) struct Job {
    pub report: Report,
    pub tries: Tries,
    _ticket: Ticket,
}

impl Job {
    /// A job for `report`, scheduled when and in the epoch its message says.
    pub fn new(report: Report, ticket: Ticket) -> Job {
        Job {
            report,
            tries: Tries::default(),
            _ticket: ticket,
        }
    }

    /// The dispatcher's epoch when the job was scheduled: a job of an earlier epoch was
    /// cancelled.
    pub fn epoch(&self) -> u64 {
        self.report.message.epoch
    }

    /// When the job was scheduled: the receiver-down patience runs from there.
    pub fn since(&self) -> Instant {
        self.report.message.since
    }
}

/// A job not due yet, ordered so that the heap's top is the earliest due (then the first
/// scheduled). `due` is in nanoseconds after the lane's base ([`Lane::ns`]).
struct Waiting {
    due: u64,
    seq: u64,
    job: Job,
}

impl PartialEq for Waiting {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}

impl Eq for Waiting {}

impl PartialOrd for Waiting {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for Waiting {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}

/// A job due, waiting for a slot: when it was due and when the driver saw it due, in
/// nanoseconds after the lane's base ([`Lane::ns`]).
struct Ready {
    due: u64,
    awake: u64,
    job: Job,
}

/// A try to begin now: the job, when it was due, and when the driver saw it due.
pub(super) struct Start {
    pub job: Job,
    pub due: Instant,
    pub awake: Instant,
}

#[derive(Default)]
struct State {
    waiting: BinaryHeap<Waiting>,
    ready: Fifo<Ready>,
    in_flight: usize,
    seq: u64,
}

/// One provider's queue, and the signal that wakes its driver.
pub(super) struct Lane {
    /// The instant the queue's times count from: when the lane was made, before any job.
    base: Instant,
    state: Mutex<State>,
    pub wake: Notify,
}

impl Default for Lane {
    fn default() -> Lane {
        Lane {
            base: Instant::now(),
            state: Mutex::default(),
            wake: Notify::new(),
        }
    }
}

impl Lane {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `t` in nanoseconds after the lane's base, saturating: an instant before the base (none
    /// is: every time queued is taken after the lane is made) counts as the base, and the count
    /// lasts 584 years.
    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The instant `ns` nanoseconds after the lane's base: the one [`Lane::ns`] was given, to
    /// the nanosecond, if it was not before the base.
    fn instant(&self, ns: u64) -> Instant {
        self.base + Duration::from_nanos(ns)
    }

    /// Queues `job` to be tried at `due`, and wakes the driver when it is now the earliest.
    pub fn push(&self, due: Instant, job: Job) {
        let due = self.ns(due);
        let earliest = {
            let mut s = self.lock();
            s.seq += 1;
            let seq = s.seq;
            s.waiting.push(Waiting { due, seq, job });
            s.waiting.peek().is_some_and(|w| w.seq == seq)
        };
        if earliest {
            self.wake.notify_one();
        }
    }

    /// At `now`: every job due moves to the line for a slot (seen due now), and jobs from the
    /// front of the line begin while fewer than `max` are in flight, skipping those of an epoch
    /// before `epoch` (cancelled). Returns the tries to begin and when the next job falls due.
    pub fn start_due(&self, now: Instant, max: usize, epoch: u64) -> (Vec<Start>, Option<Instant>) {
        let now = self.ns(now);
        let mut s = self.lock();
        while s.waiting.peek().is_some_and(|w| w.due <= now) {
            let Some(w) = s.waiting.pop() else { break };
            s.ready.push_back(Ready {
                due: w.due,
                awake: now,
                job: w.job,
            });
        }
        let mut starts = Vec::new();
        while s.in_flight < max {
            let Some(r) = s.ready.pop_front() else { break };
            if r.job.epoch() < epoch {
                continue;
            }
            s.in_flight += 1;
            starts.push(Start {
                job: r.job,
                due: self.instant(r.due),
                awake: self.instant(r.awake),
            });
        }
        let next = s.waiting.peek().map(|w| self.instant(w.due));
        shrink_when_drained(&mut s.waiting);
        (starts, next)
    }

    /// A try ended: its slot is free, and `retry`, if any, is queued again; wakes the driver.
    pub fn finished(&self, retry: Option<(Instant, Job)>) {
        {
            let mut s = self.lock();
            s.in_flight = s.in_flight.saturating_sub(1);
            if let Some((due, job)) = retry {
                let due = self.ns(due);
                s.seq += 1;
                let seq = s.seq;
                s.waiting.push(Waiting { due, seq, job });
            }
        }
        self.wake.notify_one();
    }

    /// Drops every job not in flight.
    pub fn clear(&self) {
        let (waiting, ready) = {
            let mut s = self.lock();
            (std::mem::take(&mut s.waiting), std::mem::take(&mut s.ready))
        };
        // Dropped outside the lock: each job's ticket may wake the dispatcher's waiters.
        drop((waiting, ready));
        self.wake.notify_one();
    }

    /// Jobs queued (waiting or due) and tries in flight.
    #[cfg(test)]
    pub fn counts(&self) -> (usize, usize) {
        let s = self.lock();
        (s.waiting.len() + s.ready.len(), s.in_flight)
    }
}

/// Gives back the room a flood of reports not yet due left in the heap once it has emptied
/// out. (The line of those due gives its chunks back as it drains: [`Fifo`].)
fn shrink_when_drained(waiting: &mut BinaryHeap<Waiting>) {
    const KEEP: usize = 1024;
    if waiting.len() < waiting.capacity() / 4 && waiting.capacity() > KEEP {
        waiting.shrink_to(KEEP.max(waiting.len() * 2));
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan;
    use super::super::report::{Form, Message, Policy, Report};
    use super::*;

    fn job(pending: &Arc<Pending>, epoch: u64) -> Job {
        let message = Arc::new(Message {
            attempt: 1,
            since: Instant::now(),
            epoch,
            url: "http://127.0.0.1:1/".into(),
            policy: Policy {
                retry_on_error: false,
                max_retries: 0,
                timeout: Duration::from_secs(1),
            },
            form: Form::email("a@b.test", "<m>", chrono::Utc::now(), "s".into()),
        });
        let cfg = crate::config::CallbackConfig {
            enabled: true,
            ..Default::default()
        };
        let p = plan::email(1, "a@b.test", 1, "<m>", &cfg).remove(0);
        Job::new(Report::new(message, p), pending.ticket())
    }

    /// A flood of due reports begins at most `max` tries at once, in due order; the rest wait in
    /// line, counted as pending, and each finished try lets exactly one more begin.
    #[test]
    fn a_flood_begins_at_most_max_tries_at_once() {
        let pending = Arc::new(Pending::default());
        let lane = Lane::default();
        let t0 = Instant::now();
        for i in 0..1_000u64 {
            lane.push(t0 + Duration::from_millis(1_000 - i), job(&pending, 0));
        }
        let (none, next) = lane.start_due(t0, 32, 0);
        assert!(none.is_empty());
        assert_eq!(next, Some(t0 + Duration::from_millis(1)));
        let later = t0 + Duration::from_secs(2);
        let (starts, next) = lane.start_due(later, 32, 0);
        assert_eq!((starts.len(), next), (32, None));
        assert!(starts.windows(2).all(|w| w[0].due <= w[1].due), "due order");
        assert!(starts.iter().all(|s| s.awake == later));
        assert_eq!(lane.counts(), (968, 32));
        assert_eq!(pending.get(), 1_000);
        drop(starts);
        assert_eq!(pending.get(), 968, "a dropped job is no longer pending");
        lane.finished(None);
        let (one, _) = lane.start_due(later, 32, 0);
        assert_eq!(one.len(), 1);
        lane.clear();
        assert_eq!(pending.get(), 1, "only the one in flight is left");
    }

    /// A job scheduled before a cancel (an earlier epoch) never begins; a retry goes back in.
    #[test]
    fn cancelled_jobs_never_begin_and_retries_go_back_in_line() {
        let pending = Arc::new(Pending::default());
        let lane = Lane::default();
        let t0 = Instant::now();
        lane.push(t0, job(&pending, 0));
        lane.push(t0, job(&pending, 1));
        let (starts, _) = lane.start_due(t0, 32, 1);
        assert_eq!(starts.len(), 1);
        assert_eq!(pending.get(), 1);
        let start = starts.into_iter().next().unwrap();
        lane.finished(Some((t0 + Duration::from_millis(5), start.job)));
        assert_eq!(lane.counts(), (1, 0));
        let (retry, _) = lane.start_due(t0 + Duration::from_millis(5), 32, 1);
        assert_eq!(retry.len(), 1);
    }

    /// A queued report is a few words inline in the heap or the line: 170,000 due at once stay
    /// under 14 MB, in chunks given back as they drain.
    #[test]
    fn a_queued_job_is_small() {
        let size = std::mem::size_of::<Job>();
        assert!(size <= 64, "Job grew to {size} bytes");
        let size = std::mem::size_of::<Waiting>();
        assert!(size <= 80, "Waiting grew to {size} bytes");
        let size = std::mem::size_of::<Ready>();
        assert!(size <= 80, "Ready grew to {size} bytes");
    }
}
