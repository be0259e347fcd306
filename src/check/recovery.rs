//! `recovery`: after a worker is SIGKILLed or SIGSTOPped, the work it held moves on in time, and
//! a frozen worker that wakes up does not send what someone else already delivered.
//!
//! For each `sigkill`/`sigstop` timeline event (pid P at time T), the deliveries P had in flight
//! at T — a request that arrived before T and was answered after `T − IN_FLIGHT_WINDOW` (an answer
//! just before the kill may not have been recorded by P) — with no final answer by T (no
//! `Accepted`, repeat or `Permanent`, and not yet exhausted) are held by P's lease alone. Each must
//! see progress by the **deadline** `max(T + lease, A) + recovery_slack`: a next attempt, a final
//! answer to the in-flight request, or — where the stack has a status API — a transition out of
//! `sending` (the lease was recovered; a rescued row may then wait its turn behind a backlog, which
//! is the queue's business, judged by `no_loss`, not a failure to recover). A is
//! the first moment at or after T that some worker can act: another worker alive and not stopped,
//! a replacement started later, or P itself after its SIGCONT. So a stop shorter than the lease is
//! judged like a kill (P, or a rescuer once the lease lapses, must move by `T + lease + slack`),
//! and when the only worker was killed the clock starts at its replacement. When the last answer
//! before T was a transient failure, the nominal backoff (plus jitter) from that answer also
//! extends the deadline. Rule **no_progress** otherwise.
//!
//! Rule **zombie_duplicate**: an `Accepted` send from P that arrived after T, for a delivery some
//! other pid had already got `Accepted` before it arrived (a worker resumed after losing its lease
//! and sent anyway). Must never use the stack's status API: a stuck `sending` row is not evidence.
//!
//! Judged: the unfinished deliveries the victims held (`no_progress`: needs one — a kill or stop
//! that caught nothing in flight tested nothing; no kill or stop at all means not checked), and
//! acceptances after each event of a delivery already accepted (`zombie_duplicate`). Both need
//! the sender pid: a delivery in flight at an event with no known sender that was not recovered
//! in time (it may have been the victim's), or a repeated acceptance with no known sender (it may
//! have been a zombie's), is unjudged, and more than 1% of them makes the verdict insufficient.

use std::collections::{BTreeMap, HashMap};

use mock_providers::ledger::{EntryKind, Outcome, Provider};
use serde_json::json;

use super::common::{
    attempt_json, channel_of, figures, gap_ms, is_failure, is_final, ms, not_checked, Findings,
    Sends,
};
use super::{Expected, Input, TimelineEvent, Verdict};

pub const NAME: &str = "recovery";

/// An answer this close before the kill may not have been recorded by the victim.
const IN_FLIGHT_WINDOW_NS: u64 = 100_000_000;

/// Ledger-clock nanoseconds → wall-clock milliseconds offset, from any ledger entry.
fn wall_offset_ms(input: &Input) -> Option<i64> {
    let e = input.ledger.first()?;
    let wall = chrono::DateTime::parse_from_rfc3339(&e.wall)
        .ok()?
        .timestamp_millis();
    Some(wall - (e.mono_ns / 1_000_000) as i64)
}

/// When the stack says the delivery left `sending` after `t` (ledger clock), if it does.
fn left_sending_after(
    input: &Input,
    offset: Option<i64>,
    e: Option<&&Expected>,
    t: u64,
) -> Option<u64> {
    let (offset, e, rows) = (offset?, e?, input.status?);
    let row = rows
        .iter()
        .find(|d| d.recipient == e.recipient && d.channel == e.channel)?;
    row.transitions.iter().find_map(|tr| {
        let at = chrono::DateTime::parse_from_rfc3339(tr.at.as_deref()?)
            .ok()?
            .timestamp_millis();
        let mono = ((at - offset).max(0) as u64) * 1_000_000;
        (tr.from.as_deref() == Some("sending") && mono > t).then_some(mono)
    })
}

/// Periods `[stop, cont)` during which `pid` was stopped (`None`: never continued).
fn stops(timeline: &[TimelineEvent], pid: u32) -> Vec<(u64, Option<u64>)> {
    let mut out: Vec<(u64, Option<u64>)> = Vec::new();
    let mut evs: Vec<&TimelineEvent> = timeline.iter().filter(|e| e.pid == Some(pid)).collect();
    evs.sort_by_key(|e| e.mono_ns);
    for e in evs {
        match e.kind.as_str() {
            "sigstop" => out.push((e.mono_ns, None)),
            "sigcont" => {
                if let Some(last) = out.last_mut().filter(|s| s.1.is_none()) {
                    last.1 = Some(e.mono_ns);
                }
            }
            _ => {}
        }
    }
    out
}

/// The first moment at or after `t` a worker other than `victim` can act, or `victim` itself
/// after a SIGCONT. `Some(t)` when no process records exist (nothing to say otherwise).
fn first_able(input: &Input, victim: u32, t: u64) -> Option<u64> {
    let workers: Vec<_> = input
        .processes
        .iter()
        .filter(|p| p.role == "worker")
        .collect();
    if workers.is_empty() {
        return Some(t);
    }
    workers
        .iter()
        .filter_map(|p| {
            let mut at = t.max(p.started_ns);
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

pub fn check(input: &Input) -> Verdict {
    let events: Vec<&TimelineEvent> = input
        .timeline
        .iter()
        .filter(|e| matches!(e.kind.as_str(), "sigkill" | "sigstop") && e.pid.is_some())
        .collect();
    if events.is_empty() {
        return not_checked(NAME, "no worker was SIGKILLed or SIGSTOPped");
    }
    let sends = Sends::new(input.ledger);
    let expected: HashMap<(Provider, &str), &Expected> = input
        .expected
        .iter()
        .map(|e| ((e.channel.provider(), e.address.as_str()), e))
        .collect();
    let (lease, slack) = (
        input.scenario.stack.lease.as_nanos() as u64,
        input.scenario.expect.recovery_slack.as_nanos() as u64,
    );
    let backoff = &input.scenario.stack.backoff;
    let max = input.scenario.expect.max_attempts as usize;
    let mut findings = Findings::default();
    let (mut at_risk, mut zombies, mut worst_ns) = (0u64, 0u64, 0u64);
    // Deliveries whose in-flight send at an event had no known sender (it may have been the
    // victim's): those not recovered in time could hide a `no_progress`. Acceptances after an
    // event that follow another acceptance, and those among them with no known sender (each may
    // have been a zombie's).
    let (mut unknown_held, mut unknown_unrecovered) = (0u64, 0u64);
    let (mut repeats, mut repeats_unknown) = (0u64, 0u64);
    let offset = wall_offset_ms(input);

    for ev in events {
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
            repeats += u64::from(repeat);
            repeats_unknown += u64::from(repeat && !input.pids.contains_key(&s.seq));
        }
        // In flight at T (or answered so shortly before that P may not have recorded it): P's
        // own sends, and those whose sender is unknown (`false`: not known to be P's).
        let mut held: BTreeMap<(Provider, &str), bool> = BTreeMap::new();
        for e in input.ledger.iter().filter(|e| {
            e.kind == EntryKind::Send && e.received_ns <= t && e.mono_ns + IN_FLIGHT_WINDOW_NS > t
        }) {
            match input.pids.get(&e.seq) {
                Some(p) if *p == pid => {
                    held.insert((e.provider, e.recipient.as_str()), true);
                }
                None => {
                    held.entry((e.provider, e.recipient.as_str()))
                        .or_insert(false);
                }
                Some(_) => {}
            }
        }

        for ((provider, address), victims) in held {
            let all = sends.by_key(provider, address);
            let answered: Vec<_> = all.iter().filter(|s| s.mono_ns <= t).collect();
            if answered.iter().any(|s| is_final(s.outcome))
                || answered.iter().filter(|s| is_failure(s.outcome)).count() >= max
            {
                continue;
            }
            if victims {
                at_risk += 1;
            } else {
                unknown_held += 1;
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
                let gap = (gap as u64).max(last.retry_after_ms.unwrap_or(0) * 1_000_000);
                deadline = deadline.max(last.mono_ns + gap + slack);
            }
            // Progress: a later attempt's arrival, or a final answer to one in flight at T.
            let progress = all
                .iter()
                .filter_map(|s| {
                    if s.received_ns > t {
                        Some(s.received_ns)
                    } else if s.mono_ns > t && is_final(s.outcome) {
                        Some(s.mono_ns)
                    } else {
                        None
                    }
                })
                .min();
            let e = expected.get(&(provider, address));
            let rescued = left_sending_after(input, offset, e, t);
            let progress = match (progress, rescued) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if let Some(p) = progress.filter(|p| *p <= deadline) {
                worst_ns = worst_ns.max(p - t);
                continue;
            }
            if !victims {
                unknown_unrecovered += 1;
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
                "next_ms": progress.map_or(json!("none"), |p| json!(ms(p))),
            }));
        }

        // Zombie: P's accepted send arriving after T, after another pid's accept was answered.
        let woke = input.ledger.iter().filter(|s| {
            s.kind == EntryKind::Send
                && s.outcome == Outcome::Accepted
                && s.received_ns > t
                && input.pids.get(&s.seq) == Some(&pid)
        });
        for s in woke {
            let first = sends.by_key(s.provider, &s.recipient).iter().find(|o| {
                o.outcome == Outcome::Accepted
                    && o.mono_ns < s.received_ns
                    && input.pids.get(&o.seq) != Some(&pid)
            });
            if let Some(first) = first {
                zombies += 1;
                let e = expected.get(&(s.provider, s.recipient.as_str()));
                findings.push(json!({
                    "rule": "zombie_duplicate",
                    "recipient": e.map(|e| e.recipient.as_str()),
                    "channel": channel_of(s.provider).as_str(),
                    "address": s.recipient,
                    "event": ev.kind,
                    "pid": pid,
                    "t_ms": ms(t),
                    "first_accept": attempt_json(first, input),
                    "zombie_accept": attempt_json(s, input),
                    "after_first_ms": gap_ms(s.received_ns, first.mono_ns),
                }));
            }
        }
    }

    let summary = format!(
        "{} kill/stop events: {at_risk} unfinished deliveries held by the victims, {} not recovered in time, {zombies} zombie duplicates; \
         slowest recovery {} ms",
        input.timeline.iter().filter(|e| matches!(e.kind.as_str(), "sigkill" | "sigstop") && e.pid.is_some()).count(),
        findings.total() as u64 - zombies,
        ms(worst_ns),
    );
    let figs = figures(json!({
        "deliveries_at_risk": at_risk,
        "not_recovered": findings.total() as u64 - zombies,
        "zombie_duplicates": zombies,
        "slowest_recovery_ms": ms(worst_ns),
        "lease_ms": input.scenario.stack.lease.as_millis() as u64,
        "slack_ms": input.scenario.expect.recovery_slack.as_millis() as u64,
    }));
    // A kill or stop that held nothing unfinished tested nothing: recovery judged nothing.
    findings.judged("no_progress", at_risk);
    findings.unattributed("no_progress", at_risk + unknown_held, unknown_unrecovered);
    findings.judged_at_least("zombie_duplicate", repeats - repeats_unknown, 0);
    findings.unattributed("zombie_duplicate", repeats, repeats_unknown);
    findings.verdict(NAME, summary, figs)
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod tests;
