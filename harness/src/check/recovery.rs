//! `recovery`: after a worker is SIGKILLed or SIGSTOPped, the work it held moves on in time, and
//! a frozen worker that wakes up does not send what someone else already delivered.
//!
//! For each `sigkill`/`sigstop` timeline event (pid P at time T), the deliveries P had in flight
//! at T — a request from P that arrived before T and was answered after `T − IN_FLIGHT_WINDOW`
//! (an answer just before the kill may not have been recorded by P) — with no final answer by T
//! (no `Accepted`, repeat or `Permanent`, and not yet exhausted) are held by P's lease alone. Each
//! must be **released** by the **deadline** `max(T + lease, A) + recovery_slack`, where A is the
//! first moment at or after T that some worker can act: another worker alive and not stopped, a
//! replacement started later and booted (`availability::ready_ns`: its start plus the stack's
//! boot time as the run measured it on the first workers), or P itself after its SIGCONT. After
//! A, time in which again no worker could act (every one stopped or being replaced, or the
//! database out: `availability::past_blocked`) extends the deadline by as much. So a stop shorter
//! than the lease is judged like a kill, and when the only worker was killed the clock starts at
//! its replacement.
//! When the last answer before T was a transient failure, the nominal backoff (plus jitter, or a
//! longer `Retry-After` as sent) from that answer also extends the deadline, and so does every
//! stall of the machine between T and the deadline (`crate::stalls`), and every backward jump of
//! the wall clock the stack times its lease by (`crate::jumps`).
//!
//! Released means claimable again, whoever then gets to it and when:
//! - the stack's status API records a transition out of `sending` after the answer to P's
//!   request (by P itself, even a moment before the kill; by P after its SIGCONT; or by a
//!   rescuer) — the moment it was recorded, by the stack's wall clock placed on the ledger clock
//!   (`wallclock`: by the ledger's own stamps and the clock's jumps, so a slewed or stepped
//!   clock does not move a release past the kill); or
//! - the ledger shows a next attempt, or a final answer to the request in flight at T.
//!
//! A released delivery then waits for its backoff and for the queue: that wait is reported as a
//! figure (`slowest_wait_after_release_ms`), never judged here (`no_loss` judges that it ends).
//! Where the stack records no release for the delivery (no status API, no timed transitions, or
//! none found after the answer: a stack with a status API gets no less leeway than one without),
//! the ledger's next attempt is the only sign; one after the deadline is still not a failure to recover when the stack kept
//! starting never-tried deliveries (first attempts) from the deadline until it, never pausing
//! longer than `recovery_slack` (`check::backlog`): it was waiting its turn. Rule
//! **no_progress** otherwise.
//!
//! Rule **zombie_duplicate**: an `Accepted` send from P that arrived after T, for a delivery some
//! other pid got `Accepted` after T and before it arrived (a worker resumed after losing its lease
//! and sent anyway) — unless the stack's status API shows the delivery claimed anew (a transition
//! into `sending`) after both P's SIGCONT and that accept: a send under a lease acquired after the
//! wake-up is not a zombie's (if it is a duplicate, `exactly_once` names it). A `sending` row with
//! no such claim is never evidence either way; only the ledger decides that a send happened. Nor
//! is P's first send within 25 ms of its SIGCONT (`availability::resumed_mid_send`): it was under
//! way when P froze, past the last check any process can make (`sends_resumed_mid_send`); any
//! further send in that window is judged.
//!
//! A delivery the victim's own send had settled at the provider an instant before T, its answer
//! still on the way (the crash window: `on_accept`), is final on the ledger but still the
//! victim's row in the stack: it is judged by that row leaving `sending` on the stack's own timed
//! record, or a later attempt, by the same deadline ([`Caught`]).
//!
//! A held delivery not recovered in time on a channel the chaos left with no worker that had ever
//! sent it ([`super::orphans`]: every sender stopped for good, so nothing serves it, rescuer
//! included, in a stack with workers per channel) is not judged, only counted (`orphaned`): it is
//! still open, and `no_loss` leaves it unjudged and the run INCONCLUSIVE.
//!
//! Judged: the unfinished deliveries the victims held, those caught in the crash window among
//! them (`no_progress`: needs one — a kill or stop that caught nothing in flight tested nothing;
//! no kill or stop at all means not checked), and
//! acceptances after each event of a delivery already accepted (`zombie_duplicate`). Both need
//! the sender pid: a delivery in flight at an event with no known sender that was not recovered
//! in time (it may have been the victim's), or a repeated acceptance with no known sender (it may
//! have been a zombie's), is unjudged, and more than 1% of them makes the verdict insufficient.

use std::collections::{BTreeMap, HashSet};

use mock_providers::ledger::{EntryKind, Outcome, Provider};
use serde_json::json;

use super::availability::{past_blocked, stops};
use super::backlog::Queue;
use super::common::{
    attempt_json, channel_of, figures, gap_ms, is_failure, is_final, ms, not_checked, ByAddress,
    Findings, Sends, ANSWER_RECORD_WINDOW_NS,
};
use super::wallclock::WallClock;
use super::{Entry, Expected, Input, State, StatusDelivery, TimelineEvent, Verdict};

pub const NAME: &str = "recovery";

/// How far the stack's transition times (milliseconds, its clock) placed on the ledger clock
/// (`WallClock`, from entries stamped to the millisecond) may disagree with it.
const CLOCK_TOLERANCE_NS: u64 = 2_000_000;

/// One recorded transition of a delivery, on the ledger clock.
struct Moved {
    from: Option<State>,
    to: State,
    at_ns: u64,
}

/// The delivery's transitions that carry a time, on the ledger clock; `None` when the stack has
/// no status API, no row for it, or no timed transition (then only the ledger can tell).
fn timed_transitions(
    clock: Option<&WallClock>,
    row: Option<&StatusDelivery>,
) -> Option<Vec<Moved>> {
    let (clock, row) = (clock?, row?);
    let moved: Vec<Moved> = row
        .transitions
        .iter()
        .filter_map(|tr| {
            // A time centuries past the run (a stack's clock or format gone wrong) is no
            // time on the ledger clock: left out, as an untimed transition is.
            let at_ns = clock.ledger_ns(tr.at()?.millis()?)?;
            Some(Moved {
                from: tr.from(),
                to: tr.to(),
                at_ns,
            })
        })
        .collect();
    (!moved.is_empty()).then_some(moved)
}

/// The delivery's row in the stack's status API.
fn row_of<'a>(input: &Input<'a>, e: Option<&Expected>) -> Option<&'a StatusDelivery> {
    input.status_row(e?)
}

/// The first recorded move out of `sending` after `after`.
fn released_after(moved: &[Moved], after: u64) -> Option<u64> {
    moved
        .iter()
        .filter(|m| m.from == Some(State::Sending) && m.at_ns > after)
        .map(|m| m.at_ns)
        .min()
}

/// The first moment at or after `t` a worker other than `victim` can act, or `victim` itself
/// after a SIGCONT. `Some(t)` when no process records exist (nothing to say otherwise).
fn first_able(input: &Input, victim: u32, t: u64) -> Option<u64> {
    let workers: Vec<_> = input
        .processes
        .iter()
        .filter(|p| p.role == super::Role::Worker)
        .collect();
    if workers.is_empty() {
        return Some(t);
    }
    workers
        .iter()
        .filter_map(|p| {
            let mut at = t.max(super::availability::ready_ns(input, p));
            let periods = stops(input.timeline, p.pid);
            if p.pid == victim {
                // The victim acts again only after a SIGCONT following this very stop.
                let (_, cont) = periods.iter().rev().find(|(s, _)| *s <= t)?;
                at = (*cont)?.max(at);
            }
            for (s, c) in &periods {
                if *s <= at && c.is_none_or(|c| c > at) {
                    at = (*c)?;
                }
            }
            p.exited_ns.is_none_or(|x| x > at).then_some(at)
        })
        .min()
}

/// A delivery the victim's own send had settled at the provider an instant before the event,
/// the answer still on its way to the victim (the crash window): final on the ledger, still the
/// victim's row in the stack. Progress is the row leaving `sending` on the stack's own timed
/// record, or a later attempt on the ledger (a retry under its key), by the deadline. Late, or a
/// row still `sending` at the end, is `no_progress`. Not judged: a row the victim itself
/// released before T (it had recorded the answer: nothing was caught), a row that left
/// `sending` with no time on record, and a delivery without a status API row.
struct Caught<'a> {
    moved: &'a [Moved],
    answer: &'a Entry,
    /// The delivery's first send after the event.
    next: Option<&'a Entry>,
    still_sending: bool,
    deadline: u64,
}

impl Caught<'_> {
    fn judge(
        &self,
        input: &Input,
        e: Option<&Expected>,
        ev: &TimelineEvent,
        n: &mut Tally,
        findings: &mut Findings,
    ) {
        let t = ev.mono_ns;
        let after = t
            .min(self.answer.mono_ns.saturating_sub(CLOCK_TOLERANCE_NS))
            .max(self.answer.received_ns);
        let released = released_after(self.moved, after);
        // Released before T: the victim had read and recorded the answer, nothing was caught.
        if released.is_some_and(|r| r <= t) {
            return;
        }
        let next = self.next.map(|s| s.received_ns);
        let progress = released.into_iter().chain(next).min();
        if progress.is_none() && !self.still_sending {
            return;
        }
        n.at_risk += 1;
        n.caught_answers += 1;
        match progress {
            Some(p) if p <= self.deadline => n.worst_ns = n.worst_ns.max(p.saturating_sub(t)),
            _ => findings.push(json!({
                "rule": "no_progress",
                "recipient": e.map(|e| e.recipient.as_str()),
                "channel": channel_of(self.answer.provider).as_str(),
                "address": self.answer.recipient.as_str(),
                "event": ev.kind,
                "pid": ev.pid,
                "t_ms": ms(t),
                "answer_caught_in_flight": attempt_json(self.answer, input),
                "deadline_ms": ms(self.deadline),
                "released_ms": released.map(ms),
                "next_ms": next.map(ms),
            })),
        }
    }
}

/// What the checker counted over all kill/stop events.
#[derive(Default)]
struct Tally {
    at_risk: u64,
    /// Of them, settled at the provider by the victim's own send whose answer it never got.
    caught_answers: u64,
    zombies: u64,
    /// In flight at an event with no known sender (may have been the victim's), and those of
    /// them not recovered in time (could hide a `no_progress`).
    unknown_held: u64,
    unknown_unrecovered: u64,
    /// Acceptances after an event that follow another acceptance, and those with no known
    /// sender (each may have been a zombie's).
    repeats: u64,
    repeats_unknown: u64,
    /// Released by the stack's own record before the kill (the answer had been recorded).
    released_before_kill: u64,
    /// Late by the ledger alone, but the stack was working through never-tried deliveries.
    behind_backlog: u64,
    /// A woken worker's send under a claim made after its wake-up (not a zombie's).
    fresh_claims_after_wake: u64,
    /// A woken worker's sends that arrived within `RESUMED_MID_SEND_NS` of its SIGCONT.
    resumed_mid_send: u64,
    /// Not recovered in time, on a channel the chaos left with no worker that had sent it.
    orphaned: u64,
    worst_ns: u64,
    worst_wait_ns: u64,
}

pub fn check(input: &Input) -> Verdict {
    let events: Vec<&TimelineEvent> = input
        .timeline
        .iter()
        .filter(|e| e.kind.disables_worker() && e.pid.is_some())
        .collect();
    if events.is_empty() {
        return not_checked(NAME, "no worker was SIGKILLed or SIGSTOPped");
    }
    let sends = input.sends();
    let first_attempts = Queue::first_attempts(sends);
    let expected = ByAddress::new(input.expected);
    let (lease, slack) = (
        input.scenario.stack.lease.as_nanos() as u64,
        input.scenario.expect.recovery_slack.as_nanos() as u64,
    );
    let backoff = &input.scenario.stack.backoff;
    let max = input.scenario.expect.max_attempts as usize;
    let mut findings = Findings::default();
    let mut n = Tally::default();
    let clock = WallClock::of(input.ledger, input.clock_jumps);
    let under_way = super::availability::resumed_mid_send(input);
    let orphans = input.orphans();

    for ev in &events {
        let (t, pid) = (ev.mono_ns, ev.pid.unwrap_or_default());
        let able = first_able(input, pid, t);
        let base = t
            .saturating_add(lease)
            .max(able.unwrap_or(0))
            .saturating_add(slack);
        for s in input.ledger.iter().filter(|s| {
            s.kind == EntryKind::Send && s.outcome == Outcome::Accepted && s.received_ns > t
        }) {
            let repeat = sends
                .by_key(s.provider, &s.recipient)
                .iter()
                .any(|o| o.outcome == Outcome::Accepted && o.mono_ns < s.received_ns);
            n.repeats += u64::from(repeat);
            n.repeats_unknown += u64::from(repeat && !input.pids.contains(s.seq));
        }
        // In flight at T (or answered so shortly before that P may not have recorded it): P's
        // own sends, and those whose sender is unknown (`false`: not known to be P's).
        let mut held: BTreeMap<(Provider, &str), bool> = BTreeMap::new();
        for e in input.ledger.iter().filter(|e| {
            e.kind == EntryKind::Send
                && e.received_ns <= t
                && e.mono_ns + ANSWER_RECORD_WINDOW_NS > t
        }) {
            match input.pids.get(e.seq) {
                Some(p) if p == pid => {
                    held.insert((e.provider, e.recipient.as_str()), true);
                }
                None => {
                    held.entry((e.provider, e.recipient.as_str()))
                        .or_insert(false);
                }
                Some(_) => {}
            }
        }

        // Once some worker could act, time in which none could (the harness stopped or replaced
        // every one, or had the database out) does not count against the slack. A machine that
        // stopped running processes after T gives the stack that much longer. The stack times
        // the lease by the wall clock: a backward jump lengthens it.
        let from = able.unwrap_or(t).max(t);
        let widen = |deadline: u64| {
            let d = past_blocked(input, from, deadline);
            crate::stalls::extended(input.stalls, t, d).saturating_add(crate::jumps::back_ns(
                input.clock_jumps,
                t,
                d,
            ))
        };
        for ((provider, address), victims) in held {
            let all = sends.by_key(provider, address);
            let answered: Vec<_> = all.iter().filter(|s| s.mono_ns <= t).collect();
            let finals: Vec<&Entry> = answered
                .iter()
                .filter(|s| is_final(s.outcome))
                .map(|s| **s)
                .collect();
            if !finals.is_empty() {
                // Final for the provider before T. When only the victim's own send, its answer
                // still on the way to it, made it so (the crash window), the row is still the
                // victim's in the stack: judged by its release.
                let caught = finals.iter().all(|s| {
                    s.mono_ns + ANSWER_RECORD_WINDOW_NS > t && input.pids.get(s.seq) == Some(pid)
                });
                let e = expected.get(provider, address);
                let row = row_of(input, e);
                let moved = timed_transitions(clock.as_ref(), row);
                if let (true, Some(moved), Some(m)) = (victims && caught, moved, finals.last()) {
                    let judged = Caught {
                        moved: &moved,
                        answer: m,
                        next: all.iter().find(|s| s.received_ns > t).copied(),
                        still_sending: row.is_some_and(|r| r.state == State::Sending),
                        deadline: widen(base),
                    };
                    judged.judge(input, e, ev, &mut n, &mut findings);
                }
                continue;
            }
            if answered.iter().filter(|s| is_failure(s.outcome)).count() >= max {
                continue;
            }
            if victims {
                n.at_risk += 1;
            } else {
                n.unknown_held += 1;
            }
            let mut deadline = base;
            let in_flight = all.iter().any(|s| s.received_ns <= t && s.mono_ns > t);
            if let (false, Some(last)) = (
                in_flight,
                answered.last().filter(|s| s.outcome == Outcome::Transient),
            ) {
                let k = answered
                    .iter()
                    .filter(|s| s.outcome == Outcome::Transient)
                    .count() as u32;
                let gap = backoff.nominal_gap(k).as_nanos() as f64 * (1.0 + backoff.jitter);
                let gap = (gap as u64).max(last.retry_after_ms().unwrap_or(0) * 1_000_000);
                deadline = deadline.max(last.mono_ns + gap + slack);
            }
            let deadline = widen(deadline);
            // Progress on the ledger: a later attempt's arrival, or a final answer to one in
            // flight at T.
            let next_attempt = all
                .iter()
                .find(|s| s.received_ns > t)
                .map(|s| s.received_ns);
            let final_answer = all
                .iter()
                .filter(|s| s.received_ns <= t && s.mono_ns > t && is_final(s.outcome))
                .map(|s| s.mono_ns)
                .min();
            let on_ledger = next_attempt.into_iter().chain(final_answer).min();
            // The stack's own release, recorded after the answer to P's request.
            let e = expected.get(provider, address);
            let moved = timed_transitions(clock.as_ref(), row_of(input, e));
            // P's request (or, for an unknown sender, the one in flight with none known).
            let mine = all.iter().rfind(|s| {
                s.received_ns <= t
                    && input.pids.get(s.seq).is_none_or(|p| p == pid)
                    && (victims || !input.pids.contains(s.seq))
            });
            let released = moved.as_deref().zip(mine).and_then(|(moved, m)| {
                let after = t
                    .min(m.mono_ns.saturating_sub(CLOCK_TOLERANCE_NS))
                    .max(m.received_ns);
                released_after(moved, after)
            });
            let progress = on_ledger.into_iter().chain(released).min();
            if let Some(p) = progress.filter(|p| *p <= deadline) {
                n.worst_ns = n.worst_ns.max(p.saturating_sub(t));
                if let Some(r) = released.filter(|r| *r == p) {
                    n.released_before_kill += u64::from(r <= t);
                    let next = all.iter().find(|s| s.received_ns > r);
                    if let Some(next) = next {
                        n.worst_wait_ns = n.worst_wait_ns.max(next.received_ns - r);
                    }
                }
                continue;
            }
            // With no release of its own on record (no status API, or none found after the
            // answer), the ledger alone judges, and a next attempt that waited its turn behind
            // queue work is excused the same way for every stack.
            if let (None, Some(p)) = (released, on_ledger) {
                if first_attempts.cover(deadline, p, slack, u64::MAX) {
                    n.behind_backlog += 1;
                    n.worst_wait_ns = n.worst_wait_ns.max(p - deadline);
                    continue;
                }
            }
            if !victims {
                n.unknown_unrecovered += 1;
                continue;
            }
            // Nothing left that sends its channel: `no_loss` leaves it open and unjudged.
            if orphans.contains(channel_of(provider)) {
                n.at_risk -= 1;
                n.orphaned += 1;
                continue;
            }
            let last = all.iter().rfind(|s| s.received_ns <= t);
            findings.push(json!({
                "rule": "no_progress",
                "recipient": e.map(|e| e.recipient.as_str()),
                "channel": channel_of(provider).as_str(),
                "address": address,
                "event": ev.kind,
                "pid": pid,
                "t_ms": ms(t),
                "workers_able_from_ms": able.map(ms),
                "last_attempt": last.map(|s| attempt_json(s, input)),
                "in_flight_at_t": in_flight,
                "deadline_ms": ms(deadline),
                "released_ms": released.map(ms),
                "next_ms": progress.map_or(json!("none"), |p| json!(ms(p))),
            }));
        }
        zombies(
            input,
            sends,
            &expected,
            ev,
            &under_way,
            clock.as_ref(),
            &mut n,
            &mut findings,
        );
    }

    let not_recovered = findings.total() as u64 - n.zombies;
    let mut summary = format!(
        "{} kill/stop events: {} unfinished deliveries held by the victims ({} settled at the provider with the answer on its way), \
         {not_recovered} not recovered in time, {} zombie duplicates; slowest recovery {} ms, slowest wait after release {} ms",
        events.len(),
        n.at_risk,
        n.caught_answers,
        n.zombies,
        ms(n.worst_ns),
        ms(n.worst_wait_ns),
    );
    if n.orphaned > 0 {
        summary.push_str(&format!(
            "; {} not recovered on a channel the chaos left without a sender ({}), judged by \
             no_loss",
            n.orphaned,
            orphans.describe()
        ));
    }
    let figs = figures(json!({
        "deliveries_at_risk": n.at_risk,
        "answers_caught_in_flight": n.caught_answers,
        "not_recovered": not_recovered,
        "zombie_duplicates": n.zombies,
        "released_before_kill": n.released_before_kill,
        "behind_backlog": n.behind_backlog,
        "orphaned": n.orphaned,
        "fresh_claims_after_wake": n.fresh_claims_after_wake,
        "sends_resumed_mid_send": n.resumed_mid_send,
        "slowest_recovery_ms": ms(n.worst_ns),
        "slowest_wait_after_release_ms": ms(n.worst_wait_ns),
        "worker_boot_ms": ms(input.worker_boot_ns()),
        "lease_ms": input.scenario.stack.lease.as_millis() as u64,
        "slack_ms": input.scenario.expect.recovery_slack.as_millis() as u64,
    }));
    // A kill or stop that held nothing unfinished tested nothing: recovery judged nothing.
    findings.judged("no_progress", n.at_risk);
    findings.unattributed(
        "no_progress",
        n.at_risk + n.unknown_held,
        n.unknown_unrecovered,
    );
    findings.judged_at_least("zombie_duplicate", n.repeats - n.repeats_unknown, 0);
    findings.unattributed("zombie_duplicate", n.repeats, n.repeats_unknown);
    findings.verdict(NAME, summary, figs)
}

/// Rule `zombie_duplicate` for one kill/stop event: P's accepted sends arriving after T, for a
/// delivery another pid got accepted after T and before them, not under a claim made after P's
/// wake-up and that accept.
fn zombies(
    input: &Input,
    sends: &Sends,
    expected: &ByAddress,
    ev: &TimelineEvent,
    under_way: &HashSet<u64>,
    clock: Option<&WallClock>,
    n: &mut Tally,
    findings: &mut Findings,
) {
    let (t, pid) = (ev.mono_ns, ev.pid.unwrap_or_default());
    let woke_at = stops(input.timeline, pid)
        .into_iter()
        .find(|(s, _)| *s == t)
        .and_then(|(_, c)| c)
        .unwrap_or(t);
    let woke = input.ledger.iter().filter(|s| {
        s.kind == EntryKind::Send
            && s.outcome == Outcome::Accepted
            && s.received_ns > t
            && input.pids.get(s.seq) == Some(pid)
    });
    for s in woke {
        if under_way.contains(&s.seq) {
            // Under way when the process froze: it could not re-check its lease in between.
            n.resumed_mid_send += 1;
            continue;
        }
        let first = sends.by_key(s.provider, &s.recipient).iter().find(|o| {
            o.outcome == Outcome::Accepted
                && o.mono_ns > t
                && o.mono_ns < s.received_ns
                && input.pids.get(o.seq) != Some(pid)
        });
        let Some(first) = first else { continue };
        let e = expected.get(s.provider, &s.recipient);
        let claimed_anew = timed_transitions(clock, row_of(input, e)).is_some_and(|moved| {
            let after = woke_at.max(first.mono_ns.saturating_sub(CLOCK_TOLERANCE_NS));
            moved
                .iter()
                .any(|m| m.to == State::Sending && m.at_ns > after && m.at_ns <= s.received_ns)
        });
        if claimed_anew {
            n.fresh_claims_after_wake += 1;
            continue;
        }
        n.zombies += 1;
        findings.push(json!({
            "rule": "zombie_duplicate",
            "recipient": e.map(|e| e.recipient.as_str()),
            "channel": channel_of(s.provider).as_str(),
            "address": s.recipient,
            "event": ev.kind,
            "pid": pid,
            "t_ms": ms(t),
            "woke_ms": (woke_at > t).then(|| ms(woke_at)),
            "first_accept": attempt_json(first, input),
            "zombie_accept": attempt_json(s, input),
            "after_first_ms": gap_ms(s.received_ns, first.mono_ns),
        }));
    }
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod tests;
