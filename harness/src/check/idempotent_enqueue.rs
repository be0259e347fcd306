//! `idempotent_enqueue`: a batch POSTed again creates nothing new (docs/stack-contract.md: a
//! repeated `batch_id` answers `200` with the same body).
//!
//! Rules, over the repeats the load made (`[load] repeat`) and the stack's status API:
//! - `repeat_refused`: a repeat answered with anything but 200 or 202, or not at all. The
//!   client cannot tell a refused repeat from a lost batch.
//! - `repeat_created`: a repeat answered 202 ("accepted, new") although the original had
//!   already been answered 2xx before the repeat left, or although the original was answered
//!   202 too: two creations of one batch. (After a lost answer 202 is right when the original
//!   never committed; whether it did is for the next rule and `exactly_once` to see.)
//! - `repeat_count_changed`: the repeat's answer names another number of deliveries than the
//!   batch holds.
//! - `duplicate_rows`: the status API lists one (recipient, channel) more than once: the stack
//!   holds the delivery twice, whether or not both copies were sent yet.
//!
//! Sends themselves are `exactly_once`'s: a delivery created twice is sent twice.

use std::borrow::Cow;

use serde_json::json;

use super::common::{figures, ms, not_checked, Findings};
use super::{Input, StatusDelivery, Verdict};
use crate::report::RepeatRecord;
use crate::scenario::Channel;

pub const NAME: &str = "idempotent_enqueue";

pub fn check(input: &Input) -> Verdict {
    if input.repeats.is_empty() && input.status.is_none() {
        return not_checked(
            NAME,
            "no batch was repeated ([load] repeat) and the stack has no status API",
        );
    }
    let mut findings = Findings::default();
    if input.scenario.load.repeat.is_some() {
        // A run that asked for repeats and made none judged nothing about them.
        for rule in ["repeat_refused", "repeat_created", "repeat_count_changed"] {
            findings.judged(rule, input.repeats.len() as u64);
        }
    }
    if let Some(rows) = input.status {
        findings.judged("duplicate_rows", rows.len() as u64);
    }
    for r in input.repeats {
        if let Some(rule) = broken_rule(r) {
            findings.push(json!({
                "rule": rule,
                "batch_id": r.batch_id,
                "mode": r.mode,
                "original_sent_ms": ms(r.original_sent_ns),
                "original_acked_ms": r.original_acked_ns.map(ms),
                "original_status": r.original_status,
                "repeat_sent_ms": ms(r.sent_ns),
                "repeat_acked_ms": r.acked_ns.map(ms),
                "repeat_status": r.status,
                "repeat_deliveries": r.deliveries,
                "expected_deliveries": r.expected_deliveries,
                "error": r.error,
            }));
        }
    }
    // Rows grouped by (recipient, channel) by sorting: 8 bytes a row, where a map of a list
    // per delivery took ~40 MB at 300,000 rows. Stable, so a group keeps the listed order.
    let mut rows: Vec<&StatusDelivery> = input.status.unwrap_or_default().iter().collect();
    rows.sort_by(|a, b| at(a).cmp(&at(b)));
    // A key is read back as text only where a rule reports it (most are kept as their batch id).
    let mut doubled: Vec<(_, Vec<Cow<str>>)> = rows
        .chunk_by(|a, b| at(a) == at(b))
        .filter(|same| same.len() > 1)
        .map(|same| (at(same[0]), same.iter().map(|d| d.key()).collect()))
        .collect();
    doubled.sort();
    for ((recipient, channel), keys) in &doubled {
        findings.push(json!({
            "rule": "duplicate_rows",
            "recipient": recipient,
            "channel": channel.as_str(),
            "keys": keys,
        }));
    }
    let figs = figures(json!({
        "repeats": input.repeats.len(),
        "status_rows": input.status.map(<[_]>::len),
        "duplicate_rows": doubled.len(),
    }));
    let summary = format!(
        "{} batches repeated, {} status rows: {} answers or rows break idempotency",
        input.repeats.len(),
        input.status.map_or(0, <[_]>::len),
        findings.total()
    );
    findings.verdict(NAME, summary, figs)
}

/// The delivery a status row is about.
fn at(d: &StatusDelivery) -> (&str, Channel) {
    (d.recipient.as_str(), d.channel)
}

/// The rule a repeat's answer breaks, if any.
fn broken_rule(r: &RepeatRecord) -> Option<&'static str> {
    let Some(status) = r.status.filter(|s| *s == 200 || *s == 202) else {
        return Some("repeat_refused");
    };
    let answered_before = r.original_acked_ns.is_some_and(|a| a <= r.sent_ns);
    if status == 202 && (answered_before || r.original_status == Some(202)) {
        return Some("repeat_created");
    }
    if r.deliveries.is_some_and(|n| n != r.expected_deliveries) {
        return Some("repeat_count_changed");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;
    use crate::check::Status;
    use crate::load::RepeatMode::{self, *};
    use crate::scenario::Channel::*;

    fn repeat(mode: RepeatMode, original: Option<(u64, u16)>, answer: Option<u16>) -> RepeatRecord {
        RepeatRecord {
            batch_id: "b1".into(),
            mode,
            expected_deliveries: 6,
            original_sent_ns: ns(0),
            original_acked_ns: original.map(|(at, _)| ns(at)),
            original_status: original.map(|(_, s)| s),
            sent_ns: ns(100),
            acked_ns: answer.map(|_| ns(120)),
            status: answer,
            deliveries: answer.map(|_| 6),
            error: answer.is_none().then(|| "connection reset".into()),
        }
    }

    #[test]
    fn each_answer_against_the_contract() {
        // (repeat, rule broken)
        let cases = [
            // A correct stack: 200 after the answer, 200 or 202 while the original is in flight
            // (whichever committed first), 202 after a lost answer that never committed.
            (repeat(AfterAnswer, Some((50, 202)), Some(200)), None),
            (repeat(Concurrent, Some((150, 202)), Some(200)), None),
            (repeat(Concurrent, Some((150, 200)), Some(202)), None),
            (repeat(LostAnswer, None, Some(202)), None),
            (repeat(LostAnswer, None, Some(200)), None),
            // Broken: an error, no answer, a second creation, another count.
            (
                repeat(AfterAnswer, Some((50, 202)), Some(409)),
                Some("repeat_refused"),
            ),
            (repeat(LostAnswer, None, Some(500)), Some("repeat_refused")),
            (
                repeat(Concurrent, Some((150, 202)), None),
                Some("repeat_refused"),
            ),
            (
                repeat(AfterAnswer, Some((50, 202)), Some(202)),
                Some("repeat_created"),
            ),
            (
                repeat(Concurrent, Some((150, 202)), Some(202)),
                Some("repeat_created"),
            ),
            (
                RepeatRecord {
                    deliveries: Some(12),
                    ..repeat(AfterAnswer, Some((50, 202)), Some(200))
                },
                Some("repeat_count_changed"),
            ),
        ];
        for (r, want) in cases {
            assert_eq!(broken_rule(&r), want, "{r:?}");
            let mut w = World::new();
            w.scenario.load.repeat = Some(crate::scenario::Repeat {
                share: 1.0,
                after_min: std::time::Duration::ZERO,
                after_max: std::time::Duration::ZERO,
            });
            w.repeats.push(r);
            let v = check(&w.input());
            assert_eq!(rules(&v), want.into_iter().collect::<Vec<_>>(), "{v:#?}");
        }
    }

    #[test]
    fn a_delivery_held_twice_by_the_stack_is_named() {
        let mut w = World::new();
        w.status_row("r1", Line, None, &["sending", "delivered"]);
        w.status_row("r2", Line, None, &["sending", "delivered"]);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        w.status_row("r1", Line, None, &["pending"]);
        let v = check(&w.input());
        assert_eq!(rules(&v), ["duplicate_rows"]);
        assert_eq!(v.counterexamples[0]["recipient"], "r1");
        let keys = serde_json::json!(["b0:r1:line", "b0:r1:line"]);
        assert_eq!(
            v.counterexamples[0]["keys"], keys,
            "each key as the stack wrote it"
        );
        // Nothing repeated and no status API: nothing judged, not a pass.
        assert_eq!(check(&World::new().input()).status, Status::NotChecked);
        // Repeats asked for and none made: insufficient.
        let mut w = World::new();
        w.status_row("r1", Line, None, &["sending", "delivered"]);
        w.scenario.load.repeat = Some(crate::scenario::Repeat {
            share: 0.05,
            after_min: std::time::Duration::ZERO,
            after_max: std::time::Duration::from_secs(2),
        });
        assert_eq!(check(&w.input()).status, Status::Insufficient);
    }
}
