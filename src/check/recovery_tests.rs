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
    w.event("sigkill", Some(7), 1_000);
    let a = w.expect("r1", Line);
    w.send(Line, &a, Transient, 990).pid(7).latency(110); // in flight at T
    w.send(Line, &a, Accepted, 2_100).pid(8);
    let b = w.expect("r2", Sms);
    w.send(Sms, &b, Accepted, 500).pid(7); // final before T: nothing to recover
    w
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
    w.event("sigstop", Some(8), 3_000);
    w.event("sigcont", Some(8), 3_300);
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
        let mut w = kill_rescued();
        w.processes.remove(1);
        w.worker(9, 5_000, None);
        w.ledger[1].received_ns = ns(next);
        w.ledger[1].mono_ns = ns(next + 5);
        w.pids.insert(1, 9);
        let v = check(&w.input());
        assert_eq!(v.status, status, "next at {next}: {v:#?}");
        if status == Status::Violated {
            assert_eq!(v.counterexamples[0]["workers_able_from_ms"], 5_000.0);
        }
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
            |w| {
                w.ledger[1].received_ns = ns(2_600);
                w.ledger[1].mono_ns = ns(2_605);
            },
            "no_progress",
            json!(2_600.0),
        ),
        (
            "zombie",
            |w| {
                // 8 is frozen from 2200 to 2600 while worker 10 delivers r5; 8 wakes and sends too.
                w.event("sigstop", Some(8), 2_200);
                w.event("sigcont", Some(8), 2_600);
                let a = addr("r5", Line);
                w.expected.push(Expected {
                    address: a.clone(),
                    recipient: "r5".into(),
                    ..w.expected[0].clone()
                });
                w.send(Line, &a, Accepted, 2_000).pid(10);
                w.send(Line, &a, Accepted, 2_700).pid(8);
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

#[test]
fn not_checked_without_kill_or_stop() {
    let mut w = kill_rescued();
    w.timeline.clear();
    w.event("sigterm", Some(7), 1_000);
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
