//! Tests of `agreement`: each rule broken on purpose, and a correct stack at each rule's edge
//! (an accept its sender never heard of, a resend after a kill or a database outage, a late
//! failure report) not flagged.

use mock_providers::ledger::CallbackVariant::*;
use mock_providers::ledger::Outcome::*;

use super::*;
use crate::check::testkit::*;
use crate::check::Status;
use crate::scenario::Channel::*;

/// One delivery per kind of proper agreement, all sent by pid 100 and never disturbed.
fn healthy() -> World {
    let mut w = World::new();
    let l = w.expect("r1", Line);
    w.send(Line, &l, Transient, 0);
    w.send(Line, &l, Accepted, 200);
    w.status_row(
        "r1",
        Line,
        None,
        &["sending", "retryable", "sending", "delivered"],
    );
    let e = w.expect("r2", Email);
    w.send(Email, &e, Accepted, 0).message_id("<m2@x>");
    w.callback(Email, &e, "<m2@x>", "bounced", Genuine, Some(200), 900);
    w.status_row(
        "r2",
        Email,
        Some("m2@x"),
        &["sending", "submitted", "permanent_failure@callback"],
    );
    // The provider took the SMS; no final status came before the horizon: `unknown` is honest.
    let s = w.expect("r3", Sms);
    w.send(Sms, &s, Accepted, 0).message_id("SM3");
    w.status_row(
        "r3",
        Sms,
        Some("SM3"),
        &["sending", "submitted", "unknown@poll"],
    );
    // Never accepted and the stack says so.
    let b = w.expect("r4", Line);
    w.send(Line, &b, Permanent, 0);
    w.status_row("r4", Line, None, &["sending", "permanent_failure"]);
    w
}

#[test]
fn agreeing_states_hold() {
    let v = check(&healthy().input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert_eq!(v.figures["states_judged"], 4);
    assert_eq!(v.figures["resends_after_accept"], 0);
}

#[test]
fn each_rule_can_be_broken() {
    type Setup = fn(&mut World);
    // (case, what the broken stack did, the rule)
    let cases: [(&str, Setup, &str); 6] = [
        (
            "line accepted, stack says failed",
            |w| {
                let a = w.expect("r9", Line);
                w.send(Line, &a, Accepted, 0);
                w.status_row(
                    "r9",
                    Line,
                    None,
                    &["sending", "retryable@rescuer", "failed@rescuer"],
                );
            },
            "accepted_but_failed",
        ),
        (
            "e-mail accepted, permanent_failure without any bounce",
            |w| {
                let a = w.expect("r9", Email);
                w.send(Email, &a, Accepted, 0);
                w.status_row("r9", Email, None, &["sending", "permanent_failure"]);
            },
            "accepted_but_failed",
        ),
        (
            "sms never accepted, stack says delivered",
            |w| {
                let a = w.expect("r9", Sms);
                w.send(Sms, &a, Transient, 0);
                w.status_row("r9", Sms, None, &["sending", "delivered"]);
            },
            "never_accepted",
        ),
        (
            "line never sent, stack says submitted",
            |w| {
                w.expect("r9", Line);
                w.status_row("r9", Line, None, &["sending", "submitted"]);
            },
            "never_accepted",
        ),
        (
            "e-mail 250 reached a live sender, stack says unknown",
            |w| {
                let a = w.expect("r9", Email);
                w.send(Email, &a, Accepted, 0);
                w.status_row("r9", Email, None, &["sending", "unknown@rescuer"]);
            },
            "unknown_but_accepted",
        ),
        (
            "line resent with the same key after a 200",
            |w| {
                let a = w.expect("r9", Line);
                w.send(Line, &a, Accepted, 0);
                w.send(Line, &a, IdempotentRepeat, 2_000);
                w.send(Line, &a, IdempotentRepeat, 4_000);
                w.status_row("r9", Line, None, &["sending", "delivered"]);
            },
            "resend_after_accept",
        ),
    ];
    for (case, setup, rule) in cases {
        let mut w = healthy();
        setup(&mut w);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated, "{case}: {v:#?}");
        assert_eq!(rules(&v), [rule], "{case}");
        assert_eq!(v.counterexamples[0]["recipient"], "r9", "{case}");
    }
}

#[test]
fn resends_are_counted_per_send_and_reported_per_delivery() {
    let mut w = healthy();
    let a = w.expect("r9", Line);
    w.send(Line, &a, Accepted, 0);
    for at in [1_500, 3_000, 4_500] {
        w.send(Line, &a, IdempotentRepeat, at);
    }
    w.status_row("r9", Line, None, &["sending", "failed@rescuer"]);
    let v = check(&w.input());
    assert_eq!(v.figures["resends_after_accept"], 3);
    assert_eq!(v.figures["deliveries_resent_after_accept"], 1);
    assert_eq!(v.figures["by_channel"]["line"]["resends_after_accept"], 3);
    let mut got = rules(&v);
    got.sort();
    assert_eq!(got, ["accepted_but_failed", "resend_after_accept"]);
}

#[test]
fn a_correct_stack_at_each_edge_holds() {
    type Setup = fn(&mut World);
    // (case, what a correct stack did and the harness saw)
    let cases: [(&str, Setup); 7] = [
        (
            "sender killed between the provider's commit and its answer (on_accept)",
            |w| {
                let a = w.expect("r9", Line);
                w.send(Line, &a, Accepted, 0).pid(7);
                w.event(EventKind::Sigkill, Some(7), 3);
                w.send(Line, &a, IdempotentRepeat, 2_000);
                w.status_row(
                    "r9",
                    Line,
                    None,
                    &["sending", "retryable@rescuer", "sending", "delivered"],
                );
            },
        ),
        (
            "e-mail 250 never reached a killed sender: held unknown",
            |w| {
                let a = w.expect("r9", Email);
                w.send(Email, &a, Accepted, 0).pid(7);
                w.event(EventKind::Sigkill, Some(7), 3);
                w.status_row("r9", Email, None, &["sending", "unknown@rescuer"]);
            },
        ),
        (
            "sender killed after the answer, before it could record it",
            |w| {
                let a = w.expect("r9", Line);
                w.send(Line, &a, Accepted, 0).pid(7);
                w.worker(7, 0, Some(400));
                w.status_row("r9", Line, None, &["sending", "failed@rescuer"]);
            },
        ),
        (
            "accept-then-drop: the provider committed, the sender saw a dropped connection",
            |w| {
                let a = w.expect("r9", Email);
                w.send(Email, &a, Accepted, 0).entry.fault = Some("accept_then_drop".into());
                w.status_row("r9", Email, None, &["sending", "unknown"]);
            },
        ),
        (
            "the sender hung up before the answer (its own timeout)",
            |w| {
                let a = w.expect("r9", Line);
                w.send(Line, &a, Accepted, 0).hung_up();
                w.send(Line, &a, IdempotentRepeat, 2_000);
                w.status_row(
                    "r9",
                    Line,
                    None,
                    &["sending", "retryable", "sending", "delivered"],
                );
            },
        ),
        (
            "the database was down while the sender tried to record the accept",
            |w| {
                let a = w.expect("r9", Line);
                w.event(EventKind::DbRestart, None, 100);
                w.send(Line, &a, Accepted, 500);
                w.event(EventKind::DbRestarted, None, 3_000);
                w.send(Line, &a, IdempotentRepeat, 4_000);
                w.status_row(
                    "r9",
                    Line,
                    None,
                    &["sending", "retryable@rescuer", "sending", "delivered"],
                );
            },
        ),
        (
            "an SMS the provider took and a poll found undelivered",
            |w| {
                let a = w.expect("r9", Sms);
                w.send(Sms, &a, Accepted, 0).message_id("SM9");
                let mut p = mock_providers::ledger::LedgerEntry::draft(
                    mock_providers::ledger::Provider::Sms,
                    mock_providers::ledger::EntryKind::Poll,
                    a.clone(),
                );
                // As the fake records a read: its HTTP status, and the status it told.
                p.status = "200".into();
                p.callback_status = Some("undelivered".into());
                p.seq = w.ledger.len() as u64;
                w.ledger.push(std::sync::Arc::new(p));
                w.status_row(
                    "r9",
                    Sms,
                    Some("SM9"),
                    &["sending", "submitted", "permanent_failure@poll"],
                );
            },
        ),
    ];
    for (case, setup) in cases {
        let mut w = healthy();
        setup(&mut w);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds, "{case}: {v:#?}");
    }
}

/// An accept no stack process can be found to have sent cannot be judged: not a violation, and
/// more than 1% of them leaves the verdict insufficient rather than holding.
#[test]
fn unattributed_accepts_are_not_judged() {
    let mut w = healthy();
    let a = w.expect("r9", Email);
    w.send(Email, &a, Accepted, 0).unattributed();
    w.status_row("r9", Email, None, &["sending", "unknown@rescuer"]);
    let v = check(&w.input());
    assert_eq!(v.status, Status::Insufficient, "{v:#?}");
    assert!(
        v.summary.contains("sends with no known sender pid"),
        "{}",
        v.summary
    );
}

#[test]
fn missing_status_rows_are_not_judged() {
    let mut w = healthy();
    let a = w.expect("r9", Line);
    w.send(Line, &a, Accepted, 0);
    let v = check(&w.input());
    assert_eq!(v.status, Status::Insufficient, "{v:#?}");
    assert!(v.summary.contains("no status API row"), "{}", v.summary);
    assert_eq!(v.figures["no_status_row"], 1);
}

/// A worker frozen with a request ready sends it when it wakes, after another worker delivered
/// (seen in `stuck-worker`): the retry key answers 409, and the resend is chaos's doing.
#[test]
fn a_woken_zombies_resend_is_explained() {
    let mut w = healthy();
    let a = w.expect("r9", Line);
    w.event(EventKind::Sigstop, Some(6), 1_000);
    w.send(Line, &a, Accepted, 3_200).pid(8);
    w.event(EventKind::Sigcont, Some(6), 5_000);
    w.send(Line, &a, IdempotentRepeat, 5_050).pid(6);
    w.status_row("r9", Line, None, &["sending", "delivered"]);
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert_eq!(v.figures["resends_after_accept_explained"], 1);
}

#[test]
fn explained_resends_are_counted_apart() {
    let mut w = healthy();
    let a = w.expect("r9", Line);
    w.send(Line, &a, Accepted, 0).pid(7);
    w.event(EventKind::Sigstop, Some(7), 2);
    w.send(Line, &a, IdempotentRepeat, 2_000);
    w.status_row("r9", Line, None, &["sending", "delivered"]);
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert_eq!(
        (
            v.figures["resends_after_accept"].as_u64(),
            v.figures["resends_after_accept_explained"].as_u64()
        ),
        (Some(0), Some(1))
    );
}

#[test]
fn without_a_status_api_only_resends_are_judged() {
    let mut w = healthy();
    w.status = None;
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert!(
        v.summary.starts_with("final states not checked"),
        "{}",
        v.summary
    );
    let a = w.expect("r9", Sms);
    w.send(Sms, &a, Accepted, 0);
    w.send(Sms, &a, Accepted, 3_000);
    let v = check(&w.input());
    assert_eq!(rules(&v), ["resend_after_accept"]);
}

/// An accept answered while its sender's database link was partitioned could not be recorded
/// before the heal, so the rescuer's resend (the retry key answers 409) is explained; the same
/// resend after a partition of some other process's link is not.
#[test]
fn a_resend_after_its_senders_link_was_partitioned_is_explained() {
    for (partitioned, explained) in [(7, true), (6, false)] {
        let mut w = healthy();
        let a = w.expect("r9", Line);
        w.event(EventKind::DbLinkPartition, Some(partitioned), 1_000);
        w.send(Line, &a, Accepted, 3_000).pid(7);
        w.event(EventKind::DbLinkHeal, Some(partitioned), 9_000);
        w.send(Line, &a, IdempotentRepeat, 9_500).pid(8);
        w.status_row("r9", Line, None, &["sending", "delivered"]);
        let v = check(&w.input());
        let want = if explained {
            Status::Holds
        } else {
            Status::Violated
        };
        assert_eq!(v.status, want, "partition of pid {partitioned}: {v:#?}");
        assert_eq!(
            v.figures["resends_after_accept_explained"].as_u64(),
            Some(u64::from(explained)),
            "partition of pid {partitioned}"
        );
    }
}

/// The wall clock jumped 8.3 s forward while an accept was on its way back (a guest paused and
/// resumed): the lease the sender held, timed by that clock, lapsed at once and the rescuer's
/// resend with the retry key (409) is the machine's doing. The same resend with the jump out of
/// that attempt's lease, too small to lapse a lease, or backward, is not.
#[test]
fn a_resend_after_a_forward_clock_jump_is_explained() {
    let lease = healthy().scenario.stack.lease.as_millis() as u64;
    for (jump, explained) in [
        (Some((2_950, 8_300)), true),
        // A lease before the accept arrived, or a lease after its answer: it cannot have lapsed
        // the lease that attempt held (the resend is at 4 s).
        (Some((2_990 - lease - 100, 8_300)), false),
        (Some((3_000 + lease + 200, 8_300)), false),
        // Too small to lapse a lease renewed every heartbeat (lease − heartbeat = 800 ms).
        (Some((2_950, 700)), false),
        (Some((2_950, -8_300)), false),
        (None, false),
    ] {
        let mut w = healthy();
        let a = w.expect("r9", Line);
        w.send(Line, &a, Accepted, 3_000).pid(7);
        w.send(Line, &a, IdempotentRepeat, 4_000).pid(8);
        w.status_row("r9", Line, None, &["sending", "delivered"]);
        if let Some((at, by)) = jump {
            w.clock_jump(at, by);
        }
        let v = check(&w.input());
        let want = if explained {
            Status::Holds
        } else {
            Status::Violated
        };
        assert_eq!(v.status, want, "{jump:?}: {v:#?}");
        assert_eq!(
            v.figures["resends_after_accept_explained"].as_u64(),
            Some(u64::from(explained)),
            "{jump:?}"
        );
    }
}

/// `status_unreadable`: a 2xx answer that is not the contract's is a violation with the answer
/// as its counterexample, and so is an API no request ever got an answer from; a stack without
/// a status API (404), one whose answers all read, and a run stopped early before any answer
/// came are not flagged.
#[test]
fn an_unreadable_status_api_is_a_violation_with_its_answer() {
    use crate::check::{StatusAnswers, UnreadableStatus};
    let garbage = UnreadableStatus {
        batch_id: "b1".into(),
        at_ns: 2_000_000_000,
        http_status: 200,
        error: "not the contract's answer: invalid value: floating point `1e+30`, expected u32"
            .into(),
        body_head: "{\"deliveries\": [{\"attempts\": 1e30".into(),
    };
    // (answers, stopped early, violated)
    let cases = [
        (
            StatusAnswers {
                requests: 4,
                readable: 3,
                unreadable: 1,
                examples: vec![garbage],
                last_failure: None,
            },
            false,
            true,
        ),
        (
            StatusAnswers {
                requests: 3,
                readable: 0,
                unreadable: 0,
                examples: vec![],
                last_failure: Some("operation timed out".into()),
            },
            false,
            true,
        ),
        (
            StatusAnswers {
                requests: 3,
                readable: 0,
                unreadable: 0,
                examples: vec![],
                last_failure: Some("operation timed out".into()),
            },
            true,
            false,
        ),
        (
            StatusAnswers {
                requests: 1,
                readable: 1,
                ..Default::default()
            },
            false,
            false,
        ),
        (
            StatusAnswers {
                requests: 9,
                readable: 7,
                last_failure: Some("HTTP 503".into()),
                ..Default::default()
            },
            false,
            false,
        ),
        (StatusAnswers::default(), false, false),
    ];
    for (i, (answers, stopped, violated)) in cases.into_iter().enumerate() {
        let mut w = healthy();
        w.status_answers = answers;
        if stopped {
            w.quiescence.stopped_early = Some("the API exited".into());
        }
        let v = check(&w.input());
        let flagged = v.violations_by_rule.contains_key("status_unreadable");
        assert_eq!(flagged, violated, "case {i}: {v:#?}");
        if violated {
            assert_eq!(v.status, Status::Violated, "case {i}");
            let c = &v.counterexamples[0];
            assert_eq!(c["rule"], "status_unreadable", "case {i}");
        } else {
            assert_eq!(v.status, Status::Holds, "case {i}: {v:#?}");
        }
    }
    let mut w = healthy();
    w.status_answers.requests = 2;
    w.status_answers.readable = 1;
    w.status_answers.unreadable = 1;
    w.status_answers.examples.push(UnreadableStatus {
        batch_id: "b7".into(),
        at_ns: 0,
        http_status: 200,
        error: "not the contract's answer: expected value at line 1 column 1".into(),
        body_head: "<html>".into(),
    });
    let v = check(&w.input());
    let c = &v.counterexamples[0];
    assert_eq!(
        (c["batch_id"].as_str(), c["body_head"].as_str()),
        (Some("b7"), Some("<html>"))
    );
    assert!(
        v.summary
            .starts_with("1 status API answers were not the contract's"),
        "{}",
        v.summary
    );
}
