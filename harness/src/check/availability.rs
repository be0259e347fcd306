//! When the stack could act at all: which workers were running, booted and awake, and when chaos
//! had the database down or locked. Shared by `recovery` (when the clock of a rescue starts) and
//! `retry_discipline` (time a retry could not have been made is not a late retry).
//!
//! A worker can act once it has booted: its start plus the stack's boot time as this run measured
//! it ([`measure_boot`]: how soon the first workers made a request once the first batch was
//! accepted, before any chaos). A correct stack may take seconds to boot (a JVM, a large
//! interpreter start-up), and while its only worker's replacement boots no rescue and no retry
//! can happen. The boot is measured on the workers started before the load, never on the
//! replacement being judged, so a replacement slow to rescue gains nothing by it.
//!
//! Read only from the harness's own timeline, process records and ledger, never from the stack.
//! Also: which sends a frozen process may have had under way when it froze ([`resumed_mid_send`]).

use std::collections::{HashMap, HashSet};

use mock_providers::ledger::EntryKind;

use super::{EventKind, Input, ProcessRecord, Role, TimelineEvent};

/// The longest boot [`measure_boot`] reports.
pub const MAX_BOOT_NS: u64 = 30_000_000_000;

/// The stack's worker boot time: over the workers started before the first batch was accepted,
/// the shortest time from the later of their start and that acceptance to their first provider
/// request (the fastest of them: the others may simply have found no row free), at most
/// [`MAX_BOOT_NS`]. Only requests before the run's first disturbance count (a kill, an outage,
/// the database out: [`EventKind::unsettles_leases`]), which says nothing of booting. 0 when no
/// batch was accepted or none of them made such a request.
pub fn measure_boot(input: &Input) -> u64 {
    let Some(accepted) = input.batches.iter().map(|b| b.acked_ns).min() else {
        return 0;
    };
    let disturbed = input
        .timeline
        .iter()
        .filter(|e| e.mono_ns >= accepted && e.kind.unsettles_leases())
        .map(|e| e.mono_ns)
        .min()
        .unwrap_or(u64::MAX);
    let mut first: HashMap<u32, u64> = HashMap::new();
    for e in input.ledger {
        if let Some(pid) = input.pids.get(e.seq) {
            let at = first.entry(pid).or_insert(e.received_ns);
            *at = (*at).min(e.received_ns);
        }
    }
    input
        .processes
        .iter()
        .filter(|p| p.role == Role::Worker && p.started_ns <= accepted)
        .filter_map(|p| {
            let from = p.started_ns.max(accepted);
            first
                .get(&p.pid)
                .filter(|f| **f < disturbed)
                .map(|f| f.saturating_sub(from))
        })
        .min()
        .unwrap_or(0)
        .min(MAX_BOOT_NS)
}

/// When worker `p` could first act: its start plus the stack's boot time.
pub fn ready_ns(input: &Input, p: &ProcessRecord) -> u64 {
    p.started_ns.saturating_add(input.worker_boot_ns())
}

/// Periods `[stop, cont)` during which `pid` was stopped (`None`: never continued).
pub fn stops(timeline: &[TimelineEvent], pid: u32) -> Vec<(u64, Option<u64>)> {
    let mut out: Vec<(u64, Option<u64>)> = Vec::new();
    let mut evs: Vec<&TimelineEvent> = timeline.iter().filter(|e| e.pid == Some(pid)).collect();
    evs.sort_by_key(|e| e.mono_ns);
    for e in evs {
        match e.kind {
            EventKind::Sigstop => out.push((e.mono_ns, None)),
            EventKind::Sigcont => {
                if let Some(last) = out.last_mut().filter(|s| s.1.is_none()) {
                    last.1 = Some(e.mono_ns);
                }
            }
            _ => {}
        }
    }
    out
}

/// How soon after its process's SIGCONT a send may still be the one that was under way when the
/// process froze (plus any machine stall in between).
pub const RESUMED_MID_SEND_NS: u64 = 25_000_000;

/// The sends (ledger `seq`) that may have been under way when their process was frozen: per
/// SIGCONT, only the *first* send request of that process to arrive within
/// [`RESUMED_MID_SEND_NS`] of it. Woken, a process finishes the write it was in — of a request
/// whose lease it had checked — before it can check anything again, and no stack can close that
/// gap without a fencing token the provider honours. One such write per freeze is that gap; a
/// burst of them is a process that sent on waking without re-checking (the `zombie-send` flaw
/// sends 17 or 18 within the window), and only its first is excused.
pub fn resumed_mid_send(input: &Input) -> HashSet<u64> {
    let mut conts: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
    for e in input
        .timeline
        .iter()
        .filter(|e| e.kind == EventKind::Sigcont)
    {
        let Some(pid) = e.pid else { continue };
        let until =
            crate::stalls::extended(input.stalls, e.mono_ns, e.mono_ns + RESUMED_MID_SEND_NS);
        conts.entry(pid).or_default().push((e.mono_ns, until));
    }
    let mut first: HashMap<(u32, u64), (u64, u64)> = HashMap::new();
    for s in input.ledger.iter().filter(|s| s.kind == EntryKind::Send) {
        let Some(pid) = input.pids.get(s.seq) else {
            continue;
        };
        let Some(windows) = conts.get(&pid) else {
            continue;
        };
        for (c, _) in windows
            .iter()
            .filter(|(c, u)| (*c..=*u).contains(&s.received_ns))
        {
            let key = (s.received_ns, s.seq);
            let f = first.entry((pid, *c)).or_insert(key);
            *f = (*f).min(key);
        }
    }
    first.values().map(|(_, seq)| *seq).collect()
}

/// Periods `[from, to)` during which chaos had the database down (a restart until it was back)
/// or held a lock on it (an idle transaction until it ended). An unmatched start lasts forever.
fn database_out(timeline: &[TimelineEvent]) -> Vec<(u64, u64)> {
    let mut evs: Vec<&TimelineEvent> = timeline.iter().collect();
    evs.sort_by_key(|e| e.mono_ns);
    let mut out = Vec::new();
    let mut open: [Option<u64>; 2] = [None, None];
    for e in evs {
        match e.kind {
            EventKind::DbRestart => open[0] = Some(e.mono_ns),
            EventKind::DbIdleTx => open[1] = Some(e.mono_ns),
            EventKind::DbRestarted | EventKind::DbRestartFailed | EventKind::DbRestartSkipped => {
                if let Some(s) = open[0].take() {
                    out.push((s, e.mono_ns));
                }
            }
            EventKind::DbIdleTxEnd => {
                if let Some(s) = open[1].take() {
                    out.push((s, e.mono_ns));
                }
            }
            _ => {}
        }
    }
    out.extend(open.iter().flatten().map(|s| (*s, u64::MAX)));
    out
}

/// Whether some worker process was running, booted ([`ready_ns`]) and not stopped at `x`. Always
/// true when the input has no process records (nothing to say otherwise).
pub fn worker_able_at(input: &Input, x: u64) -> bool {
    let mut workers = input.processes.iter().filter(|p| p.role == Role::Worker);
    let mut any = false;
    let able = workers.any(|p| {
        any = true;
        ready_ns(input, p) <= x
            && p.exited_ns.is_none_or(|e| e > x)
            && !stops(input.timeline, p.pid)
                .iter()
                .any(|(s, c)| *s <= x && c.is_none_or(|c| c > x))
    });
    able || !any
}

/// Nanoseconds within `[from, to)` during which no worker could act or the database was out:
/// time in which no correct stack can make an attempt.
pub fn blocked_ns(input: &Input, from: u64, to: u64) -> u64 {
    if to <= from {
        return 0;
    }
    let db = database_out(input.timeline);
    // Every moment the answer can change: process starts and exits, stops, continues, db events.
    let mut cuts: Vec<u64> = vec![from, to];
    for p in input.processes.iter().filter(|p| p.role == Role::Worker) {
        cuts.push(ready_ns(input, p));
        cuts.extend(p.exited_ns);
    }
    for e in input.timeline {
        cuts.push(e.mono_ns);
    }
    for (s, e) in &db {
        cuts.extend([*s, *e]);
    }
    cuts.retain(|c| (from..=to).contains(c));
    cuts.sort_unstable();
    cuts.dedup();
    cuts.windows(2)
        .filter(|w| {
            let x = w[0];
            !worker_able_at(input, x) || db.iter().any(|(s, e)| *s <= x && x < *e)
        })
        .map(|w| w[1] - w[0])
        .sum()
}

/// `to`, moved later by every stretch from `from` on in which no worker could act or the
/// database was out ([`blocked_ns`]): the moment by which the stack has had `to − from` of time
/// it could act in (a deadline that counts only such time).
pub fn past_blocked(input: &Input, from: u64, to: u64) -> u64 {
    let mut at = to;
    // Each step adds the blocked time the last one uncovered; stretches are few, so it settles
    // in a handful (bounded all the same).
    for _ in 0..16 {
        let next = to.saturating_add(blocked_ns(input, from, at));
        if next == at {
            break;
        }
        at = next;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;
    use mock_providers::ledger::Outcome;

    #[test]
    fn blocked_while_no_worker_is_awake_or_the_database_is_out() {
        let mut w = World::new();
        w.worker(7, 0, Some(1_000));
        w.worker(8, 1_500, None);
        w.event(EventKind::Sigstop, Some(8), 2_000);
        w.event(EventKind::Sigcont, Some(8), 2_300);
        w.event(EventKind::DbRestart, None, 3_000);
        w.event(EventKind::DbRestarted, None, 3_400);
        let i = w.input();
        // (from, to, blocked ms): the gap between 7's exit and 8's start, 8's stop, the restart.
        for (from, to, want) in [
            (0, 900, 0),
            (500, 2_000, 500),
            (1_800, 2_500, 300),
            (2_900, 5_000, 400),
            (0, 5_000, 1_200),
            (4_000, 3_000, 0),
        ] {
            assert_eq!(blocked_ns(&i, ns(from), ns(to)), ns(want), "{from}..{to}");
        }
        assert!(worker_able_at(&i, ns(100)) && !worker_able_at(&i, ns(2_100)));
        assert!(worker_able_at(&World::new().input(), 0), "no records: able");
        // Time to act from a moment on: 1000..1500, 2000..2300 and 3000..3400 are blocked.
        assert_eq!(past_blocked(&i, 0, ns(900)), ns(900));
        assert_eq!(past_blocked(&i, 0, ns(2_000)), ns(2_800));
        assert_eq!(past_blocked(&i, ns(2_900), ns(3_100)), ns(3_500));
    }

    /// Workers 7 and 8 start at 0; the batch is accepted at 105 ms; 7's first request comes at
    /// 8105 ms and 8's at 9000 ms: the stack boots in 8 s. Worker 9, started at 20 s, can act
    /// from 28 s, whatever it sends itself: 7 s of blocked time in [20 s, 27 s).
    #[test]
    fn a_worker_is_able_once_booted_as_the_first_workers_were() {
        let mut w = World::new();
        w.worker(7, 0, Some(15_000));
        w.worker(8, 0, Some(15_000));
        w.enqueued("b", 100, false);
        let a = w.expect("r1", crate::scenario::Channel::Line);
        w.send(
            crate::scenario::Channel::Line,
            &a,
            Outcome::Transient,
            8_105,
        )
        .pid(7);
        w.send(
            crate::scenario::Channel::Line,
            &a,
            Outcome::Transient,
            9_000,
        )
        .pid(8);
        w.worker(9, 20_000, None);
        w.send(
            crate::scenario::Channel::Line,
            &a,
            Outcome::Accepted,
            20_100,
        )
        .pid(9);
        let i = w.input();
        assert_eq!(i.worker_boot_ns(), ns(8_000));
        assert_eq!(blocked_ns(&i, ns(15_000), ns(27_000)), ns(12_000));
        assert!(!worker_able_at(&i, ns(27_999)) && worker_able_at(&i, ns(28_000)));

        // Without an accepted batch nothing was measured: able from its start.
        w.batches.clear();
        assert_eq!(w.input().worker_boot_ns(), 0);
        // The fastest worker sets it; a boot over 30 s is cut to 30 s.
        w.enqueued("b", 100, false);
        w.entry_mut(0).received_ns = ns(60_000);
        assert_eq!(w.input().worker_boot_ns(), ns(8_895));
        w.entry_mut(1).received_ns = ns(70_000);
        assert_eq!(w.input().worker_boot_ns(), MAX_BOOT_NS);
        // A kill before either first request: nothing measured before the chaos.
        w.event(EventKind::Sigkill, Some(9), 50_000);
        assert_eq!(w.input().worker_boot_ns(), 0);
    }
}
