//! Tests of the `retry_discipline` checker, kept apart so the checker reads in one sitting.

use mock_providers::ledger::Outcome::*;

use super::*;
use crate::check::testkit::*;
use crate::check::Status;
use crate::scenario::Channel::*;

// Base scenario: min_retry_gap 80ms, factor 2, max 1s, jitter 0.2 (cap 800ms), 4 attempts.
// Floors after failures 1..: 80, 160, 320, 640, 800, 800 ms.

#[test]
fn floor_grows_then_caps() {
    let mut w = World::new();
    let floors: Vec<u128> = (1..=6).map(|k| floor(&w.input(), k).as_millis()).collect();
    assert_eq!(floors, [80, 160, 320, 640, 800, 800]);
    w.scenario.expect.retry_growth = false;
    assert_eq!(floor(&w.input(), 5).as_millis(), 80);
}

/// Attempts at `starts` (ms), each answered 5 ms later, failing until the last one.
fn delivery(w: &mut World, starts: &[u64], last: Outcome) {
    let a = w.expect("r1", Sms);
    for (i, &t) in starts.iter().enumerate() {
        let o = if i + 1 == starts.len() {
            last
        } else {
            Transient
        };
        w.send(Sms, &a, o, t);
    }
}

#[test]
fn jittered_exponential_backoff_holds() {
    let mut w = World::new();
    // Nominal gaps 100, 200, 400 ms with -20% jitter: 80, 160, 320 after each answer.
    delivery(&mut w, &[0, 85, 250, 575], Accepted);
    // A duplicate after acceptance is not a retry.
    w.send(Sms, &addr("r1", Sms), Accepted, 576);
    // A capped schedule: 800 ms gaps forever (max_attempts raised).
    w.scenario.expect.max_attempts = 8;
    let b = w.expect("r2", Line);
    for (i, t) in [0u64, 100, 300, 700, 1_500, 2_305, 3_110]
        .into_iter()
        .enumerate()
    {
        w.send(Line, &b, if i == 6 { Permanent } else { Transient }, t);
    }
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert_eq!(v.figures["retries_checked"], 9);
}

/// A 429 whose sender was killed while it was in flight never reached the stack: the rescued
/// retry 800 ms later ignores no Retry-After it could have read. The same gap from a sender
/// that lived is still flagged.
#[test]
fn a_failure_the_stack_never_heard_sets_no_gap() {
    let build = |killed: bool| {
        let mut w = World::new();
        let a = w.expect("r1", Line);
        w.send(Line, &a, Transient, 1_000)
            .status("429")
            .retry_after(1_000)
            .pid(7);
        w.send(Line, &a, Accepted, 1_800).pid(8);
        if killed {
            w.event(EventKind::Sigkill, Some(7), 1_002);
        }
        check(&w.input())
    };
    // (It was the only retry: judged nothing, so insufficient, never violated.)
    let v = build(true);
    assert_eq!(v.status, Status::Insufficient, "{v:#?}");
    assert_eq!(v.figures["retries_after_unheard_failures"], 1);
    assert_eq!(
        crate::check::testkit::rules(&build(false)),
        ["retry_after_ignored"]
    );
}

#[test]
fn gaps_timed_from_the_attempt_start_and_429s_not_counted_hold() {
    // A slow answer (90 ms) and a stack timing its gap from the attempt's start: 100 ms after
    // the 5xx's start is 10 ms after its answer. Then a 429 (not an attempt), a
    // 500, and a gap at the second step (160 ms floor), not the third.
    let mut w = World::new();
    let a = w.expect("r1", Sms);
    w.send(Sms, &a, Transient, 0).latency(90);
    w.send(Sms, &a, Transient, 100).status("429");
    w.send(Sms, &a, Transient, 1_200);
    w.send(Sms, &a, Accepted, 1_370);
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    // The same chain with the 429 counted would need 320 ms before the last attempt.
    let mut w = World::new();
    let a = w.expect("r1", Sms);
    w.send(Sms, &a, Transient, 0);
    w.send(Sms, &a, Transient, 100);
    w.send(Sms, &a, Transient, 1_200);
    w.send(Sms, &a, Accepted, 1_370);
    assert_eq!(
        crate::check::testkit::rules(&check(&w.input())),
        ["gap_below_floor"]
    );
    // Timing from the start never hides a retry sent before the failure was answered.
    let mut w = World::new();
    let a = w.expect("r1", Sms);
    w.send(Sms, &a, Transient, 0).latency(2_000);
    w.send(Sms, &a, Accepted, 500);
    assert_eq!(
        crate::check::testkit::rules(&check(&w.input())),
        ["gap_below_floor"]
    );
}

#[test]
fn one_attempt_after_a_lost_permanent_answer_is_reconciliation() {
    // (killed at ms, expected status): the answer at 100 ms went to a worker killed at 150 ms.
    for (kill_at, status) in [(150, Status::Holds), (5_000, Status::Violated)] {
        let mut w = World::new();
        let a = w.expect("r1", Sms);
        w.send(Sms, &a, Permanent, 100).pid(7);
        w.send(Sms, &a, Permanent, 2_000).pid(8);
        w.event(EventKind::Sigkill, Some(7), kill_at);
        let v = check(&w.input());
        assert_eq!(v.status, status, "kill at {kill_at}: {v:#?}");
    }
}

/// The wall clock jumped forward while a stack waited out a Retry-After: to the stack the full
/// second passed, 811 ms of it on the ledger clock and the rest in the jump (a guest paused and
/// resumed). Credited; the same gap with the jump elsewhere, too small, or backward is not.
#[test]
fn a_forward_clock_jump_inside_a_gap_counts_as_waited() {
    let build = |jump: Option<(u64, i64)>| {
        let mut w = World::new();
        let a = w.expect("r1", Line);
        w.send(Line, &a, Transient, 1_000)
            .status("503")
            .retry_after(1_000);
        w.send(Line, &a, Accepted, 1_811);
        if let Some((at, by)) = jump {
            w.clock_jump(at, by);
        }
        check(&w.input())
    };
    let v = build(Some((1_400, 424)));
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert_eq!(v.figures["retries_checked"], 1);
    for (case, jump) in [
        ("no jump", None),
        ("a jump before the failed attempt", Some((900, 424))),
        ("a jump too small", Some((1_400, 150))),
        ("a backward jump", Some((1_400, -424))),
    ] {
        let v = build(jump);
        assert_eq!(rules(&v), ["retry_after_ignored"], "{case}: {v:#?}");
    }
    let v = build(Some((1_400, 150)));
    assert_eq!(v.counterexamples[0]["clock_jumped_ms"], 150.0, "{v:#?}");
}

#[test]
fn each_rule_can_be_broken() {
    // (case, attempt start times, last outcome, tweak, rules expected)
    type Tweak = fn(&mut World);
    let none: Tweak = |_| {};
    type Case<'a> = (&'a str, &'a [u64], Outcome, Tweak, &'a [&'a str]);
    let cases: [Case; 6] = [
        (
            "retry storm",
            &[0, 10, 20],
            Accepted,
            none,
            &["gap_below_floor", "gap_below_floor"],
        ),
        // Gaps 80, 80, 80: fine once, then under 160 and 320.
        (
            "no growth",
            &[0, 85, 170, 255],
            Accepted,
            none,
            &["gap_below_floor", "gap_below_floor"],
        ),
        (
            "too many",
            &[0, 100, 300, 700, 1_400],
            Transient,
            none,
            &["too_many_attempts"],
        ),
        ("concurrent", &[0, 2], Accepted, none, &["gap_below_floor"]),
        (
            "retry-after",
            &[0, 200],
            Accepted,
            |w| w.entry_mut(0).retry_after_ms = Some(1_000),
            &["retry_after_ignored"],
        ),
        (
            "after permanent",
            &[0, 100],
            Permanent,
            |w| {
                let a = addr("r1", Sms);
                w.send(Sms, &a, Permanent, 1_000);
            },
            &["attempt_after_permanent"],
        ),
    ];
    for (case, starts, last, tweak, want) in cases {
        let mut w = World::new();
        delivery(&mut w, starts, last);
        tweak(&mut w);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated, "{case}: {v:#?}");
        assert_eq!(rules(&v), want, "{case}: {v:#?}");
    }
}

/// r1 fails at 0 ms (answered at 5) and is retried at `retry_at` ms; the cap is 1.2 s
/// (max 1 s + 20% jitter) and the slack 2 s, so the retry is due by 3205 ms.
fn capped(retry_at: u64) -> World {
    let mut w = World::new();
    w.worker(7, 0, None);
    w.worker(8, 0, None);
    let a = w.expect("r1", Line);
    w.send(Line, &a, Transient, 0).pid(7);
    w.send(Line, &a, Accepted, retry_at).pid(8);
    w
}

#[test]
fn a_retry_later_than_the_cap_is_flagged_unless_it_could_not_be_made() {
    type Tweak = fn(&mut World);
    let none: Tweak = |_| {};
    // (case, retry at ms, tweak, flagged?)
    let cases: [(&str, u64, Tweak, bool); 15] = [
        ("at the cap plus slack", 3_205, none, false),
        ("past it", 3_300, none, true),
        (
            "a Retry-After of 5 s",
            7_000,
            |w| w.entry_mut(0).retry_after_ms = Some(5_000),
            false,
        ),
        (
            "no worker alive for 2 s",
            5_000,
            |w| {
                w.processes.clear();
                w.worker(7, 0, Some(1_000));
                w.worker(8, 3_000, None);
            },
            false,
        ),
        (
            "the database restarting for 2 s",
            5_000,
            |w| {
                w.event(EventKind::DbRestart, None, 1_000);
                w.event(EventKind::DbRestarted, None, 3_000);
            },
            false,
        ),
        (
            "the failed attempt's sender was killed",
            9_000,
            |w| w.event(EventKind::Sigkill, Some(7), 500),
            false,
        ),
        (
            "waiting behind first attempts",
            9_000,
            |w| {
                for i in 0..12 {
                    let a = w.expect(&format!("q{i}"), Email);
                    w.send(Email, &a, Accepted, 1_000 + i * 700).pid(8);
                }
            },
            false,
        ),
        (
            "first attempts that pause longer than the slack",
            9_000,
            |w| {
                for i in 0..3 {
                    let a = w.expect(&format!("q{i}"), Email);
                    w.send(Email, &a, Accepted, 1_000 + i * 700).pid(8);
                }
            },
            true,
        ),
        (
            "last of a drained backlog of overdue retries due earlier",
            9_000,
            |w| {
                // q0..q11 failed at 0 ms like r1 (due by 1205 ms, before r1's 1210 ms), and
                // were retried late behind first attempts until 2000 ms, then one by one.
                let first: Vec<String> = (0..3).map(|i| w.expect(&format!("f{i}"), Sms)).collect();
                for (i, a) in first.iter().enumerate() {
                    w.send(Sms, a, Accepted, 1_000 + i as u64 * 500).pid(8);
                }
                for i in 0..12u64 {
                    let a = w.expect(&format!("q{i}"), Email);
                    w.send(Email, &a, Transient, 0).pid(8);
                    w.send(Email, &a, Accepted, 3_000 + i * 500).pid(8);
                }
            },
            false,
        ),
        (
            "behind retries that fell due after it",
            9_000,
            |w| {
                let a = w.expect("q0", Email);
                w.send(Email, &a, Transient, 0).pid(8);
                for i in 1..12 {
                    w.send(Email, &a, Transient, i * 700).pid(8);
                }
            },
            true,
        ),
        (
            "the machine stalled for 2 s",
            5_000,
            |w| {
                w.stalls = vec![crate::stalls::Stall {
                    from_ns: ns(1_000),
                    to_ns: ns(3_000),
                }]
            },
            false,
        ),
        (
            "the machine stalled for 1 s: not enough",
            5_000,
            |w| {
                w.stalls = vec![crate::stalls::Stall {
                    from_ns: ns(1_000),
                    to_ns: ns(2_000),
                }]
            },
            true,
        ),
        (
            "LINE out until it let go of its last held request at 4 s",
            5_000,
            |w| {
                w.provider_event(
                    EventKind::ProviderOutage,
                    mock_providers::ledger::Provider::Line,
                    None,
                    100,
                );
                w.provider_event(
                    EventKind::ProviderOutageEnd,
                    mock_providers::ledger::Provider::Line,
                    None,
                    2_000,
                );
                let a = w.expect("h1", Line);
                w.send(Line, &a, Transient, 1_000)
                    .latency(3_000)
                    .fault("outage_hang")
                    .hung_up();
            },
            false,
        ),
        (
            "requests a hung SMS provider held until 4 s fill the shared slots",
            5_000,
            |w| {
                w.provider_event(
                    EventKind::ProviderOutage,
                    mock_providers::ledger::Provider::Sms,
                    None,
                    100,
                );
                w.provider_event(
                    EventKind::ProviderOutageEnd,
                    mock_providers::ledger::Provider::Sms,
                    None,
                    2_000,
                );
                let a = w.expect("h1", Sms);
                w.send(Sms, &a, Transient, 1_000)
                    .latency(3_000)
                    .fault("outage_hang")
                    .hung_up();
            },
            false,
        ),
        (
            "an SMS outage answering 503 excuses nothing on LINE",
            5_000,
            |w| {
                w.provider_event(
                    EventKind::ProviderOutage,
                    mock_providers::ledger::Provider::Sms,
                    None,
                    100,
                );
                w.provider_event(
                    EventKind::ProviderOutageEnd,
                    mock_providers::ledger::Provider::Sms,
                    None,
                    4_000,
                );
                let a = w.expect("h1", Sms);
                w.send(Sms, &a, Transient, 1_000).fault("outage_503");
            },
            true,
        ),
    ];
    for (case, retry_at, tweak, flagged) in cases {
        let mut w = capped(retry_at);
        tweak(&mut w);
        let v = check(&w.input());
        let cap: Vec<_> = v
            .counterexamples
            .iter()
            .filter(|c| c["rule"] == "gap_above_cap" && c["recipient"] == "r1")
            .collect();
        assert_eq!(cap.len(), usize::from(flagged), "{case}: {v:#?}");
        if flagged {
            assert_eq!(cap[0]["allowed_ms"], 3_200.0, "{case}");
            assert_eq!(cap[0]["gap_ms"], (retry_at - 5) as f64, "{case}");
        }
    }
    let mut w = capped(9_000);
    (cases[6].2)(&mut w);
    assert_eq!(check(&w.input()).figures["late_behind_backlog"], 1);
}

/// The only worker stops at 500 ms and its replacement starts at 4500 ms. r1 and q0..q7 failed
/// at 0 ms (due by 1200 ms, 3200 ms allowed with the slack); the replacement works through
/// them one by one from 4600 ms, r1 last at 7800 ms. Less the 4000 ms without a worker, the
/// later ones are still past the allowance, but the stack has been busy with that backlog since
/// it could act again: waiting its turn, not a late retry.
#[test]
fn a_backlog_built_while_no_worker_could_act_drains_from_when_one_could() {
    let mut w = World::new();
    w.worker(7, 0, Some(500));
    w.worker(8, 4_500, None);
    let r1 = w.expect("r1", Line);
    w.send(Line, &r1, Transient, 0).pid(7);
    let qs: Vec<String> = (0..8).map(|i| w.expect(&format!("q{i}"), Line)).collect();
    for q in &qs {
        w.send(Line, q, Transient, 0).pid(7);
    }
    for (i, q) in qs.iter().enumerate() {
        w.send(Line, q, Accepted, 4_600 + 400 * i as u64).pid(8);
    }
    w.send(Line, &r1, Accepted, 7_800).pid(8);
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert_eq!(v.figures["late_behind_backlog"], 2, "q7 and r1");
}

#[test]
fn attempts_are_what_the_provider_saw_less_rate_limits() {
    // Limit 4. (case, outcomes in order, tweak, flagged?)
    type Tweak = fn(&mut World);
    let none: Tweak = |_| {};
    let cases: [(&str, &[Outcome], Tweak, bool); 5] = [
        ("four, exhausted", &[Transient; 4], none, false),
        ("a fifth", &[Transient; 5], none, true),
        (
            "a fifth after a 429",
            &[Transient; 5],
            |w| w.entry_mut(1).status = "429".into(),
            false,
        ),
        (
            "a fifth after the fourth's answer was lost",
            &[Transient, Transient, Transient, Transient, Accepted],
            |w| w.event(EventKind::Sigkill, Some(100), 1_600),
            false,
        ),
        (
            "a LINE 409 after the fourth is a repeat",
            &[Transient, Transient, Transient, Accepted, IdempotentRepeat],
            none,
            false,
        ),
    ];
    for (case, outcomes, tweak, flagged) in cases {
        let mut w = World::new();
        let a = w.expect("r1", Line);
        for (i, o) in outcomes.iter().enumerate() {
            w.send(Line, &a, *o, [0, 100, 300, 700, 1_500][i]);
        }
        tweak(&mut w);
        let v = check(&w.input());
        let many = rules(&v)
            .iter()
            .filter(|r| *r == "too_many_attempts")
            .count();
        assert_eq!(many, usize::from(flagged), "{case}: {v:#?}");
    }
    let mut w = World::new();
    delivery(&mut w, &[0, 100, 300, 700], Transient);
    assert_eq!(check(&w.input()).figures["deliveries_at_limit"], 1);
}

#[test]
fn growth_check_can_be_switched_off() {
    let mut w = World::new();
    w.scenario.expect.retry_growth = false;
    delivery(&mut w, &[0, 85, 170, 255], Accepted);
    assert_eq!(check(&w.input()).status, Status::Holds);
}

#[test]
fn counterexample_names_the_pair_gap_and_floor() {
    let mut w = World::new();
    delivery(&mut w, &[0, 85, 170], Accepted);
    let v = check(&w.input());
    let c = &v.counterexamples[0];
    assert_eq!(c["recipient"], "r1");
    assert_eq!(c["earlier"]["at_ms"], 85.0);
    assert_eq!(c["later"]["at_ms"], 170.0);
    assert_eq!(c["gap_ms"], 80.0);
    assert_eq!(c["floor_ms"], 160.0);
    assert_eq!(c["failure_no"], 2);
}

#[test]
fn a_transient_failure_never_retried_is_insufficient_and_no_failure_is_not_applicable() {
    // One transient answer with attempts to spare, and no retry: spacing was never judged.
    let mut w = World::new();
    delivery(&mut w, &[0], Transient);
    let v = check(&w.input());
    assert_eq!(v.status, Status::Insufficient, "{v:#?}");
    assert!(
        v.summary.contains("gap_below_floor judged 0"),
        "{}",
        v.summary
    );
    // Providers that never failed: there was nothing to space.
    let mut w = World::new();
    delivery(&mut w, &[0], Accepted);
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert_eq!(v.judged["gap_below_floor"].min, 0);
    // The last allowed attempt failing needs no retry either.
    let mut w = World::new();
    w.scenario.expect.max_attempts = 1;
    delivery(&mut w, &[0], Transient);
    assert_eq!(check(&w.input()).status, Status::Holds);
    // Nothing attempted at all.
    let mut w = World::new();
    w.expect("r1", Sms);
    assert_eq!(check(&w.input()).status, Status::Insufficient);
}
