//! `no_loss`: every delivery the load asked for came to a proper end.
//!
//! Proper ends, judged from the ledger first: **delivered** (an `Accepted` send, or the provider
//! recognising a repeat of one), **permanent** (a `Permanent` answer; retrying after it is
//! `retry_discipline`'s business, so it is still counted here and shown as
//! `permanent_then_retried`), **exhausted** (at least `expect.max_attempts` failed attempts:
//! transient or protocol errors), and **unknown** (the status API says `unknown`: held for a human,
//! allowed up to `expect.max_unknown`). Anything else is **lost**: no attempt at all, or fewer
//! failures than allowed and then silence. When the run did not reach quiescence, such deliveries
//! are reported as **open** instead (they were still owed at the deadline), still a violation.
//! Must never count the stack's own word as delivery: only the `unknown` state is taken from it.
//! Rule **batch_lost**: the stack accepted a batch (202/200) and its status API, which answered
//! for the first batch, later answered 404 for it (`run/status.rs` notices it while polling).
//!
//! Judged: every expected delivery (rule `lost`, needs one).
//!
//! Figure **unknown_resolved** (by channel too): deliveries the stack once held as `unknown`
//! that left it for a final state on a delivery event (`unknown → delivered / permanent_failure`
//! by a callback), i.e. how reconciliation by provider report worked; informational, no rule.

use mock_providers::ledger::{LedgerEntry, Outcome};
use serde_json::{json, Value};

use super::common::{
    attempt_json, delivery_json, figures, is_failure, ms, status_index, Findings, PerChannel, Sends,
};
use super::{Input, StatusDelivery, Verdict};

pub const NAME: &str = "no_loss";

const KEYS: [&str; 6] = [
    "delivered",
    "permanent",
    "exhausted",
    "unknown",
    "lost",
    "open",
];

/// How one delivery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Delivered,
    Permanent,
    Exhausted,
    Unknown,
    Lost,
    Open,
}

impl End {
    fn key(self) -> &'static str {
        KEYS[self as usize]
    }
}

/// Classifies one delivery from its send attempts (arrival order) and status API state.
pub fn classify(
    sends: &[&LedgerEntry],
    state: Option<&str>,
    max_attempts: u32,
    quiescent: bool,
) -> End {
    let has = |o: Outcome| sends.iter().any(|s| s.outcome == o);
    if has(Outcome::Accepted) || has(Outcome::IdempotentRepeat) {
        End::Delivered
    } else if has(Outcome::Permanent) {
        End::Permanent
    } else if sends.iter().filter(|s| is_failure(s.outcome)).count() >= max_attempts as usize {
        End::Exhausted
    } else if state == Some("unknown") {
        End::Unknown
    } else if quiescent {
        End::Lost
    } else {
        End::Open
    }
}

pub fn check(input: &Input) -> Verdict {
    let sends = Sends::new(input.ledger);
    let status = input.status.map(status_index).unwrap_or_default();
    let max = input.scenario.expect.max_attempts;
    let quiescent = input.quiescence.reached;
    let mut counts = PerChannel::default();
    let mut findings = Findings::default();
    let mut unknowns = Vec::new();
    let mut permanent_then_retried = 0u64;
    let mut resolved = PerChannel::default();

    for e in input.expected {
        counts.init(e.channel, &KEYS);
        let attempts = sends.of_expected(e);
        let row = status.get(&(e.recipient.as_str(), e.channel));
        let state = row.map(|r| r.state.as_str());
        let end = classify(attempts, state, max, quiescent);
        resolved.init(e.channel, &["unknown_resolved"]);
        if row.is_some_and(|r| resolved_by_event(r)) {
            resolved.add(e.channel, "unknown_resolved");
        }
        counts.add(e.channel, end.key());
        if end == End::Permanent {
            let first = attempts
                .iter()
                .position(|s| s.outcome == Outcome::Permanent);
            if first.is_some_and(|i| i + 1 < attempts.len()) {
                permanent_then_retried += 1;
            }
        }
        if !matches!(end, End::Lost | End::Open | End::Unknown) {
            continue;
        }
        let failures = attempts.iter().filter(|s| is_failure(s.outcome)).count();
        let mut c = delivery_json(e);
        let (rule, reason) = match end {
            End::Unknown => ("unknown", "held as unknown by the stack".to_string()),
            _ if attempts.is_empty() => (end.key(), "no send attempt at all".to_string()),
            _ => (
                end.key(),
                format!(
                    "{failures} failed attempts of {max} allowed, then none (last at {} ms)",
                    ms(attempts[attempts.len() - 1].received_ns)
                ),
            ),
        };
        c.insert("rule".into(), json!(rule));
        c.insert("reason".into(), json!(reason));
        c.insert("status_state".into(), json!(state));
        c.insert(
            "sends".into(),
            Value::Array(attempts.iter().map(|s| attempt_json(s, input)).collect()),
        );
        if end == End::Unknown {
            unknowns.push(Value::Object(c));
        } else {
            findings.push(Value::Object(c));
        }
    }

    let max_unknown = input.scenario.expect.max_unknown as usize;
    if unknowns.len() > max_unknown {
        for u in unknowns.iter().cloned() {
            findings.push(u);
        }
    }

    let mut summary = format!(
        "{} deliveries: {} delivered, {} permanent, {} exhausted, {} unknown (max {max_unknown}), {} lost",
        input.expected.len(),
        counts.total("delivered"),
        counts.total("permanent"),
        counts.total("exhausted"),
        counts.total("unknown"),
        counts.total("lost"),
    );
    if !quiescent {
        summary.push_str(&format!(
            "; run did not reach quiescence: {} still open",
            counts.total("open")
        ));
    }
    let figs = figures(json!({
        "by_channel": counts.to_json(),
        "delivered": counts.total("delivered"),
        "permanent": counts.total("permanent"),
        "exhausted": counts.total("exhausted"),
        "unknown": counts.total("unknown"),
        "lost": counts.total("lost"),
        "open": counts.total("open"),
        "max_unknown": max_unknown,
        "permanent_then_retried": permanent_then_retried,
        "unknown_resolved": resolved.total("unknown_resolved"),
        "unknown_resolved_by_channel": resolved.to_json(),
        "quiescent": quiescent,
    }));
    findings.judged("lost", input.expected.len() as u64);
    for b in input.lost_batches {
        let deliveries = input
            .expected
            .iter()
            .filter(|e| e.batch_id == b.batch_id)
            .count();
        findings.push(json!({
            "rule": "batch_lost",
            "batch_id": b.batch_id,
            "deliveries": deliveries,
            "first_missing_ms": ms(b.first_missing_ns),
            "reason": "the stack accepted this batch, then its status API answered 404 for it",
        }));
    }
    if !input.lost_batches.is_empty() {
        summary.push_str(&format!(
            "; {} accepted batches unknown to the status API (404)",
            input.lost_batches.len()
        ));
    }
    findings.verdict(NAME, summary, figs)
}

/// Whether a status row went from `unknown` to a final state on a callback.
fn resolved_by_event(row: &StatusDelivery) -> bool {
    let mut prev: Option<&str> = None;
    row.transitions.iter().any(|t| {
        let from = t.from.as_deref().or(prev);
        prev = Some(t.to.as_str());
        from == Some("unknown")
            && t.source == "callback"
            && matches!(t.to.as_str(), "delivered" | "permanent_failure")
    })
}

#[cfg(test)]
mod tests {
    use mock_providers::ledger::Outcome::*;

    use super::*;
    use crate::check::testkit::*;
    use crate::check::Status;
    use crate::scenario::Channel::*;

    /// A world with one delivery of each proper end (max_attempts 4 in the base scenario).
    fn proper_ends() -> World {
        let mut w = World::new();
        let a = w.expect("r1", Line);
        w.send(Line, &a, Transient, 0);
        w.send(Line, &a, Accepted, 200);
        let b = w.expect("r2", Email);
        w.send(Email, &b, Permanent, 0);
        let c = w.expect("r3", Sms);
        for (i, at) in [0, 100, 300, 700].into_iter().enumerate() {
            w.send(
                Sms,
                &c,
                if i % 2 == 0 { Transient } else { ProtocolError },
                at,
            );
        }
        w
    }

    #[test]
    fn proper_ends_hold() {
        let w = proper_ends();
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        assert_eq!(
            (
                v.figures["delivered"].as_u64(),
                v.figures["permanent"].as_u64(),
                v.figures["exhausted"].as_u64()
            ),
            (Some(1), Some(1), Some(1))
        );
        assert_eq!(v.figures["by_channel"]["sms"]["exhausted"], 1);
        assert_eq!(v.figures["by_channel"]["line"]["lost"], 0);
    }

    #[test]
    fn losses_are_violations() {
        // (case, attempts sent, expected reason prefix)
        let cases: [(&str, &[u64], &str); 2] = [
            ("never tried", &[], "no send attempt"),
            (
                "abandoned after 2 of 4",
                &[0, 150],
                "2 failed attempts of 4 allowed",
            ),
        ];
        for (case, times, reason) in cases {
            let mut w = proper_ends();
            let d = w.expect("r9", Sms);
            for &t in times {
                w.send(Sms, &d, Transient, t);
            }
            let v = check(&w.input());
            assert_eq!(v.status, Status::Violated, "{case}");
            assert_eq!(rules(&v), ["lost"], "{case}");
            let c = &v.counterexamples[0];
            assert_eq!(c["recipient"], "r9", "{case}");
            assert!(
                c["reason"].as_str().unwrap().starts_with(reason),
                "{case}: {c}"
            );
            assert_eq!(c["sends"].as_array().unwrap().len(), times.len());
            assert_eq!(v.figures["by_channel"]["sms"]["lost"], 1);
        }
    }

    #[test]
    fn unknown_counts_against_max_unknown() {
        // (max_unknown, expected status)
        for (max_unknown, status) in [(1, Status::Holds), (0, Status::Violated)] {
            let mut w = proper_ends();
            w.scenario.expect.max_unknown = max_unknown;
            let d = w.expect("r5", Email);
            w.send(Email, &d, Transient, 0);
            w.status_row("r5", Email, None, &["pending", "sending", "unknown"]);
            let v = check(&w.input());
            assert_eq!(v.status, status, "max_unknown {max_unknown}: {v:#?}");
            assert_eq!(v.figures["unknown"], 1);
            if status == Status::Violated {
                assert_eq!(rules(&v), ["unknown"]);
            }
        }
    }

    #[test]
    fn unknown_resolved_by_an_event_is_counted() {
        // (status path, counted as resolved)
        let cases: [(&[&str], u64); 3] = [
            (&["sending", "unknown", "delivered@callback"], 1),
            (&["sending", "unknown"], 0),
            (&["sending", "submitted", "delivered@callback"], 0),
        ];
        for (path, want) in cases {
            let mut w = World::new();
            let d = w.expect("r1", Email);
            w.send(Email, &d, Accepted, 0);
            w.status_row("r1", Email, None, path);
            let v = check(&w.input());
            assert_eq!(v.status, Status::Holds, "{path:?}");
            assert_eq!(v.figures["unknown_resolved"], want, "{path:?}");
            assert_eq!(
                v.figures["unknown_resolved_by_channel"]["email"]["unknown_resolved"], want,
                "{path:?}"
            );
        }
    }

    #[test]
    fn ground_truth_beats_the_status_api() {
        // The stack says `unknown` but the provider accepted it: the customer got it.
        let mut w = World::new();
        let d = w.expect("r1", Email);
        w.send(Email, &d, Accepted, 0);
        w.status_row("r1", Email, None, &["sending", "unknown"]);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds);
        assert_eq!(v.figures["delivered"], 1);
    }

    #[test]
    fn not_quiescent_reports_open() {
        let mut w = proper_ends();
        w.quiescence.reached = false;
        let d = w.expect("r7", Line);
        w.send(Line, &d, Transient, 0);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated);
        assert_eq!(rules(&v), ["open"]);
        assert!(
            v.summary.contains("did not reach quiescence: 1 still open"),
            "{}",
            v.summary
        );
        assert_eq!(v.figures["lost"], 0);
    }

    #[test]
    fn an_accepted_batch_the_status_api_no_longer_knows_is_lost() {
        let mut w = proper_ends();
        assert_eq!(check(&w.input()).status, crate::check::Status::Holds);
        let batch = w.expected[0].batch_id.clone();
        w.lost_batches.push(crate::check::LostBatch {
            batch_id: batch.clone(),
            first_missing_ns: ns(1_500),
        });
        let v = check(&w.input());
        assert_eq!(v.status, crate::check::Status::Violated, "{v:#?}");
        assert_eq!(rules(&v), ["batch_lost"]);
        assert_eq!(v.counterexamples[0]["batch_id"], batch);
        assert_eq!(v.counterexamples[0]["first_missing_ms"], 1_500.0);
    }
}
