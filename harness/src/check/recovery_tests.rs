//! Tests of the `recovery` checker (kept apart so the checker reads in one sitting).
//!
//! Base scenario: lease 1 s, recovery slack 500 ms, so a kill at T must see progress by
//! T + 1500 ms unless no worker could act until later.

use mock_providers::ledger::Outcome::*;

use super::*;
use crate::check::testkit::*;
use crate::check::Status;
use crate::scenario::Channel::*;

/// Workers 7 and 8 from 0 ms; 7 is SIGKILLed at 1000 ms while sending to r1, which 8 rescues
/// at 2100 ms.
fn kill_rescued() -> World {
    let mut w = World::new();
    w.worker(7, 0, Some(1_000)).signal = Some(9);
    w.worker(8, 0, None);
    w.event(EventKind::Sigkill, Some(7), 1_000);
    let a = w.expect("r1", Line);
    w.send(Line, &a, Transient, 990).pid(7).latency(110); // in flight at T
    w.send(Line, &a, Accepted, 2_100).pid(8);
    let b = w.expect("r2", Sms);
    w.send(Sms, &b, Accepted, 500).pid(7); // final before T: nothing to recover
    w
}

/// [`kill_rescued`] without worker 8: the killed worker 7 was the only one, and the workers the
/// test adds replace it.
fn sole_worker_killed() -> World {
    let mut w = kill_rescued();
    w.processes.remove(1);
    w
}

/// The rescued LINE delivery's next attempt (the ledger's second entry) arrives at `at_ms`, sent
/// by `pid`.
fn next_attempt(w: &mut World, at_ms: u64, pid: u32) {
    w.entry_mut(1).received_ns = ns(at_ms);
    w.entry_mut(1).mono_ns = ns(at_ms + 5);
    w.pids.insert(1, pid);
}

#[test]
fn timely_recoveries_hold() {
    let w = kill_rescued();
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert_eq!(v.figures["deliveries_at_risk"], 1);
    assert_eq!(v.figures["slowest_recovery_ms"], 1_100.0);

    // A Retry-After answered just before the kill pushes the deadline past T + lease + slack.
    let mut w = kill_rescued();
    let c = w.expect("r3", Email);
    w.send(Email, &c, Transient, 900).pid(7).retry_after(3_000);
    w.send(Email, &c, Accepted, 4_300).pid(8);
    assert_eq!(check(&w.input()).status, Status::Holds);

    // A short stop: 8 is frozen 3000..3300 ms while sending to r4 and finishes it itself.
    let mut w = kill_rescued();
    w.event(EventKind::Sigstop, Some(8), 3_000);
    w.event(EventKind::Sigcont, Some(8), 3_300);
    let d = w.expect("r4", Sms);
    w.send(Sms, &d, Transient, 2_990).pid(8).latency(20);
    w.send(Sms, &d, Accepted, 3_400).pid(8);
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
}

#[test]
fn sole_worker_is_judged_from_its_replacement() {
    // (next attempt at ms, expected status): replacement 9 starts at 5000, deadline 5500.
    for (next, status) in [(5_400, Status::Holds), (5_600, Status::Violated)] {
        let mut w = sole_worker_killed();
        w.worker(9, 5_000, None);
        next_attempt(&mut w, next, 9);
        let v = check(&w.input());
        assert_eq!(v.status, status, "next at {next}: {v:#?}");
        if status == Status::Violated {
            assert_eq!(v.counterexamples[0]["workers_able_from_ms"], 5_000.0);
        }
    }
}

/// A stack whose workers take a while to boot: the batch was accepted at 5 ms and the first
/// workers' first request came at 500 ms, a 495 ms boot. The sole worker's replacement, started
/// at 5000 ms, can act from 5495 ms, so its rescue is due by 5995 ms (5500 ms for a stack that
/// boots at once: `sole_worker_is_judged_from_its_replacement`). The boot is the first workers',
/// never the replacement's own: a replacement that rescues late is still late.
#[test]
fn a_slow_booting_stack_is_judged_from_its_replacements_boot() {
    for (next, status) in [(5_900, Status::Holds), (6_100, Status::Violated)] {
        let mut w = sole_worker_killed();
        w.enqueued("b", 0, false);
        w.worker(9, 5_000, None);
        next_attempt(&mut w, next, 9);
        let v = check(&w.input());
        assert_eq!(v.status, status, "next at {next}: {v:#?}");
        assert_eq!(v.figures["worker_boot_ms"], 495.0);
        if status == Status::Violated {
            assert_eq!(v.counterexamples[0]["workers_able_from_ms"], 5_495.0);
        }
    }
}

/// The sole worker is killed at 1000 ms; its replacement 9 runs 1500..2000 ms (the harness stops
/// it again before it rescued anything) and 10 starts at 4000 ms. Without a worker for 2000 ms
/// after the first could act, the 2500 ms deadline moves to 4500 ms.
#[test]
fn time_without_any_worker_after_the_first_could_act_extends_the_deadline() {
    for (next, status) in [(4_400, Status::Holds), (4_600, Status::Violated)] {
        let mut w = sole_worker_killed();
        w.worker(9, 1_500, Some(2_000));
        w.worker(10, 4_000, None);
        next_attempt(&mut w, next, 10);
        let v = check(&w.input());
        assert_eq!(v.status, status, "next at {next}: {v:#?}");
        if status == Status::Violated {
            assert_eq!(v.counterexamples[0]["deadline_ms"], 4_500.0);
        }
    }
}

#[test]
fn a_stalled_machine_extends_the_deadline_by_the_stall() {
    // Rescued at 2600 ms, 100 ms past the 2500 ms deadline: late on a quiet machine, in time
    // when the machine stalled 200 ms after the kill; a stall before the kill gives nothing.
    for (stall, status) in [
        (None, Status::Violated),
        (Some((500, 900)), Status::Violated),
        (Some((1_200, 1_400)), Status::Holds),
    ] {
        let mut w = kill_rescued();
        next_attempt(&mut w, 2_600, 8);
        w.stalls = stall
            .map(|(from, to)| crate::stalls::Stall {
                from_ns: ns(from),
                to_ns: ns(to),
            })
            .into_iter()
            .collect();
        let v = check(&w.input());
        assert_eq!(v.status, status, "stall {stall:?}: {v:#?}");
    }
}

#[test]
fn each_rule_can_be_broken() {
    type Tweak = fn(&mut World);
    let cases: [(&str, Tweak, &str, serde_json::Value); 3] = [
        (
            "never rescued",
            |w| {
                w.ledger.remove(1);
            },
            "no_progress",
            json!("none"),
        ),
        (
            "rescued late",
            |w| next_attempt(w, 2_600, 8),
            "no_progress",
            json!(2_600.0),
        ),
        (
            "zombie",
            |w| {
                zombie(w, 2_300);
            },
            "zombie_duplicate",
            json!(null),
        ),
    ];
    for (case, tweak, rule, next) in cases {
        let mut w = kill_rescued();
        tweak(&mut w);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated, "{case}: {v:#?}");
        assert_eq!(crate::check::testkit::rules(&v), [rule], "{case}");
        let c = &v.counterexamples[0];
        if rule == "no_progress" {
            assert_eq!(
                (c["recipient"].as_str(), c["pid"].as_u64()),
                (Some("r1"), Some(7)),
                "{case}"
            );
            assert_eq!(c["next_ms"], next, "{case}");
            assert_eq!(c["deadline_ms"], 2_500.0, "{case}");
            assert_eq!(c["last_attempt"]["at_ms"], 990.0, "{case}");
        } else {
            assert_eq!(c["recipient"], "r5");
            assert_eq!(c["first_accept"]["pid"], 10);
            assert_eq!(c["zombie_accept"]["pid"], 8);
        }
    }
}

/// 8 is frozen from 2200 to 2600; worker 10 delivers r5 (arriving at `other_at` ms); 8 wakes
/// and sends r5 at 2700 too.
fn zombie(w: &mut World, other_at: u64) {
    w.event(EventKind::Sigstop, Some(8), 2_200);
    w.event(EventKind::Sigcont, Some(8), 2_600);
    let a = addr("r5", Line);
    w.expected.push(Expected {
        address: a.as_str().into(),
        recipient: "r5".into(),
        ..w.expected[0].clone()
    });
    w.send(Line, &a, Accepted, other_at).pid(10);
    w.send(Line, &a, Accepted, 2_700).pid(8);
}

#[test]
fn a_send_under_a_claim_made_after_the_wake_up_is_no_zombie() {
    // (case, other's accept at, r5's recorded transitions, zombie?)
    type Steps = &'static [(&'static str, &'static str, u64)];
    let cases: [(&str, u64, Steps, bool); 5] = [
        ("no status: a zombie", 2_300, &[], true),
        (
            "claimed by 8 after waking and after the accept",
            2_300,
            &[
                ("sending", "worker", 2_290),
                ("delivered", "worker", 2_306),
                ("sending", "worker", 2_650),
            ],
            false,
        ),
        (
            "the only claim is 10's, before the wake-up",
            2_300,
            &[("sending", "worker", 2_290), ("delivered", "worker", 2_306)],
            true,
        ),
        (
            "a claim after waking but before the accept is 10's",
            2_650,
            &[("sending", "worker", 2_640), ("delivered", "worker", 2_656)],
            true,
        ),
        // Delivered before 8 froze: 8 cannot have lost a lease to it during the stop; a
        // duplicate is `exactly_once`'s to name.
        ("accepted before the stop", 2_000, &[], false),
    ];
    for (case, other_at, steps, flagged) in cases {
        let mut w = kill_rescued();
        zombie(&mut w, other_at);
        if !steps.is_empty() {
            w.timed_row("r5", Line, steps);
        }
        let v = check(&w.input());
        assert_eq!(
            v.figures["zombie_duplicates"],
            u64::from(flagged),
            "{case}: {v:#?}"
        );
        let fresh = u64::from(!flagged && !steps.is_empty());
        assert_eq!(v.figures["fresh_claims_after_wake"], fresh, "{case}");
    }
}

/// A send that reaches the provider 10 ms after its frozen sender's SIGCONT was under way when it
/// froze: no zombie (and `exactly_once` explains the duplicate). 100 ms after, it is one.
#[test]
fn a_send_resumed_mid_write_is_no_zombie() {
    for (at, zombie) in [(2_610u64, false), (2_700, true)] {
        let mut w = kill_rescued();
        w.event(EventKind::Sigstop, Some(8), 2_200);
        w.event(EventKind::Sigcont, Some(8), 2_600);
        let a = w.expect("r5", Line);
        w.send(Line, &a, Accepted, 2_300).pid(10);
        w.send(Line, &a, Accepted, at).pid(8);
        let v = check(&w.input());
        assert_eq!(
            v.figures["zombie_duplicates"],
            u64::from(zombie),
            "{at}: {v:#?}"
        );
        assert_eq!(
            v.figures["sends_resumed_mid_send"],
            u64::from(!zombie),
            "{at}"
        );
        let once = crate::check::exactly_once::check(&w.input());
        assert_eq!(once.status == Status::Violated, zombie, "{at}: {once:#?}");
        assert_eq!(
            once.figures["duplicates_resumed_mid_send"],
            u64::from(!zombie),
            "{at}"
        );
    }
}

/// Only the first send after a SIGCONT can have been under way: a woken process that sends a
/// burst without re-checking its lease (the `zombie-send` flaw sends 17 within 25 ms) has every
/// later one judged. And a resumed send that came *first*, followed by another worker's, leaves
/// that other worker's send a plain duplicate.
#[test]
fn only_the_first_send_after_a_wake_up_is_under_way() {
    let mut w = kill_rescued();
    w.event(EventKind::Sigstop, Some(8), 2_200);
    w.event(EventKind::Sigcont, Some(8), 2_600);
    for (r, at) in [("r5", 2_605u64), ("r6", 2_612)] {
        let a = w.expect(r, Line);
        w.send(Line, &a, Accepted, 2_300).pid(10);
        w.send(Line, &a, Accepted, at).pid(8);
    }
    let v = check(&w.input());
    assert_eq!(v.figures["sends_resumed_mid_send"], 1, "{v:#?}");
    assert_eq!(v.figures["zombie_duplicates"], 1, "{v:#?}");
    assert_eq!(v.counterexamples[0]["address"], addr("r6", Line));
    let once = crate::check::exactly_once::check(&w.input());
    assert_eq!(once.figures["duplicates_resumed_mid_send"], 1, "{once:#?}");
    assert_eq!(once.figures["duplicated_deliveries"], 1, "{once:#?}");

    // The resumed send first, another worker's after it: that one is the duplicate.
    let mut w = kill_rescued();
    w.event(EventKind::Sigstop, Some(8), 2_200);
    w.event(EventKind::Sigcont, Some(8), 2_600);
    let a = w.expect("r5", Sms);
    w.send(Sms, &a, Accepted, 2_605).pid(8);
    w.send(Sms, &a, Accepted, 2_700).pid(10);
    let once = crate::check::exactly_once::check(&w.input());
    assert_eq!(once.status, Status::Violated, "{once:#?}");
    assert_eq!(once.figures["duplicates_resumed_mid_send"], 0);
}

/// 7 is killed at 1000 ms just after its transient answer for r6 (sent at 950, answered 955);
/// the next attempt comes at 9000 ms, far past the deadline of 2500 ms, behind a backlog.
fn late_retry(w: &mut World) -> String {
    let a = w.expect("r6", Sms);
    w.send(Sms, &a, Transient, 950).pid(7);
    w.send(Sms, &a, Accepted, 9_000).pid(8);
    a
}

#[test]
fn a_release_recorded_after_the_answer_counts_even_before_the_kill() {
    // (case, r6's recorded transitions, holds?)
    type Steps = &'static [(&'static str, &'static str, u64)];
    let cases: [(&str, Steps, bool); 5] = [
        (
            "released by 7 itself 5 ms before the kill",
            &[("sending", "worker", 940), ("retryable", "worker", 995)],
            true,
        ),
        (
            "released by the rescuer in time",
            &[("sending", "worker", 940), ("retryable", "rescuer", 2_400)],
            true,
        ),
        (
            "released only after the deadline",
            &[("sending", "worker", 940), ("retryable", "rescuer", 2_600)],
            false,
        ),
        // No release on record (the stack's clock, or a record it does not keep): judged by the
        // ledger alone, as a stack without a status API, and the backlog excuses the wait.
        ("no release on record", &[("sending", "worker", 940)], true),
        // A release stamped nine centuries on (a stack's clock or format gone wrong) is no time
        // on the ledger clock: as if not on record (its nanoseconds used to overflow).
        (
            "a release stamped centuries away",
            &[
                ("sending", "worker", 940),
                ("retryable", "rescuer", 30_000_000_000_000),
            ],
            true,
        ),
    ];
    for (case, steps, holds) in cases {
        let mut w = kill_rescued();
        late_retry(&mut w);
        w.timed_row("r6", Sms, steps);
        // A backlog of first attempts does not excuse a release the stack's records show late.
        backlog(&mut w, 2_500, 9_000, 400);
        let v = check(&w.input());
        let want = if holds {
            Status::Holds
        } else {
            Status::Violated
        };
        assert_eq!(v.status, want, "{case}: {v:#?}");
        if holds {
            assert_eq!(v.figures["deliveries_at_risk"], 2, "{case}");
        } else {
            assert_eq!(v.counterexamples[0]["recipient"], "r6", "{case}");
        }
    }
    let mut w = kill_rescued();
    late_retry(&mut w);
    w.timed_row("r6", Sms, cases[0].1);
    let v = check(&w.input());
    assert_eq!(v.figures["released_before_kill"], 1);
    // The honest figure: from the release at 995 ms to the attempt at 9000 ms.
    assert_eq!(v.figures["slowest_wait_after_release_ms"], 8_005.0);
    assert_eq!(v.figures["slowest_recovery_ms"], 1_100.0);
}

/// The wall clock jumped 8 s forward at 970 ms (a guest paused and resumed): 7 recorded its
/// transient answer for r6 at 995 ms by the ledger clock, 8,995 ms by its own, and every entry
/// after the jump is stamped 8 s on. Placed by the ledger's own stamps and the jump, that release
/// came before the kill; placed by one offset from the run's start, as before, it came 8 s after
/// it, past the deadline, and a correct stack was failed `no_progress` (restart-midway at 20,000
/// recipients on a guest that was paused mid-run).
#[test]
fn a_release_stamped_after_a_clock_jump_is_placed_by_the_jump() {
    let mut w = kill_rescued();
    late_retry(&mut w);
    w.timed_row(
        "r6",
        Sms,
        &[("sending", "worker", 940), ("retryable", "worker", 8_995)],
    );
    backlog(&mut w, 2_500, 9_000, 400);
    for k in 0..w.entries().len() {
        let e = w.entry_mut(k);
        if e.mono_ns > ns(970) {
            e.wall = wall(e.mono_ns / 1_000_000 + 8_000);
        }
    }
    w.clock_jump(970, 8_000);
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert_eq!(v.figures["released_before_kill"], 1);
    assert_eq!(v.figures["slowest_wait_after_release_ms"], 8_005.0);
}

/// First attempts of other deliveries every `every` ms from `from` to `to`.
fn backlog(w: &mut World, from: u64, to: u64, every: u64) {
    for (i, at) in (from..=to).step_by(every as usize).enumerate() {
        let a = w.expect(&format!("q{i}"), Email);
        w.send(Email, &a, Accepted, at).pid(8);
    }
}

#[test]
fn without_recorded_transitions_a_backlog_excuses_a_late_next_attempt() {
    // (first attempt every ms, holds?): the slack is 500 ms.
    for (every, holds) in [(400, true), (700, false)] {
        let mut w = kill_rescued();
        late_retry(&mut w);
        backlog(&mut w, 2_500, 9_000, every);
        let v = check(&w.input());
        let want = if holds {
            Status::Holds
        } else {
            Status::Violated
        };
        assert_eq!(v.status, want, "every {every} ms: {v:#?}");
        assert_eq!(v.figures["behind_backlog"], u64::from(holds));
    }
}

#[test]
fn not_checked_without_kill_or_stop() {
    let mut w = kill_rescued();
    w.timeline.clear();
    w.event(EventKind::Sigterm, Some(7), 1_000);
    assert_eq!(check(&w.input()).status, Status::NotChecked);
}

#[test]
fn a_kill_that_caught_nothing_in_flight_is_insufficient() {
    // Worker 7 is killed at 1000 ms after its only send was accepted: recovery was never tested.
    let mut w = kill_rescued();
    w.ledger.retain(|e| e.recipient != addr("r1", Line));
    let v = check(&w.input());
    assert_eq!(v.status, Status::Insufficient, "{v:#?}");
    assert!(v.summary.contains("no_progress judged 0"), "{}", v.summary);
    // Nor when that send was accepted an instant before the kill and the victim had recorded
    // it: only an answer still on its way is caught.
    let r7 = w.expect("r7", Sms);
    w.send(Sms, &r7, Accepted, 990).pid(7).latency(5);
    w.timed_row(
        "r7",
        Sms,
        &[("sending", "worker", 985), ("submitted", "worker", 997)],
    );
    let v = check(&w.input());
    assert_eq!(v.status, Status::Insufficient, "{v:#?}");
    assert_eq!(v.figures["answers_caught_in_flight"], 0, "{v:#?}");
    // No kill or stop at all: not applicable, not insufficient.
    let mut w = kill_rescued();
    w.timeline.clear();
    assert_eq!(check(&w.input()).status, Status::NotChecked);
}

#[test]
fn unattributed_sends_that_could_hide_a_violation_are_insufficient() {
    // In flight at the kill with no known sender, and next tried only at 4000 ms (deadline
    // 2500): it may have been the victim's, so "recovered in time" cannot be claimed.
    let mut w = kill_rescued();
    let c = w.expect("r3", Email);
    w.send(Email, &c, Transient, 995).unattributed().latency(50);
    w.send(Email, &c, Accepted, 4_000).pid(8);
    let v = check(&w.input());
    assert_eq!(v.status, Status::Insufficient, "{v:#?}");
    assert!(v.summary.contains("no known sender pid"), "{}", v.summary);
    // Recovered in time: whoever sent it, nothing is hidden.
    let mut w = kill_rescued();
    let c = w.expect("r3", Email);
    w.send(Email, &c, Transient, 995).unattributed().latency(50);
    w.send(Email, &c, Accepted, 1_200).pid(8);
    assert_eq!(check(&w.input()).status, Status::Holds);
    // A repeated acceptance after the kill with no known sender may have been a zombie's.
    let mut w = kill_rescued();
    w.send(Sms, &addr("r2", Sms), Accepted, 1_500)
        .unattributed();
    let v = check(&w.input());
    assert_eq!(v.status, Status::Insufficient, "{v:#?}");
    assert_eq!(
        v.judged["zombie_duplicate"]
            .unjudged
            .as_ref()
            .unwrap()
            .count,
        1
    );
}

/// The crash window: the victim's own send was accepted 2 ms before the kill, its answer still
/// on the way. Final for the provider, but the row is still the victim's in the stack: judged by
/// the stack's recorded release (a stack that holds such rows only, one send at a time, used to
/// leave `recovery` with nothing judged). Without timed transitions, or when another worker's
/// send settled it, it is not judged.
#[test]
fn an_answer_caught_in_flight_is_judged_by_the_row_s_release() {
    // (case, the accepted send's pid, r9's recorded transitions, judged, holds)
    type Steps = &'static [(&'static str, &'static str, u64)];
    let cases: [(&str, u32, Steps, u64, bool); 6] = [
        (
            "released by the rescuer in time",
            7,
            &[("sending", "worker", 985), ("submitted", "rescuer", 2_400)],
            1,
            true,
        ),
        (
            "released after the deadline",
            7,
            &[("sending", "worker", 985), ("submitted", "rescuer", 2_600)],
            1,
            false,
        ),
        ("never released", 7, &[("sending", "worker", 985)], 1, false),
        ("no status row", 7, &[], 0, true),
        // The victim recorded the answer itself 2 ms before the kill: nothing was caught.
        (
            "released by the victim before the kill",
            7,
            &[("sending", "worker", 985), ("submitted", "worker", 998)],
            0,
            true,
        ),
        (
            "another worker's send",
            8,
            &[("sending", "worker", 985)],
            0,
            true,
        ),
    ];
    for (case, pid, steps, judged, holds) in cases {
        let mut w = kill_rescued();
        let r9 = w.expect("r9", Sms);
        w.send(Sms, &r9, Accepted, 990).pid(pid).latency(8);
        if !steps.is_empty() {
            w.timed_row("r9", Sms, steps);
        }
        let v = check(&w.input());
        assert_eq!(
            v.figures["answers_caught_in_flight"], judged,
            "{case}: {v:#?}"
        );
        assert_eq!(v.figures["deliveries_at_risk"], 1 + judged, "{case}");
        if holds {
            assert_eq!(v.status, Status::Holds, "{case}: {v:#?}");
        } else {
            assert_eq!(v.status, Status::Violated, "{case}: {v:#?}");
            let c = &v.counterexamples[0];
            assert_eq!(c["rule"], "no_progress", "{case}");
            assert_eq!(c["answer_caught_in_flight"]["pid"], 7, "{case}: {c:#}");
        }
    }
    // No release on record, but a retry under its key by the other worker in time: progress.
    let mut w = kill_rescued();
    let r9 = w.expect("r9", Line);
    w.send(Line, &r9, Accepted, 990).pid(7).latency(8);
    w.send(Line, &r9, Accepted, 2_200).pid(8).status("409");
    w.timed_row("r9", Line, &[("sending", "worker", 985)]);
    let v = check(&w.input());
    assert_eq!(v.figures["answers_caught_in_flight"], 1, "{v:#?}");
    assert_eq!(v.status, Status::Holds, "{v:#?}");
}

/// Worker 7 was the only LINE sender and is killed for good; worker 8 sends SMS only and never
/// releases r1. Not recovered, but nothing was left that serves LINE: not judged (`no_loss`
/// leaves r1 open and the run INCONCLUSIVE). With worker 8 having sent LINE too, it is
/// `no_progress` as before.
#[test]
fn unrecovered_on_a_channel_the_chaos_left_without_a_sender_is_not_judged() {
    let orphaned = || {
        let mut w = World::new();
        w.worker(7, 0, Some(1_000)).signal = Some(9);
        w.worker(8, 0, None);
        w.event(EventKind::Sigkill, Some(7), 1_000);
        let a = w.expect("r1", Line);
        w.send(Line, &a, Transient, 990).pid(7).latency(110); // in flight at T, never retried
        let c = w.expect("r3", Sms);
        w.send(Sms, &c, Accepted, 2_000).pid(8);
        w.quiescence.reached = false;
        w.quiescence.at_ns = ns(10_000);
        w
    };
    let v = check(&orphaned().input());
    assert_eq!(v.status, Status::Insufficient, "{v:#?}");
    assert_eq!(v.figures["orphaned"], 1);
    assert_eq!(v.figures["deliveries_at_risk"], 0);
    assert!(v.summary.contains("without a sender"), "{}", v.summary);

    let mut w = orphaned();
    let d = w.expect("r4", Line);
    w.send(Line, &d, Accepted, 3_000).pid(8);
    let v = check(&w.input());
    assert_eq!(v.status, Status::Violated, "{v:#?}");
    assert_eq!(v.figures["orphaned"], 0);
}
