//! `retry_discipline`: retries are bounded, spaced, growing, capped, honour `Retry-After`, and stop
//! at a permanent rejection.
//!
//! Per expected delivery, over its send attempts in arrival order up to the first `Accepted` or
//! `IdempotentRepeat` (anything after that is a duplicate or a repeat: other checkers' business):
//!
//! - **too_many_attempts**: an attempt beyond `expect.max_attempts` (by default the stack's
//!   `TING_MAX_ATTEMPTS`). Attempts are what the provider saw: every `Send` entry of the delivery
//!   but those answered 429 (rate limited: the provider did not look at the message, and a stack
//!   may fairly not count them). A LINE 409 for a repeated retry key ends the chain (it is a
//!   repeat, not a new attempt); SMS status reads and lookups are polls, never attempts. One
//!   attempt past the limit is the stack reconciling, not ignoring it, when the answer to the last
//!   allowed attempt may never have reached it (as for `attempt_after_permanent` below): counted
//!   in `beyond_limit_lost_answer`.
//! - **gap_below_floor**: after the k-th `Transient` failure of the delivery (429s not counted, as
//!   the contract's attempts do not count them; at least 1), the gap from that attempt's arrival
//!   to the next attempt's arrival (`received_ns` both: a stack may time its gap from either end
//!   of the failed attempt, and the floor holds under both readings) must be at least
//!   `min(expect.min_retry_gap × factor^(k−1), backoff.max × (1 − jitter))`. The floor growing with
//!   k is how "growing gaps" is checked: a stack that restarts its backoff from the first step (or
//!   never grows it) falls under the floor by the second or third retry, while any jittered
//!   exponential schedule stays above it because `min_retry_gap` defaults to half the base gap.
//!   The cap keeps a correct schedule that has reached `backoff.max` from being flagged. With
//!   `expect.retry_growth = false` the floor is just `min_retry_gap`. A retry that arrived before
//!   the failed attempt was answered (two attempts in flight at once) is always below the floor.
//! - **gap_above_cap**: after a `Transient` failure the next attempt must arrive within
//!   `max(backoff.max × (1 + jitter), Retry-After as sent) + expect.retry_cap_slack` of the
//!   answer, not counting time in which no correct stack could have made it: no worker running
//!   and awake, the database down or locked by chaos (`check::availability`), the machine
//!   stalled (`crate::stalls`), the provider out for everyone until it let go of the last request
//!   it held, or any hung provider holding requests that fill the workers' shared slots
//!   (`check::outages`). Not judged when
//!   the failed attempt's sender was SIGKILLed or SIGSTOPped before the next attempt (its answer
//!   may be lost and its lease must lapse first: `recovery` judges that). A delivery that fell
//!   due (answer + cap + jitter, or the Retry-After) while the stack kept working through a queue
//!   was waiting its turn: counted in `late_behind_backlog`, not flagged. Queue work
//!   (`check::backlog`) is any delivery's first attempt, and any other retry already found on
//!   time or excused that fell due no later than this one (retries are judged in arrival order,
//!   so a drained backlog of overdue retries excuses itself in due order); it must have arrived
//!   at most the slack before the delivery fell due and then with no pause longer than the slack
//!   until its retry. A late retry that is not excused never excuses another.
//! - **retry_after_ignored**: the gap (as above, from the failed attempt's arrival) is shorter than
//!   the `Retry-After` the provider sent (the ledger records the header as sent: whole seconds for
//!   LINE and Twilio).
//! - Neither gap rule judges a retry after a failure whose answer never reached the stack, and
//!   such a failure does not count toward the floor's step: its sender hung up before the answer
//!   (`client_hung_up`) or was SIGKILLed or SIGSTOPped between the attempt's arrival and
//!   `ANSWER_RECORD_WINDOW_NS` after the answer. The next attempt follows a rescue (`recovery`
//!   judges it), not a backoff; counted in `retries_after_unheard_failures`.
//! - **attempt_after_permanent**: any attempt after a `Permanent` answer — unless that answer was
//!   lost: its sender was SIGKILLed or SIGSTOPped within one lease after it (the process may never
//!   have recorded it), or the stack's status shows the delivery went through its rescuer. One
//!   re-attempt after such a crash is the stack reconciling, not ignoring the provider; it is
//!   counted in the `after_permanent_lost_answer` figure.
//!
//! A `ProtocolError` answer (a malformed request) counts as an attempt but sets no floor or cap.
//!
//! Judged: deliveries with an attempt (`too_many_attempts`, needs one; how many made every
//! attempt allowed is the `deliveries_at_limit` figure), deliveries answered `Permanent`
//! (`attempt_after_permanent`, may be none), retries after a transient failure
//! (`gap_below_floor`, `retry_after_ignored`: needs one when some transient answer left the
//! delivery with attempts to spare — a run whose providers never failed has nothing to space),
//! and those retries whose sender was not killed or stopped before them (`gap_above_cap`, may
//! be none; how many reached the cap's range is the `gaps_reaching_cap` figure).
//!
//! Must never judge from the stack's own attempt counter: only ledger times count.

use std::collections::BTreeSet;
use std::time::Duration;

use mock_providers::ledger::{LedgerEntry, Outcome};
use serde_json::{json, Value};

use super::availability::blocked_ns;
use super::backlog::Queue;
use super::common::{
    attempt_json, delivery_json, figures, gap_ms, is_failure, ms, Findings, Sends,
    ANSWER_RECORD_WINDOW_NS,
};
use super::{Expected, Input, Source, Verdict};

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

/// The longest a correct schedule waits after a transient failure whose answer asked for
/// `retry_after_ms`: the cap plus its jitter, or the Retry-After when longer.
pub fn due_within(input: &Input, retry_after_ms: Option<u64>) -> Duration {
    let b = &input.scenario.stack.backoff;
    let cap = b.max.mul_f64(1.0 + b.jitter);
    cap.max(Duration::from_millis(retry_after_ms.unwrap_or(0)))
}

/// Whether the answer `s` may never have reached the stack's records: its sender was killed or
/// frozen within one lease after it, or the stack rescued the delivery.
fn answer_lost(input: &Input, e: &Expected, s: &LedgerEntry) -> bool {
    let lease = input.scenario.stack.lease.as_nanos() as u64;
    let rescued = input.status.is_some_and(|rows| {
        rows.iter()
            .filter(|d| d.recipient == e.recipient && d.channel == e.channel)
            .any(|d| d.transitions.iter().any(|t| t.source == Source::Rescuer))
    });
    sender_hit(input, s, s.mono_ns.saturating_sub(1), s.mono_ns + lease) || rescued
}

/// Whether the answer to `s` may never have reached the stack: its sender hung up before it, or
/// was SIGKILLed or SIGSTOPped while it was in flight or just after (before it could record it).
fn answer_unheard(input: &Input, s: &LedgerEntry) -> bool {
    s.client_hung_up || sender_hit(input, s, s.received_ns, s.mono_ns + ANSWER_RECORD_WINDOW_NS)
}

/// Whether the sender of `s` was SIGKILLed or SIGSTOPped, or cut off its database (a link
/// partition or reset), within `[from, to]`.
fn sender_hit(input: &Input, s: &LedgerEntry, from: u64, to: u64) -> bool {
    input.pids.get(&s.seq).is_some_and(|pid| {
        input.timeline.iter().any(|ev| {
            (ev.kind.disables_worker() || ev.kind.cuts_database_link())
                && ev.pid == Some(*pid)
                && (from..=to).contains(&ev.mono_ns)
        })
    })
}

/// What the checker counted, besides its findings.
#[derive(Default)]
struct Tally {
    retries: u64,
    /// Retries after a failure whose answer never reached the stack (not judged for spacing).
    unheard: u64,
    bad_deliveries: u64,
    lost_answers: u64,
    beyond_limit_lost_answer: u64,
    /// Deliveries that made every attempt allowed without an acceptance: the limit was reached.
    at_limit: u64,
    /// Retry gaps judged against the cap, and those excused behind a backlog.
    cap_judged: u64,
    late_behind_backlog: u64,
    /// Gaps that reached the cap's range (more than `backoff.max × (1 − jitter)`).
    reached_cap: u64,
    longest_gap_ns: u64,
}

/// A retry after a transient failure, for the cap rule (judged in arrival order).
struct Retry<'a> {
    delivery: usize,
    prev: &'a LedgerEntry,
    next: &'a LedgerEntry,
}

pub fn check(input: &Input) -> Verdict {
    let sends = Sends::new(input.ledger);
    let max = input.scenario.expect.max_attempts as usize;
    let mut findings = Findings::default();
    let mut n = Tally::default();
    let mut violating: BTreeSet<usize> = BTreeSet::new();
    let mut retries: Vec<Retry> = Vec::new();
    // Deliveries with an attempt; transient answers a correct stack must follow with a retry
    // (fewer failures than allowed so far); permanent answers.
    let (mut attempted, mut retry_due, mut permanents) = (0u64, 0u64, 0u64);

    for (i, e) in input.expected.iter().enumerate() {
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
            failures += usize::from(is_failure(s.outcome));
            retry_due += u64::from(s.outcome == Outcome::Transient && failures < max);
        }

        attempts_beyond_limit(input, e, chain, max, &mut n, &mut findings);
        if let Some(p) = chain.iter().position(|s| s.outcome == Outcome::Permanent) {
            let lost = chain.get(p + 1).is_some() && answer_lost(input, e, chain[p]);
            if lost && chain.len() == p + 2 {
                n.lost_answers += 1;
            } else if let Some(next) = chain.get(p + 1) {
                let mut c = pair(e, "attempt_after_permanent", chain[p], next, input);
                c["later_attempts"] = json!(chain.len() - p - 1);
                findings.push(c);
            }
        }

        // Failures so far that count as attempts (a 429 does not, as in the contract's formula).
        let mut k = 0u32;
        for w in chain.windows(2) {
            let (prev, next) = (w[0], w[1]);
            if prev.outcome != Outcome::Transient {
                continue;
            }
            retries.push(Retry {
                delivery: i,
                prev,
                next,
            });
            if answer_unheard(input, prev) {
                // The stack never learned of this failure (nor its Retry-After): its next attempt
                // follows a rescue, which `recovery` judges, not a backoff.
                n.unheard += 1;
                continue;
            }
            k += u32::from(prev.status != "429");
            n.retries += 1;
            // From the start of one attempt to the start of the next: a stack may time its gap
            // from either end of the failed attempt, and the floor holds under both readings.
            let gap = next.received_ns as i128 - prev.received_ns as i128;
            let step = k.max(1);
            let fl = floor(input, step);
            // A retry that arrived before the failure was answered: two in flight at once.
            let overlapping = next.received_ns < prev.mono_ns;
            if overlapping || gap < fl.as_nanos() as i128 {
                let mut c = pair(e, "gap_below_floor", prev, next, input);
                c["failure_no"] = json!(step);
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
            violating.insert(i);
        }
    }

    // The cap, in arrival order: each retry found on time or excused becomes queue work that
    // may excuse a later one.
    retries.sort_by_key(|r| (r.next.received_ns, r.next.seq));
    let mut queue = Queue::first_attempts(&sends);
    for r in &retries {
        let e = &input.expected[r.delivery];
        if let Some(c) = above_cap(input, &mut queue, e, r.prev, r.next, &mut n) {
            findings.push(c);
            violating.insert(r.delivery);
        }
    }
    n.bad_deliveries = violating.len() as u64;

    let summary = format!(
        "{} deliveries, {} retries after transient failures ({} reached the cap), {} at the attempt limit: {} broken rules in {} deliveries",
        input.expected.len(),
        n.retries,
        n.reached_cap,
        n.at_limit,
        findings.total(),
        n.bad_deliveries,
    );
    let figs = figures(json!({
        "deliveries": input.expected.len(),
        "retries_checked": n.retries,
        "retries_after_unheard_failures": n.unheard,
        "deliveries_violating": n.bad_deliveries,
        "min_retry_gap_ms": input.scenario.expect.min_retry_gap.as_secs_f64() * 1e3,
        "retry_growth": input.scenario.expect.retry_growth,
        "max_attempts": max,
        "deliveries_at_limit": n.at_limit,
        "beyond_limit_lost_answer": n.beyond_limit_lost_answer,
        "after_permanent_lost_answer": n.lost_answers,
        "gaps_judged_against_cap": n.cap_judged,
        "gaps_reaching_cap": n.reached_cap,
        "late_behind_backlog": n.late_behind_backlog,
        "longest_gap_ms": ms(n.longest_gap_ns),
        "cap_ms": due_within(input, None).as_secs_f64() * 1e3,
        "cap_slack_ms": input.scenario.expect.retry_cap_slack.as_secs_f64() * 1e3,
    }));
    findings.judged("too_many_attempts", attempted);
    findings.judged_at_least("attempt_after_permanent", permanents, 0);
    // Spacing is judged on retries; a run whose providers never asked for one has none to judge.
    let min = u64::from(retry_due > 0);
    findings.judged_at_least("gap_below_floor", n.retries, min);
    findings.judged_at_least("gap_above_cap", n.cap_judged, 0);
    findings.verdict(NAME, summary, figs)
}

/// Rule `too_many_attempts` on one delivery's chain of attempts.
fn attempts_beyond_limit(
    input: &Input,
    e: &Expected,
    chain: &[&LedgerEntry],
    max: usize,
    n: &mut Tally,
    findings: &mut Findings,
) {
    let counted: Vec<&LedgerEntry> = chain
        .iter()
        .copied()
        .filter(|s| s.status != "429")
        .collect();
    if counted.len() >= max && counted[..max].iter().all(|s| is_failure(s.outcome)) {
        n.at_limit += 1;
    }
    if counted.len() <= max {
        return;
    }
    if counted.len() == max + 1 && answer_lost(input, e, counted[max - 1]) {
        n.beyond_limit_lost_answer += 1;
        return;
    }
    let mut c = pair(
        e,
        "too_many_attempts",
        counted[max - 1],
        counted[max],
        input,
    );
    c["attempts"] = json!(counted.len());
    c["max_attempts"] = json!(max);
    findings.push(c);
}

/// Rule `gap_above_cap` on the retry `next` after the transient failure `prev`.
fn above_cap(
    input: &Input,
    queue: &mut Queue,
    e: &Expected,
    prev: &LedgerEntry,
    next: &LedgerEntry,
    n: &mut Tally,
) -> Option<Value> {
    let gap = next.received_ns.saturating_sub(prev.mono_ns);
    n.longest_gap_ns = n.longest_gap_ns.max(gap);
    let b = &input.scenario.stack.backoff;
    if gap as f64 > b.max.as_nanos() as f64 * (1.0 - b.jitter) {
        n.reached_cap += 1;
    }
    let due = due_within(input, prev.retry_after_ms).as_nanos() as u64;
    let due_at = prev.mono_ns + due;
    if sender_hit(input, prev, prev.received_ns, next.received_ns) {
        queue.add(next.received_ns, due_at);
        return None;
    }
    n.cap_judged += 1;
    let slack = input.scenario.expect.retry_cap_slack.as_nanos() as u64;
    // Time the stack could not have sent in: the database down, the machine stalled.
    let stalled = crate::stalls::stalled_ns(input.stalls, prev.mono_ns, next.received_ns);
    // And time a provider outage held it up (`check::outages`; may overlap the rest, which only
    // widens the allowance inside chaos the scenario asked for).
    let out = super::outages::out_ns(input, prev.provider, prev.mono_ns, next.received_ns);
    let blocked = blocked_ns(input, prev.mono_ns, next.received_ns) + stalled + out;
    let late = gap.saturating_sub(blocked);
    if late <= due + slack {
        queue.add(next.received_ns, due_at);
        return None;
    }
    if queue.cover(due_at, next.received_ns, slack, due_at) {
        n.late_behind_backlog += 1;
        queue.add(next.received_ns, due_at);
        return None;
    }
    let mut c = pair(e, "gap_above_cap", prev, next, input);
    c["allowed_ms"] = json!((due + slack) as f64 / 1e6);
    c["blocked_ms"] = json!(blocked as f64 / 1e6);
    Some(c)
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
                |w| w.ledger[0].retry_after_ms = Some(5_000),
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
                    let first: Vec<String> =
                        (0..3).map(|i| w.expect(&format!("f{i}"), Sms)).collect();
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
                    w.event(EventKind::ProviderOutage, None, 100);
                    w.event(EventKind::ProviderOutageEnd, None, 2_000);
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
                    w.event(EventKind::ProviderOutage, None, 100);
                    w.event(EventKind::ProviderOutageEnd, None, 2_000);
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
                    w.event(EventKind::ProviderOutage, None, 100);
                    w.event(EventKind::ProviderOutageEnd, None, 4_000);
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
                |w| w.ledger[1].status = "429".into(),
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
}
