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
//! - Both "too soon" rules add to the gap the wall clock's forward jumps inside it
//!   (`crate::jumps`): the stack waits by its clock, and a jump is time that clock counted and
//!   the ledger's did not. The cap rule counts a backward jump inside the gap like a stall.
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

use super::Entry;
use mock_providers::ledger::Outcome;
use serde_json::{json, Value};

use super::availability::{blocked_ns, past_blocked};
use super::backlog::Queue;
use super::common::{
    attempt_json, delivery_json, figures, gap_ms, is_failure, ms, Findings, ANSWER_RECORD_WINDOW_NS,
};
use super::outages::Outages;
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
fn answer_lost(input: &Input, e: &Expected, s: &Entry) -> bool {
    let lease = input.scenario.stack.lease.as_nanos() as u64;
    let rescued = input.status.is_some_and(|rows| {
        rows.iter()
            .filter(|d| *d.recipient == *e.recipient && d.channel == e.channel)
            .any(|d| d.transitions.iter().any(|t| t.source() == Source::Rescuer))
    });
    sender_hit(input, s, s.mono_ns.saturating_sub(1), s.mono_ns + lease) || rescued
}

/// Whether the answer to `s` may never have reached the stack: its sender hung up before it, or
/// was SIGKILLed or SIGSTOPped while it was in flight or just after (before it could record it).
fn answer_unheard(input: &Input, s: &Entry) -> bool {
    s.client_hung_up || sender_hit(input, s, s.received_ns, s.mono_ns + ANSWER_RECORD_WINDOW_NS)
}

/// Whether the sender of `s` was SIGKILLed or SIGSTOPped, or cut off its database (a link
/// partition or reset), within `[from, to]`.
fn sender_hit(input: &Input, s: &Entry, from: u64, to: u64) -> bool {
    input.pids.get(s.seq).is_some_and(|pid| {
        input.timeline.iter().any(|ev| {
            (ev.kind.disables_worker() || ev.kind.cuts_database_link())
                && ev.pid == Some(pid)
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
    prev: &'a Entry,
    next: &'a Entry,
}

pub fn check(input: &Input) -> Verdict {
    let sends = input.sends();
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
            // Plus the wall clock's forward jumps between them: time the stack's timers counted
            // and the ledger's clock did not (`crate::jumps`).
            let jumped =
                crate::jumps::forward_ns(input.clock_jumps, prev.received_ns, next.received_ns);
            let gap = next.received_ns as i128 - prev.received_ns as i128 + jumped as i128;
            let credit = |c: &mut Value| {
                if jumped > 0 {
                    c["clock_jumped_ms"] = json!(jumped as f64 / 1e6);
                }
            };
            let step = k.max(1);
            let fl = floor(input, step);
            // A retry that arrived before the failure was answered: two in flight at once.
            let overlapping = next.received_ns < prev.mono_ns;
            if overlapping || gap < fl.as_nanos() as i128 {
                let mut c = pair(e, "gap_below_floor", prev, next, input);
                c["failure_no"] = json!(step);
                c["floor_ms"] = json!(fl.as_secs_f64() * 1e3);
                credit(&mut c);
                findings.push(c);
            }
            if let Some(ra) = prev.retry_after_ms() {
                if gap < ra as i128 * 1_000_000 {
                    let mut c = pair(e, "retry_after_ignored", prev, next, input);
                    c["retry_after_ms"] = json!(ra);
                    credit(&mut c);
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
    let mut queue = Queue::first_attempts(sends);
    let outages = Outages::of(input);
    for r in &retries {
        let e = &input.expected[r.delivery];
        if let Some(c) = above_cap((input, &outages), &mut queue, e, r.prev, r.next, &mut n) {
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
        "worker_boot_ms": ms(input.worker_boot_ns()),
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
    chain: &[&Entry],
    max: usize,
    n: &mut Tally,
    findings: &mut Findings,
) {
    let counted: Vec<&Entry> = chain
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
    (input, outages): (&Input, &Outages),
    queue: &mut Queue,
    e: &Expected,
    prev: &Entry,
    next: &Entry,
    n: &mut Tally,
) -> Option<Value> {
    let gap = next.received_ns.saturating_sub(prev.mono_ns);
    n.longest_gap_ns = n.longest_gap_ns.max(gap);
    let b = &input.scenario.stack.backoff;
    if gap as f64 > b.max.as_nanos() as f64 * (1.0 - b.jitter) {
        n.reached_cap += 1;
    }
    let due = due_within(input, prev.retry_after_ms()).as_nanos() as u64;
    let due_at = prev.mono_ns + due;
    if sender_hit(input, prev, prev.received_ns, next.received_ns) {
        queue.add(next.received_ns, due_at);
        return None;
    }
    n.cap_judged += 1;
    let slack = input.scenario.expect.retry_cap_slack.as_nanos() as u64;
    // Time the stack could not have sent in: the database down, the machine stalled.
    let stalled = crate::stalls::stalled_ns(input.stalls, prev.mono_ns, next.received_ns)
        // And the wall clock going back: time the stack waited that its clock did not count.
        .saturating_add(crate::jumps::back_ns(
            input.clock_jumps,
            prev.mono_ns,
            next.received_ns,
        ));
    // And time a provider outage held it up (`check::outages`; may overlap the rest, which only
    // widens the allowance inside chaos the scenario asked for).
    let out = outages.out_ns(prev.provider, prev.mono_ns, next.received_ns);
    let blocked = blocked_ns(input, prev.mono_ns, next.received_ns) + stalled + out;
    let late = gap.saturating_sub(blocked);
    if late <= due + slack {
        queue.add(next.received_ns, due_at);
        return None;
    }
    // Waiting its turn is judged from the moment it fell due counting only time some worker could
    // act in: a backlog that built up while none could (every worker stopped, or the only one's
    // replacement booting) drains from when one could again.
    let due_able = past_blocked(input, prev.mono_ns, due_at);
    if queue.cover(due_able, next.received_ns, slack, due_at) {
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
fn pair(e: &Expected, rule: &str, earlier: &Entry, later: &Entry, input: &Input) -> Value {
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
#[path = "retry_discipline_tests.rs"]
mod tests;
