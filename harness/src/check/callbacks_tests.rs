//! Tests of the `callbacks` checker, kept apart so the checker reads in one sitting.

use mock_providers::ledger::CallbackVariant::*;
use mock_providers::ledger::Outcome::*;

use super::*;
use crate::check::testkit::*;
use crate::check::Status;
use crate::scenario::Channel::*;

/// An SMS delivered per its genuine report, and an e-mail bounced, both applied correctly.
fn healthy() -> World {
    let mut w = World::new();
    let s = w.expect("r1", Sms);
    w.send(Sms, &s, Accepted, 0).message_id("SM1");
    w.callback(Sms, &s, "SM1", "sent", Genuine, Some(200), 100);
    w.callback(Sms, &s, "SM1", "delivered", Genuine, Some(200), 200);
    w.callback(Sms, &s, "SM1", "delivered", Duplicate, Some(200), 250);
    w.callback(Sms, &s, "SM1", "failed", ForgedSignature, Some(403), 260);
    w.status_row(
        "r1",
        Sms,
        Some("SM1"),
        &["pending", "sending", "submitted", "delivered@callback"],
    );
    let e = w.expect("r2", Email);
    w.send(Email, &e, Accepted, 0).message_id("<m2@x>");
    w.callback(Email, &e, "<m2@x>", "bounced", Genuine, Some(204), 300);
    w.callback(
        Email,
        &e,
        "<zz@unknown>",
        "delivered",
        UnknownId,
        Some(200),
        310,
    );
    w.status_row(
        "r2",
        Email,
        Some("m2@x"),
        &[
            "pending",
            "sending",
            "submitted",
            "permanent_failure@callback",
        ],
    );
    w
}

#[test]
fn agreeing_states_hold() {
    let v = check(&healthy().input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert_eq!(v.figures["judged"], 2);
}

#[test]
fn not_checked_without_status_api_or_callbacks() {
    let mut w = healthy();
    w.status = None;
    assert_eq!(check(&w.input()).summary, "stack exposes no status API");
    let mut w = World::new();
    w.status_row("r1", Line, None, &["delivered"]);
    let v = check(&w.input());
    assert_eq!(
        (v.status, v.summary.as_str()),
        (Status::NotChecked, "no callbacks were sent")
    );
}

#[test]
fn a_duplicate_logged_in_the_history_without_a_move_holds() {
    let mut w = healthy();
    let rows = w.status.as_mut().unwrap();
    rows.remove(0);
    w.status_row(
        "r1",
        Sms,
        Some("SM1"),
        &["submitted", "delivered@callback", "delivered@callback"],
    );
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
}

#[test]
fn each_rule_can_be_broken() {
    // (case, new path of r1's SMS row, rules expected)
    let cases: [(&str, &[&str], &[&str]); 4] = [
        (
            "ignored",
            &["pending", "sending", "submitted"],
            &["disagrees"],
        ),
        (
            "forged",
            &["sending", "submitted", "failed@callback"],
            &["forged_accepted"],
        ),
        (
            "stale",
            &["submitted", "delivered@callback", "submitted@callback"],
            &["disagrees", "regression"],
        ),
        (
            "twice",
            &[
                "submitted",
                "delivered@callback",
                "failed@callback",
                "delivered@callback",
            ],
            &["duplicate_applied", "regression"],
        ),
    ];
    for (case, path, want) in cases {
        let mut w = healthy();
        let rows = w.status.as_mut().unwrap();
        rows.remove(0);
        w.status_row("r1", Sms, Some("SM1"), path);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated, "{case}: {v:#?}");
        let mut got = rules(&v);
        got.sort();
        assert_eq!(got, want, "{case}");
        assert_eq!(v.counterexamples[0]["recipient"], "r1", "{case}");
    }
}

/// An e-mail whose `processed` and `deferred` events arrived after `delivered`, then a
/// complaint: the correct stack stayed `delivered`.
fn email_out_of_order() -> World {
    let mut w = World::new();
    let e = w.expect("r3", Email);
    w.send(Email, &e, Accepted, 0).message_id("<m3@x>");
    for (status, at) in [
        ("delivered", 300),
        ("processed", 350),
        ("deferred", 400),
        ("complained", 900),
    ] {
        w.callback(Email, &e, "<m3@x>", status, Genuine, Some(200), at);
    }
    w
}

#[test]
fn email_events_out_of_order_and_informational_change_nothing() {
    // (stack's path, rules expected)
    let cases: [(&[&str], &[&str]); 4] = [
        (&["sending", "submitted", "delivered@callback"], &[]),
        // `processed` / `deferred` applied in arrival order: back to submitted.
        (
            &[
                "sending",
                "submitted",
                "delivered@callback",
                "submitted@callback",
            ],
            &["disagrees", "regression"],
        ),
        // Moved back and forth: the final state agrees, the regression is still one.
        (
            &[
                "submitted",
                "delivered@callback",
                "submitted@callback",
                "delivered@callback",
            ],
            &["duplicate_applied", "regression"],
        ),
        // The complaint taken for a bounce.
        (
            &[
                "submitted",
                "delivered@callback",
                "permanent_failure@callback",
            ],
            &["disagrees", "regression"],
        ),
    ];
    for (path, want) in cases {
        let mut w = email_out_of_order();
        w.status_row("r3", Email, Some("m3@x"), path);
        let v = check(&w.input());
        let mut got = rules(&v);
        got.sort();
        assert_eq!(got, want, "{path:?}: {v:#?}");
        assert_eq!(v.figures["late_non_final_acked"], 3, "{path:?}");
        assert_eq!(v.figures["genuine_by_type"]["smtp"]["deferred"], 1);
        if let Some(r) = v.counterexamples.iter().find(|c| c["rule"] == "regression") {
            assert_eq!(r["late_reports"].as_array().unwrap().len(), 3, "{r}");
        }
    }
}

#[test]
fn a_report_the_fakes_began_late_and_the_stack_never_answered_is_the_harness_s_not_the_stack_s() {
    // The final report timed out on a try the fakes began 900 ms late, and the stack never
    // acknowledged it: not judged (insufficient), never a violation, and counted as late.
    let mut w = healthy();
    for e in w
        .ledger
        .iter_mut()
        .map(std::sync::Arc::make_mut)
        .filter(|e| e.callback_status.as_deref() == Some("delivered"))
    {
        e.callback_response = None;
        e.callback_late_ms = Some(900);
        e.callback_took_ms = Some(2_000);
    }
    w.status.as_mut().unwrap()[0].state = "submitted".into();
    let v = check(&w.input());
    assert_eq!(v.status, Status::Insufficient, "{v:#?}");
    let t = &v.figures["delivery_timing"];
    assert!(t["unanswered"].as_u64() > Some(0), "{t}");
    assert_eq!(t["unanswered_begun_late"], t["unanswered"], "{t}");
    assert_eq!(t["late_max_ms"], 900, "{t}");
    // On time and answered: nothing late, the answer time measured.
    let mut w = healthy();
    for e in w.ledger.iter_mut().map(std::sync::Arc::make_mut) {
        if e.callback_try.is_none() {
            continue;
        }
        e.callback_late_ms = Some(3);
        e.callback_took_ms = Some(12);
    }
    let v = check(&w.input());
    let t = &v.figures["delivery_timing"];
    assert_eq!(
        (t["unanswered"].as_u64(), t["begun_late"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(t["answer_p99_ms"], 12, "{t}");
}

#[test]
fn a_report_shed_with_503_and_acknowledged_on_a_retry_holds() {
    // A stack bounding its callback work answers 503 + Retry-After under a flood; the
    // provider's retry is acknowledged: the stack learned the truth, nothing to blame.
    let mut w = healthy();
    let i = w
        .ledger
        .iter()
        .position(|e| e.callback_status.as_deref() == Some("delivered"))
        .unwrap();
    let mut retry = mock_providers::ledger::LedgerEntry::clone(&w.ledger[i]);
    w.entry_mut(i).callback_response = Some(503);
    retry.seq = w.ledger.len() as u64;
    retry.mono_ns += 1_000_000_000;
    retry.callback_try = Some(2);
    retry.callback_response = Some(200);
    w.ledger.push(std::sync::Arc::new(retry));
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert_eq!(v.figures["final_not_acknowledged"], 0);
    assert_eq!(v.figures["judged"], 2);
}

#[test]
fn unacknowledged_or_unmatched_reports_are_insufficient_not_holds() {
    // The stack answered 500 to the final report: it never learned the truth.
    let mut w = healthy();
    w.ledger
        .iter_mut()
        .map(std::sync::Arc::make_mut)
        .filter(|e| e.callback_status.as_deref() == Some("delivered"))
        .for_each(|e| e.callback_response = Some(500));
    w.status.as_mut().unwrap()[0].state = "submitted".into();
    let v = check(&w.input());
    assert_eq!(v.status, Status::Insufficient, "{v:#?}");
    assert_eq!(v.figures["final_not_acknowledged"], 1);
    // A status API that leaves `provider_message_id` empty: no report can be matched.
    let mut w = healthy();
    for r in w.status.as_mut().unwrap() {
        r.provider_message_id = None;
    }
    let v = check(&w.input());
    assert_eq!(v.status, Status::Insufficient, "{v:#?}");
    assert_eq!(v.judged["disagrees"].judged, 0);
    assert!(
        v.summary.contains("disagrees judged 0 of the 1"),
        "{}",
        v.summary
    );
    // Still a violation when something else is provably wrong.
    let rows = w.status.as_mut().unwrap();
    let mut transitions = rows[0].transitions.to_vec();
    transitions.push(crate::check::StatusTransition::new(
        Some("delivered".into()),
        "submitted".into(),
        "callback".into(),
        None,
    ));
    rows[0].transitions = transitions.into();
    assert_eq!(check(&w.input()).status, Status::Violated);
}

#[test]
fn pending_reports_are_skipped_and_callbacks_without_final_reports_hold() {
    // Acknowledged, but reports are still due at the end: a `submitted` row is skipped.
    let mut w = healthy();
    w.status.as_mut().unwrap()[0].state = "submitted".into();
    w.quiescence.callbacks_pending = 3;
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert_eq!(v.figures["skipped_pending"], 1);
    // Only interim reports (`sent`): nothing final to agree with, the rows are still judged.
    let mut w = World::new();
    let s = w.expect("r1", Sms);
    w.send(Sms, &s, Accepted, 0).message_id("SM1");
    w.callback(Sms, &s, "SM1", "sent", Genuine, Some(200), 100);
    w.status_row("r1", Sms, Some("SM1"), &["sending", "submitted"]);
    let v = check(&w.input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert!(!v.judged.contains_key("disagrees"));
}

#[test]
fn a_forged_report_answered_2xx_is_a_violation() {
    let mut w = healthy();
    w.ledger
        .iter_mut()
        .map(std::sync::Arc::make_mut)
        .filter(|e| e.callback_variant == Some(ForgedSignature))
        .for_each(|e| e.callback_response = Some(200));
    let v = check(&w.input());
    assert_eq!(v.status, Status::Violated, "{v:#?}");
    assert_eq!(rules(&v), ["forged_answered_2xx"]);
    assert_eq!(v.judged["forged_answered_2xx"].judged, 1);
}

/// `healthy()` with the e-mail also sent an unsigned report claiming `delivered` (its genuine
/// final report said `bounced`), answered `response`.
fn with_unsigned_report(response: u16) -> World {
    let mut w = healthy();
    let e = addr("r2", Email);
    w.callback(
        Email,
        &e,
        "<m2@x>",
        "delivered",
        Unsigned,
        Some(response),
        320,
    );
    w
}

#[test]
fn an_unsigned_report_refused_403_holds_and_is_judged() {
    let v = check(&with_unsigned_report(403).input());
    assert_eq!(v.status, Status::Holds, "{v:#?}");
    assert_eq!(v.judged["forged_answered_2xx"].judged, 2);
}

#[test]
fn an_unsigned_report_answered_2xx_or_applied_is_a_violation() {
    let v = check(&with_unsigned_report(200).input());
    assert_eq!(v.status, Status::Violated, "{v:#?}");
    assert_eq!(rules(&v), ["forged_answered_2xx"]);
    assert_eq!(v.counterexamples[0]["signature"], "none");

    // Applied too: the e-mail's row followed the unsigned claim instead of its bounce.
    let mut w = with_unsigned_report(200);
    let rows = w.status.as_mut().unwrap();
    rows.remove(1);
    w.status_row(
        "r2",
        Email,
        Some("m2@x"),
        &["pending", "sending", "submitted", "delivered@callback"],
    );
    let v = check(&w.input());
    let mut got = rules(&v);
    got.sort();
    assert_eq!(got, ["forged_accepted", "forged_answered_2xx"], "{v:#?}");
}

/// Of a message's genuine final reports, the first is the truth, and it counts as acknowledged
/// when any of them was: a later contradicting report is not what the stack is judged against.
#[test]
fn the_first_genuine_final_report_is_the_truth_and_any_acknowledgement_counts() {
    let mut w = World::new();
    let s = w.expect("r1", Sms);
    w.send(Sms, &s, Accepted, 0).message_id("SM1");
    w.callback(Sms, &s, "SM1", "delivered", Genuine, Some(503), 100);
    w.callback(Sms, &s, "SM1", "undelivered", Genuine, Some(200), 200);
    w.status_row(
        "r1",
        Sms,
        Some("SM1"),
        &["pending", "sending", "submitted", "undelivered@callback"],
    );
    let v = check(&w.input());
    assert_eq!(v.status, Status::Violated, "{v:#?}");
    assert_eq!(v.counterexamples[0]["genuine_report"], "delivered");
    assert_eq!(v.figures["judged"], 1);
}

/// Two rows naming one message id: the last listed is the one judged (as before, when a map
/// built in row order kept it), whichever it is.
#[test]
fn of_two_rows_naming_one_message_the_last_listed_is_judged() {
    let judged = |agreeing_last: bool| {
        let mut w = World::new();
        let s = w.expect("r1", Sms);
        w.send(Sms, &s, Accepted, 0).message_id("SM1");
        w.callback(Sms, &s, "SM1", "delivered", Genuine, Some(200), 100);
        let agreeing = ["pending", "sending", "submitted", "delivered@callback"];
        let rows = [("r0", &["pending", "failed"][..]), ("r1", &agreeing[..])];
        let order: Vec<_> = if agreeing_last {
            rows.iter().collect()
        } else {
            rows.iter().rev().collect()
        };
        for (recipient, steps) in order {
            w.status_row(recipient, Sms, Some("SM1"), steps);
        }
        check(&w.input()).status
    };
    assert_eq!(judged(true), Status::Holds);
    assert_eq!(judged(false), Status::Violated);
}
