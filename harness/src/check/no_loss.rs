//! `no_loss`: every delivery the load asked for came to a proper end.
//!
//! Proper ends, judged from the ledger first: **delivered** (an `Accepted` send, or the provider
//! recognising a repeat of one), **permanent** (a `Permanent` answer; retrying after it is
//! `retry_discipline`'s business, so it is still counted here and shown as
//! `permanent_then_retried`), **exhausted** (at least `expect.max_attempts` failed attempts:
//! transient or protocol errors), and **unknown** (the status API says `unknown`: held for a human;
//! without a status API, the last attempt's answer never reached its sender), allowed up to
//! `expect.max_unknown` and only when explained ([`super::unknowns`]: chaos hit the process
//! holding the attempt while it was in flight, the wall clock jumped forward far enough to lapse
//! its lease then (`crate::jumps`), or the provider cut the answer). An unknown nothing
//! explains is **unexplained_unknown**, a violation whatever `max_unknown` says: the customer got
//! nothing and no fault of the run's making can account for it. Anything else is **lost**: no attempt at all, or fewer
//! failures than allowed and then silence. When the run did not reach quiescence, such deliveries
//! are reported as **open** instead (they were still owed at the deadline), still a violation —
//! unless the wait ended at its hard deadline with the stack still settling (`quiescence`
//! `still_settling`): then they are unjudged and the verdict `insufficient` (slow, not lost).
//! So are open deliveries on a channel the chaos left with no worker that had ever sent it
//! ([`super::orphans`]: a stack with workers per channel whose every one on that channel was
//! stopped for good): nothing was left to send them, which says nothing about recovery.
//! Must never count the stack's own word as delivery: only the `unknown` state is taken from it.
//! Rule **batch_lost**: the stack accepted a batch (202/200) and its status API, which answered
//! for the first batch, later answered 404 for it (`run/status.rs` notices it while polling).
//!
//! Judged: every expected delivery (rule `lost`, needs one).
//!
//! Unknowns the provider *did* accept (the customer got the message; the stack holds it as
//! `unknown` all the same) are delivered here, and counted apart as **unknown_accepted** with how
//! many of them are explained: the stack's doubt about them loses nothing.
//!
//! Figure **unknown_resolved** (by channel too): deliveries the stack once held as `unknown`
//! that left it for a final state on a delivery event (`unknown → delivered / permanent_failure`
//! by a callback), i.e. how reconciliation by provider report worked; informational, no rule.

use super::Entry;
use mock_providers::ledger::Outcome;
use serde_json::{json, Value};

use super::common::{attempt_json, delivery_json, figures, is_failure, ms, Findings, PerChannel};
use super::unknowns::{self, Excuse};
use super::{Input, Source, State, StatusDelivery, Verdict};

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

/// Classifies one delivery from its send attempts (arrival order) and status API state (`None`
/// without a status API, or when it has no row for the delivery).
pub fn classify(
    sends: &[&Entry],
    state: Option<&State>,
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
    } else if state == Some(&State::Unknown) {
        End::Unknown
    } else if quiescent {
        End::Lost
    } else {
        End::Open
    }
}

/// The delivery's state as far as `unknown` goes: the status API's word when the stack has one;
/// without one, `unknown` when the last attempt's answer never reached its sender (it hung up, or
/// the provider dropped the connection) — what the ledger shows of an `unknown`.
fn state_of<'a>(
    input: &Input,
    row: Option<&'a StatusDelivery>,
    attempts: &[&Entry],
) -> Option<&'a State> {
    if input.status.is_some() {
        return row.map(|r| &r.state);
    }
    attempts
        .last()
        .filter(|s| s.client_hung_up || s.fault().is_some_and(unknowns::cuts_answer))
        .map(|_| &State::Unknown)
}

pub fn check(input: &Input) -> Verdict {
    let sends = input.sends();
    let max = input.scenario.expect.max_attempts;
    let quiescent = input.quiescence.reached;
    // Open when the wait ended with the stack still settling: not seen to finish, so unjudged.
    let settling = !quiescent && input.quiescence.still_settling;
    let mut still_settling = 0u64;
    // Open on a channel no worker alive at the end had ever sent: unjudged too.
    let orphans = input.orphans();
    let mut orphaned = 0u64;
    let mut counts = PerChannel::default();
    let mut findings = Findings::default();
    // Counterexamples of explained unknowns (reported past `max_unknown`).
    let mut explained = Vec::new();
    // Every `unknown`, as `excuse_json`: never accepted (customer got nothing) and accepted.
    let mut not_accepted_unknown = Vec::new();
    let mut accepted_unknown = Vec::new();
    let mut accepted_unexplained = 0u64;
    let mut permanent_then_retried = 0u64;
    let mut resolved = PerChannel::default();

    for e in input.expected {
        counts.init(e.channel, &KEYS);
        let attempts = sends.of_expected(e);
        let row = input.status_row(e);
        let state = state_of(input, row, attempts);
        let end = classify(attempts, state, max, quiescent);
        if end == End::Delivered && state == Some(&State::Unknown) {
            let excuse = unknowns::excuse(input, attempts);
            accepted_unknown.push(excuse_json(e, true, excuse.as_ref()));
            accepted_unexplained += u64::from(excuse.is_none());
        }
        resolved.init(e.channel, &["unknown_resolved"]);
        if row.is_some_and(resolved_by_event) {
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
        let excuse = (end == End::Unknown)
            .then(|| unknowns::excuse(input, attempts))
            .flatten();
        let (rule, reason) = match end {
            End::Unknown => match &excuse {
                Some(x) => (
                    "unknown",
                    format!(
                        "held as unknown; the provider never accepted it; {}",
                        x.because
                    ),
                ),
                None => (
                    "unexplained_unknown",
                    "held as unknown and the provider never accepted it (the customer got \
                     nothing), yet no chaos event hit the process holding an attempt in flight \
                     and the provider cut no answer"
                        .to_string(),
                ),
            },
            _ if matches!(state, Some(State::Other(_))) => (
                end.key(),
                format!(
                    "the status API reports state `{}`, which the contract does not define \
                     (docs/stack-contract.md), so the harness cannot tell the stack is done with \
                     it; the provider never accepted it",
                    state.map_or("", State::as_str)
                ),
            ),
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
            c.insert(
                "excuse".into(),
                excuse.as_ref().map_or(Value::Null, Excuse::to_json),
            );
            not_accepted_unknown.push(excuse_json(e, false, excuse.as_ref()));
        }
        match end {
            End::Unknown if excuse.is_some() => explained.push(Value::Object(c)),
            End::Open if settling => still_settling += 1,
            End::Open if orphans.contains(e.channel) => orphaned += 1,
            _ => findings.push(Value::Object(c)),
        }
    }

    // Explained unknowns are still held for a human: at most `max_unknown` of them.
    let max_unknown = input.scenario.expect.max_unknown as usize;
    if explained.len() > max_unknown {
        for u in explained.iter().cloned() {
            findings.push(u);
        }
    }

    let unexplained = not_accepted_unknown.len() - explained.len();
    let mut summary = format!(
        "{} deliveries: {} delivered, {} permanent, {} exhausted, {} unknown and never accepted \
         ({} explained, max {max_unknown}; {unexplained} unexplained), {} lost",
        input.expected.len(),
        counts.total("delivered"),
        counts.total("permanent"),
        counts.total("exhausted"),
        counts.total("unknown"),
        explained.len(),
        counts.total("lost"),
    );
    if !accepted_unknown.is_empty() {
        summary.push_str(&format!(
            "; {} unknown to the stack but accepted by the provider",
            accepted_unknown.len()
        ));
    }
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
        "open_orphaned": orphaned,
        "max_unknown": max_unknown,
        "unknown_explained": explained.len(),
        "unknown_unexplained": unexplained,
        "unknown_accepted": accepted_unknown.len(),
        "unknown_accepted_unexplained": accepted_unexplained,
        "unknowns": not_accepted_unknown.iter().chain(&accepted_unknown).take(MAX_LISTED).collect::<Vec<_>>(),
        "permanent_then_retried": permanent_then_retried,
        "unknown_resolved": resolved.total("unknown_resolved"),
        "unknown_resolved_by_channel": resolved.to_json(),
        "quiescent": quiescent,
    }));
    findings.judged("lost", input.expected.len() as u64);
    if settling {
        findings.unjudged(
            "lost",
            input.expected.len() as u64,
            still_settling,
            0.0,
            "deliveries still open when the wait ended with the stack still settling them",
        );
    } else if orphaned > 0 {
        findings.unjudged(
            "lost",
            input.expected.len() as u64,
            orphaned,
            0.0,
            &orphans.why(),
        );
        summary.push_str(&format!(
            " ({orphaned} of them on a channel the chaos left without a sender: {})",
            orphans.describe()
        ));
    }
    for b in input.lost_batches {
        let deliveries = input
            .expected
            .iter()
            .filter(|e| *e.batch_id == *b.batch_id)
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

/// Unknown deliveries listed in the figures (`unknowns`), never-accepted ones first.
const MAX_LISTED: usize = 50;

/// One `unknown` delivery for the figures: who, whether the provider accepted it, and its excuse.
fn excuse_json(e: &super::Expected, accepted: bool, excuse: Option<&Excuse>) -> Value {
    let mut v = delivery_json(e);
    v.insert("accepted".into(), json!(accepted));
    v.insert("excuse".into(), excuse.map_or(Value::Null, Excuse::to_json));
    Value::Object(v)
}

/// Whether a status row went from `unknown` to a final state on a callback.
fn resolved_by_event(row: &StatusDelivery) -> bool {
    let mut prev: Option<State> = None;
    row.transitions.iter().any(|t| {
        let to = t.to();
        let from = t.from().or(prev.replace(to.clone()));
        from == Some(State::Unknown)
            && t.source() == Source::Callback
            && matches!(to, State::Delivered | State::PermanentFailure)
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
    fn explained_unknowns_count_against_max_unknown() {
        // (max_unknown, expected status)
        for (max_unknown, status) in [(1, Status::Holds), (0, Status::Violated)] {
            let mut w = proper_ends();
            w.scenario.expect.max_unknown = max_unknown;
            let d = w.expect("r5", Email);
            w.send(Email, &d, Transient, 0).pid(7);
            w.event(EventKind::Sigkill, Some(7), 50);
            w.status_row("r5", Email, None, &["pending", "sending", "unknown"]);
            let v = check(&w.input());
            assert_eq!(v.status, status, "max_unknown {max_unknown}: {v:#?}");
            assert_eq!(v.figures["unknown"], 1);
            assert_eq!(v.figures["unknown_explained"], 1);
            if status == Status::Violated {
                assert_eq!(rules(&v), ["unknown"]);
            }
        }
    }

    #[test]
    fn an_unknown_nothing_explains_is_a_violation_whatever_max_unknown_says() {
        let mut w = proper_ends();
        w.scenario.expect.max_unknown = 100;
        let d = w.expect("r5", Email);
        w.send(Email, &d, Transient, 0).pid(7);
        // Chaos, but on another worker and before this delivery's attempt.
        w.event(EventKind::Sigkill, Some(8), 0);
        w.send(Email, &d, Transient, 2_000).pid(7);
        w.status_row("r5", Email, None, &["pending", "sending", "unknown"]);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated, "{v:#?}");
        assert_eq!(rules(&v), ["unexplained_unknown"]);
        let c = &v.counterexamples[0];
        assert_eq!(c["recipient"], "r5");
        assert!(c["excuse"].is_null(), "{c}");
        assert_eq!(v.figures["unknown_unexplained"], 1);
        assert!(v.summary.contains("1 unexplained"), "{}", v.summary);
    }

    #[test]
    fn an_unknown_hit_by_a_kill_is_excused_naming_it() {
        let mut w = proper_ends();
        w.scenario.expect.max_unknown = 0;
        let d = w.expect("r5", Email);
        w.send(Email, &d, Transient, 0).pid(7);
        w.event(EventKind::Sigkill, Some(7), 400);
        w.status_row("r5", Email, None, &["pending", "sending", "unknown"]);
        let v = check(&w.input());
        // Explained, but over max_unknown 0: reported as `unknown` with its excuse.
        assert_eq!(rules(&v), ["unknown"]);
        let c = &v.counterexamples[0];
        assert_eq!(c["excuse"]["kind"], "chaos", "{c}");
        assert_eq!(c["excuse"]["event"]["kind"], "sigkill");
        assert_eq!(c["excuse"]["event"]["pid"], 7);
        assert!(
            c["reason"]
                .as_str()
                .unwrap()
                .contains("sigkill of pid 7 at 400.0 ms"),
            "{c}"
        );
    }

    #[test]
    fn accepted_unknowns_are_counted_apart_and_never_a_loss() {
        // (kill between request and answer?, unexplained count)
        for (killed, unexplained) in [(true, 0), (false, 1)] {
            let mut w = proper_ends();
            let d = w.expect("r5", Email);
            w.send(Email, &d, Accepted, 100).pid(7).latency(50);
            if killed {
                w.event(EventKind::Sigkill, Some(7), 120);
            }
            w.status_row("r5", Email, None, &["pending", "sending", "unknown"]);
            let v = check(&w.input());
            assert_eq!(v.status, Status::Holds, "killed {killed}: {v:#?}");
            assert_eq!(v.figures["delivered"], 2);
            assert_eq!(v.figures["unknown"], 0);
            assert_eq!(v.figures["unknown_accepted"], 1);
            assert_eq!(v.figures["unknown_accepted_unexplained"], unexplained);
            assert_eq!(v.figures["unknowns"][0]["accepted"], true);
            assert!(
                v.summary.contains("1 unknown to the stack but accepted"),
                "{}",
                v.summary
            );
        }
    }

    #[test]
    fn without_a_status_api_an_unanswered_last_attempt_is_unknown() {
        let mut w = proper_ends();
        w.scenario.expect.max_unknown = 1;
        let d = w.expect("r5", Email);
        w.send(Email, &d, Transient, 0).pid(7).hung_up();
        w.event(EventKind::Sigkill, Some(7), 2);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        assert_eq!(
            (v.figures["unknown"].as_u64(), v.figures["lost"].as_u64()),
            (Some(1), Some(0))
        );
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
        // The same delivery when the stack was still settling at the hard deadline: unjudged.
        w.quiescence.still_settling = true;
        let v = check(&w.input());
        assert_eq!(v.status, Status::Insufficient, "{v:#?}");
        assert!(v.summary.contains("still settling"), "{}", v.summary);
    }

    /// Worker 2 sent every LINE message and the chaos killed it for good: its open LINE
    /// delivery is unjudged (a stack with workers per channel had nothing left to send it), but
    /// the same delivery with a survivor that had sent LINE too is a stuck stack.
    #[test]
    fn open_on_a_channel_the_chaos_left_without_a_sender_is_unjudged() {
        let w = super::super::orphans::line_orphaned();
        let v = check(&w.input());
        assert_eq!(v.status, Status::Insufficient, "{v:#?}");
        assert_eq!(v.total_counterexamples, 0);
        assert_eq!(v.figures["open_orphaned"], 1);
        assert!(
            v.summary
                .contains("without a sender: line (worker pid 200)"),
            "{}",
            v.summary
        );

        let mut w = super::super::orphans::line_orphaned();
        let d = w.expect("r2", Line);
        w.send(Line, &d, Accepted, 20).pid(100);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated);
        assert_eq!(rules(&v), ["open"]);
        assert_eq!(v.figures["open_orphaned"], 0);
    }

    #[test]
    fn a_state_outside_the_contract_is_named_in_the_finding() {
        // A stack reporting `Delivered` (not a contract state) for a send the provider turned
        // down: never settled, so the run ends open, and the finding says why.
        let mut w = proper_ends();
        w.quiescence.reached = false;
        let d = w.expect("r8", Sms);
        w.send(Sms, &d, Transient, 0);
        w.status_row("r8", Sms, None, &["sending", "Delivered"]);
        let v = check(&w.input());
        assert_eq!(rules(&v), ["open"]);
        let why = v.counterexamples[0]["reason"].as_str().unwrap_or("");
        assert!(
            why.contains("reports state `Delivered`, which the contract does not define"),
            "{why}"
        );
    }

    #[test]
    fn an_accepted_batch_the_status_api_no_longer_knows_is_lost() {
        let mut w = proper_ends();
        assert_eq!(check(&w.input()).status, crate::check::Status::Holds);
        let batch = w.expected[0].batch_id.clone();
        w.lost_batches.push(crate::check::LostBatch {
            batch_id: batch.to_string(),
            first_missing_ns: ns(1_500),
        });
        let v = check(&w.input());
        assert_eq!(v.status, crate::check::Status::Violated, "{v:#?}");
        assert_eq!(rules(&v), ["batch_lost"]);
        assert_eq!(v.counterexamples[0]["batch_id"], batch.as_str());
        assert_eq!(v.counterexamples[0]["first_missing_ms"], 1_500.0);
    }
}
