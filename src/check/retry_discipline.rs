//! `retry_discipline`: retries are bounded, spaced, growing, honour `Retry-After`, and stop at a
//! permanent rejection.
//!
//! Per expected delivery, over its send attempts in arrival order up to the first `Accepted` or
//! `IdempotentRepeat` (anything after that is a duplicate or a repeat: other checkers' business):
//!
//! - **too_many_attempts**: more than `expect.max_attempts` attempts.
//! - **gap_below_floor**: after the k-th `Transient` failure of the delivery, the gap from that
//!   answer (`mono_ns`) to the next attempt's arrival (`received_ns`) must be at least
//!   `min(expect.min_retry_gap × factor^(k−1), backoff.max × (1 − jitter))`. The floor growing with
//!   k is how "growing gaps" is checked: a stack that restarts its backoff from the first step (or
//!   never grows it) falls under the floor by the second or third retry, while any jittered
//!   exponential schedule stays above it because `min_retry_gap` defaults to half the base gap.
//!   The cap keeps a correct schedule that has reached `backoff.max` from being flagged. With
//!   `expect.retry_growth = false` the floor is just `min_retry_gap`. A negative gap (two
//!   attempts in flight at once) is always below the floor.
//! - **retry_after_ignored**: the gap is shorter than the `Retry-After` the provider sent.
//! - **attempt_after_permanent**: any attempt after a `Permanent` answer — unless that answer was
//!   lost: its sender was SIGKILLed or SIGSTOPped within one lease after it (the process may never
//!   have recorded it), or the stack's status shows the delivery went through its rescuer. One
//!   re-attempt after such a crash is the stack reconciling, not ignoring the provider; it is
//!   counted in the `after_permanent_lost_answer` figure.
//!
//! A `ProtocolError` answer (a malformed request) counts as an attempt but sets no floor.
//!
//! Judged: deliveries with an attempt (`too_many_attempts`, needs one), deliveries answered
//! `Permanent` (`attempt_after_permanent`, may be none), and retries after a transient failure
//! (`gap_below_floor`, `retry_after_ignored`: needs one when some transient answer left the
//! delivery with attempts to spare — a run whose providers never failed has nothing to space).
//!
//! Must never judge from the stack's own attempt counter: only ledger times count.

use std::time::Duration;

use mock_providers::ledger::{LedgerEntry, Outcome};
use serde_json::{json, Value};

use super::common::{attempt_json, delivery_json, figures, gap_ms, Findings, Sends};
use super::{Expected, Input, Verdict};

pub const NAME: &str = "retry_discipline";

/// The smallest gap allowed after the `k`-th (1-based) transient failure of a delivery.
pub fn floor(input: &Input, k: u32) -> Duration {
    let e = &input.scenario.expect;
    if !e.retry_growth {
        return e.min_retry_gap;
    }
    let b = &input.scenario.stack.backoff;
    let grown =
        e.min_retry_gap.as_secs_f64() * b.factor.powi(k.saturating_sub(1).min(1_000) as i32);
    let cap = b.max.as_secs_f64() * (1.0 - b.jitter);
    // Rounded to whole nanoseconds so `80ms × 2` is exactly 160 ms, not a hair under or over.
    Duration::from_nanos((grown.min(cap).max(0.0) * 1e9).round() as u64)
}

/// Whether the answer `s` may never have reached the stack's records: its sender was killed or
/// frozen within one lease after it, or the stack rescued the delivery.
fn answer_lost(
    input: &Input,
    e: &super::Expected,
    s: &mock_providers::ledger::LedgerEntry,
) -> bool {
    let lease = input.scenario.stack.lease.as_nanos() as u64;
    let killed = input.pids.get(&s.seq).is_some_and(|pid| {
        input.timeline.iter().any(|ev| {
            matches!(ev.kind.as_str(), "sigkill" | "sigstop")
                && ev.pid == Some(*pid)
                && ev.mono_ns + 1 >= s.mono_ns
                && ev.mono_ns <= s.mono_ns + lease
        })
    });
    let rescued = input.status.is_some_and(|rows| {
        rows.iter()
            .filter(|d| d.recipient == e.recipient && d.channel == e.channel)
            .any(|d| d.transitions.iter().any(|t| t.source == "rescuer"))
    });
    killed || rescued
}

pub fn check(input: &Input) -> Verdict {
    let sends = Sends::new(input.ledger);
    let max = input.scenario.expect.max_attempts as usize;
    let mut findings = Findings::default();
    let (mut retries, mut bad_deliveries, mut lost_answers) = (0u64, 0u64, 0u64);
    // Deliveries with an attempt; transient answers a correct stack must follow with a retry
    // (fewer failures than allowed so far); permanent answers.
    let (mut attempted, mut retry_due, mut permanents) = (0u64, 0u64, 0u64);

    for e in input.expected {
        let all = sends.of_expected(e);
        let end = all
            .iter()
            .position(|s| matches!(s.outcome, Outcome::Accepted | Outcome::IdempotentRepeat))
            .map_or(all.len(), |i| i + 1);
        let chain = &all[..end];
        let before = findings.total();
        attempted += u64::from(!chain.is_empty());
        permanents += u64::from(chain.iter().any(|s| s.outcome == Outcome::Permanent));
        let mut failures = 0usize;
        for s in chain {
            failures += usize::from(super::common::is_failure(s.outcome));
            retry_due += u64::from(s.outcome == Outcome::Transient && failures < max);
        }

        if chain.len() > max {
            let mut c = pair(e, "too_many_attempts", chain[max - 1], chain[max], input);
            c["attempts"] = json!(chain.len());
            c["max_attempts"] = json!(max);
            findings.push(c);
        }
        if let Some(p) = chain.iter().position(|s| s.outcome == Outcome::Permanent) {
            let lost = chain.get(p + 1).is_some() && answer_lost(input, e, chain[p]);
            if lost && chain.len() == p + 2 {
                lost_answers += 1;
            } else if let Some(next) = chain.get(p + 1) {
                let mut c = pair(e, "attempt_after_permanent", chain[p], next, input);
                c["later_attempts"] = json!(chain.len() - p - 1);
                findings.push(c);
            }
        }

        let mut k = 0u32;
        for w in chain.windows(2) {
            let (prev, next) = (w[0], w[1]);
            if prev.outcome != Outcome::Transient {
                continue;
            }
            k += 1;
            retries += 1;
            let gap = next.received_ns as i128 - prev.mono_ns as i128;
            let fl = floor(input, k);
            if gap < fl.as_nanos() as i128 {
                let mut c = pair(e, "gap_below_floor", prev, next, input);
                c["failure_no"] = json!(k);
                c["floor_ms"] = json!(fl.as_secs_f64() * 1e3);
                findings.push(c);
            }
            if let Some(ra) = prev.retry_after_ms {
                if gap < ra as i128 * 1_000_000 {
                    let mut c = pair(e, "retry_after_ignored", prev, next, input);
                    c["retry_after_ms"] = json!(ra);
                    findings.push(c);
                }
            }
        }
        if findings.total() > before {
            bad_deliveries += 1;
        }
    }

    let summary = format!(
        "{} deliveries, {retries} retries after transient failures: {} broken rules in {bad_deliveries} deliveries",
        input.expected.len(),
        findings.total()
    );
    let figs = figures(json!({
        "deliveries": input.expected.len(),
        "retries_checked": retries,
        "deliveries_violating": bad_deliveries,
        "min_retry_gap_ms": input.scenario.expect.min_retry_gap.as_secs_f64() * 1e3,
        "retry_growth": input.scenario.expect.retry_growth,
        "max_attempts": max,
        "after_permanent_lost_answer": lost_answers,
    }));
    findings.judged("too_many_attempts", attempted);
    findings.judged_at_least("attempt_after_permanent", permanents, 0);
    // Spacing is judged on retries; a run whose providers never asked for one has none to judge.
    let min = u64::from(retry_due > 0);
    findings.judged_at_least("gap_below_floor", retries, min);
    findings.verdict(NAME, summary, figs)
}

/// A counterexample about two attempts of one delivery.
fn pair(
    e: &Expected,
    rule: &str,
    earlier: &LedgerEntry,
    later: &LedgerEntry,
    input: &Input,
) -> Value {
    let mut c = delivery_json(e);
    c.insert("rule".into(), json!(rule));
    c.insert("earlier".into(), attempt_json(earlier, input));
    c.insert("later".into(), attempt_json(later, input));
    c.insert(
        "gap_ms".into(),
        json!(gap_ms(later.received_ns, earlier.mono_ns)),
    );
    Value::Object(c)
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn one_attempt_after_a_lost_permanent_answer_is_reconciliation() {
        // (killed at ms, expected status): the answer at 100 ms went to a worker killed at 150 ms.
        for (kill_at, status) in [(150, Status::Holds), (5_000, Status::Violated)] {
            let mut w = World::new();
            let a = w.expect("r1", Sms);
            w.send(Sms, &a, Permanent, 100).pid(7);
            w.send(Sms, &a, Permanent, 2_000).pid(8);
            w.event("sigkill", Some(7), kill_at);
            let v = check(&w.input());
            assert_eq!(v.status, status, "kill at {kill_at}: {v:#?}");
        }
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
                |w| w.ledger[0].retry_after_ms = Some(1_000),
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
}
