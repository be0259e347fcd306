//! `agreement`: the stack's own final state agrees with what the providers' ledger says happened,
//! and the stack did not send again what a provider had accepted and told it so.
//!
//! A checker of the stack's *own* consistency (ARCHITECTURE.md allows reading the status API for
//! that); whether a customer got a message stays `no_loss`'s and `exactly_once`'s business. It
//! judges only what the stack could know. An accept is **seen** when the provider's answer went
//! back to a sender that could record it: outcome `Accepted` or `IdempotentRepeat` (LINE's 409
//! for a retry key it already accepted), no injected fault (a commit-then-fail 5xx, an SMTP
//! accept-then-drop: the sender saw a failure), the sender did not hang up first, the request is
//! attributed to a stack process, and nothing got in the way of recording it: that process was
//! not SIGKILLed, SIGSTOPped, SIGTERMed and did not exit, and the database was not down (chaos
//! `db_*` steps), from one lease before the request to one lease after the answer. A sender
//! that lived on for a lease after the answer has either recorded it or kept renewing its lease.
//!
//! Rules, each per expected delivery with a status API row:
//!
//! - **accepted_but_failed**: an accept was seen, yet the stack says `failed`, or says
//!   `permanent_failure` with no failure report the stack could have learned it from (a genuine
//!   SMS `undelivered`/`failed` or e-mail `bounced` event, or an SMS poll answering one of those).
//! - **never_accepted**: the stack says `delivered` or `submitted`, but the provider accepted no
//!   send to that address at all (no accept, seen or not).
//! - **unknown_but_accepted**: an accept was seen, yet the stack says `unknown` without ever having
//!   recorded the acceptance (no `submitted` or `delivered` in its transitions). An accept the
//!   sender never heard of (killed before the answer) leaves `unknown` honest; so does `unknown`
//!   after `submitted` (an SMS the provider took whose handset outcome never came).
//! - **resend_after_accept**: a send to the same address arriving after an accept the stack saw
//!   (LINE same-key 409s, SMS / e-mail re-sends), even one still in flight: an accept whose
//!   sender, the resend's sender (a woken zombie) and the database were not disturbed from a
//!   lease before it until the resend, nor the machine's wall clock jumped forward by `lease −
//!   heartbeat` or more from a lease before it to a lease after its answer (the stack's leases,
//!   timed by that clock, lapse at such a jump: `crate::jumps`). The same jump unmakes "seen"
//!   for the state rules, as a kill of its sender does. Every
//!   other send after the first accept is counted as explained (`resends_after_accept_explained`:
//!   a resend with the LINE retry key after a lost answer is the correct design). Ledger-only, so
//!   it is judged without a status API too.
//! - **status_unreadable**: the status API answered 2xx with what is not the contract's answer
//!   (not JSON, not its shape — a state that is not a string, `attempts` past a u32 —, or longer
//!   than the whole list of the run's deliveries could be), or, in a run that was not stopped
//!   early, no request to it ever got an answer (every one timed out, was reset or got a 5xx).
//!   The stack's own view cannot be read, so nothing it says can be judged: that is the stack
//!   breaking the contract, never "no status API".
//!
//! Judged: the three state rules every delivery with a status API row (more than 1% of expected
//! deliveries without one makes the verdict insufficient), `resend_after_accept` every delivery
//! with an accept; the rules that need an accept's sender are insufficient when more than 1% of
//! the accepts answered to a sender cannot be attributed to a process.
//!
//! A stack descheduled for longer than its lease after an answer would look like one that lost
//! the answer; shipped scenarios keep leases well above the stalls a loaded CI machine causes.

use std::collections::HashMap;

use super::Entry;
use mock_providers::ledger::{CallbackVariant, EntryKind, Outcome, Provider};
use serde_json::{json, Value};

use super::common::{
    attempt_json, delivery_json, figures, ms, Findings, PerChannel, Sends, MAX_UNJUDGED_SHARE,
};
use super::{EventKind, Input, State, StatusDelivery, Verdict};

pub const NAME: &str = "agreement";

/// The rules, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    AcceptedButFailed,
    NeverAccepted,
    UnknownButAccepted,
    ResendAfterAccept,
    StatusUnreadable,
}

impl Rule {
    fn as_str(self) -> &'static str {
        match self {
            Rule::AcceptedButFailed => "accepted_but_failed",
            Rule::NeverAccepted => "never_accepted",
            Rule::UnknownButAccepted => "unknown_but_accepted",
            Rule::ResendAfterAccept => "resend_after_accept",
            Rule::StatusUnreadable => "status_unreadable",
        }
    }
}

const COUNTS: [&str; 6] = [
    "accepted_but_failed",
    "never_accepted",
    "unknown_but_accepted",
    "resend_after_accept",
    "resends_after_accept",
    "resends_after_accept_explained",
];

/// What could have kept a sender from recording an answer: per pid the moments it was signalled,
/// exited or had its database link reset, the spans its link was partitioned, and the database's
/// outages (start, end) on the ledger clock.
struct Disturbances {
    by_pid: HashMap<u32, Vec<u64>>,
    db: Vec<(u64, u64)>,
    /// Per pid, the spans its database link was partitioned (start, heal): an answer it heard
    /// then could not be recorded before the heal.
    cut_off: HashMap<u32, Vec<(u64, u64)>>,
    /// When the wall clock jumped forward by `lease − heartbeat` or more (`crate::jumps`): every
    /// lease the stack timed by it may have lapsed at once, as if every process had been
    /// stopped.
    clock: Vec<u64>,
}

impl Disturbances {
    fn new(input: &Input) -> Disturbances {
        let mut by_pid: HashMap<u32, Vec<u64>> = HashMap::new();
        let mut db = Vec::new();
        let mut open: HashMap<&str, u64> = HashMap::new();
        let mut cut_off: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        for e in input.timeline {
            use EventKind::*;
            match (e.kind, e.pid) {
                (Sigkill | Sigstop | Sigcont | Sigterm, Some(pid)) => {
                    by_pid.entry(pid).or_default().push(e.mono_ns)
                }
                (DbLinkReset, Some(pid)) => by_pid.entry(pid).or_default().push(e.mono_ns),
                (DbLinkPartition, Some(pid)) => {
                    cut_off.entry(pid).or_default().push((e.mono_ns, u64::MAX))
                }
                (DbLinkHeal, Some(pid)) => {
                    if let Some(open) = cut_off.get_mut(&pid).and_then(|v| v.last_mut()) {
                        open.1 = e.mono_ns;
                    }
                }
                (DbTerminate, _) => db.push((e.mono_ns, e.mono_ns)),
                (DbRestart, _) => {
                    open.insert("restart", e.mono_ns);
                }
                (DbIdleTx, _) => {
                    open.insert("idle_tx", e.mono_ns);
                }
                (DbRestarted | DbRestartFailed | DbRestartSkipped, _) => {
                    if let Some(s) = open.remove("restart") {
                        db.push((s, e.mono_ns));
                    }
                }
                (DbIdleTxEnd, _) => {
                    if let Some(s) = open.remove("idle_tx") {
                        db.push((s, e.mono_ns));
                    }
                }
                _ => {}
            }
        }
        // An outage the run never saw end lasts to the end of the run.
        db.extend(open.into_values().map(|s| (s, u64::MAX)));
        for p in input.processes {
            if let Some(x) = p.exited_ns {
                by_pid.entry(p.pid).or_default().push(x);
            }
        }
        let stack = &input.scenario.stack;
        let lapses = stack.lease.saturating_sub(stack.heartbeat).as_nanos() as u64;
        let clock = input
            .clock_jumps
            .iter()
            .filter(|j| j.forward() && j.by_ns.unsigned_abs() >= lapses)
            .map(|j| j.at_ns)
            .collect();
        Disturbances {
            by_pid,
            db,
            cut_off,
            clock,
        }
    }

    /// Whether `pid` or the database was disturbed within `[from, to]`.
    fn any(&self, pid: u32, from: u64, to: u64) -> bool {
        let pid_hit = self
            .by_pid
            .get(&pid)
            .is_some_and(|v| v.iter().any(|t| (from..=to).contains(t)));
        let link_cut = self
            .cut_off
            .get(&pid)
            .is_some_and(|v| v.iter().any(|(s, e)| *s <= to && *e >= from));
        pid_hit || link_cut || self.db.iter().any(|(s, e)| *s <= to && *e >= from)
    }

    /// Whether the wall clock jumped far enough to lapse a lease within `[from, to]`.
    fn lapsed(&self, from: u64, to: u64) -> bool {
        self.clock.iter().any(|t| (from..=to).contains(t))
    }
}

/// The provider answered an accept to a sender that heard it (before any disturbance check).
fn answered_accept(s: &Entry, input: &Input) -> Option<u32> {
    let accept = matches!(s.outcome, Outcome::Accepted | Outcome::IdempotentRepeat);
    if !accept || s.fault().is_some() || s.client_hung_up {
        return None;
    }
    input.pids.get(s.seq)
}

/// A failure the stack may have learned from a report or a poll, per (provider, address).
fn failure_reports(ledger: &[Entry]) -> HashMap<(Provider, &str), u64> {
    let mut out: HashMap<(Provider, &str), u64> = HashMap::new();
    for e in ledger {
        let status = match e.kind {
            EntryKind::Callback
                if e.callback_variant()
                    .is_none_or(|v| !v.is_forged() && v != CallbackVariant::UnknownId) =>
            {
                e.callback_status.as_deref()
            }
            // The message status the read told the stack (`status` is the read's HTTP status).
            EntryKind::Poll => e.callback_status.as_deref(),
            _ => None,
        };
        if matches!(status, Some("undelivered" | "failed" | "bounced")) {
            *out.entry((e.provider, e.recipient.as_str())).or_default() += 1;
        }
    }
    out
}

/// Whether the stack's own history shows it recorded the acceptance.
fn recorded_acceptance(row: &StatusDelivery) -> bool {
    row.transitions
        .iter()
        .any(|t| matches!(t.to(), State::Submitted | State::Delivered))
}

pub fn check(input: &Input) -> Verdict {
    let sends = input.sends();
    let has_status = input.status.is_some();
    let failures = failure_reports(input.ledger);
    let dist = Disturbances::new(input);
    let lease = u64::try_from(input.scenario.stack.lease.as_nanos()).unwrap_or(u64::MAX);
    let mut counts = PerChannel::default();
    let mut findings = Findings::default();
    let (mut judged_states, mut no_row) = (0u64, 0u64);

    for e in input.expected {
        counts.init(e.channel, &COUNTS);
        let attempts = sends.of_expected(e);
        // The first accept the stack saw.
        let seen = attempts.iter().find(|s| {
            answered_accept(s, input).is_some_and(|pid| {
                let (from, to) = (
                    s.received_ns.saturating_sub(lease),
                    s.mono_ns.saturating_add(lease),
                );
                !dist.any(pid, from, to) && !dist.lapsed(from, to)
            })
        });
        resends(input, e, attempts, &dist, lease, &mut counts, &mut findings);
        if !has_status {
            continue;
        }
        let Some(row) = input.status_row(e) else {
            no_row += 1;
            continue;
        };
        judged_states += 1;
        let any_accept = attempts
            .iter()
            .any(|s| matches!(s.outcome, Outcome::Accepted | Outcome::IdempotentRepeat));
        let reported_failure = failures.contains_key(&(e.channel.provider(), e.address.as_str()));
        let rule = match (&row.state, seen) {
            (State::Failed, Some(_)) => Some(Rule::AcceptedButFailed),
            (State::PermanentFailure, Some(_)) if !reported_failure => {
                Some(Rule::AcceptedButFailed)
            }
            (State::Delivered | State::Submitted, _) if !any_accept => Some(Rule::NeverAccepted),
            (State::Unknown, Some(_)) if !recorded_acceptance(row) => {
                Some(Rule::UnknownButAccepted)
            }
            _ => None,
        };
        let Some(rule) = rule else { continue };
        counts.add(e.channel, rule.as_str());
        let mut c = delivery_json(e);
        c.insert("rule".into(), json!(rule.as_str()));
        c.insert("stack_state".into(), json!(row.state));
        c.insert("last_error".into(), json!(row.last_error));
        c.insert("seen_accept".into(), json!(seen.map(|s| s.seq)));
        c.insert(
            "transitions".into(),
            json!(row
                .transitions
                .iter()
                .map(|t| format!("{}@{}", t.to(), t.source()))
                .collect::<Vec<_>>()),
        );
        c.insert(
            "sends".into(),
            Value::Array(attempts.iter().map(|s| attempt_json(s, input)).collect()),
        );
        findings.push(Value::Object(c));
    }

    declare_judged(
        input,
        sends,
        &mut findings,
        has_status,
        judged_states,
        no_row,
    );
    status_unreadable(input, &mut findings);
    let states = if has_status {
        format!(
            "{judged_states} final states judged: {} accepted but failed, {} never accepted, \
             {} unknown though accepted",
            counts.total("accepted_but_failed"),
            counts.total("never_accepted"),
            counts.total("unknown_but_accepted"),
        )
    } else {
        "final states not checked (stack exposes no status API)".to_string()
    };
    let mut summary = format!(
        "{states}; {} resends after a seen accept ({} explained by chaos or a clock jump)",
        counts.total("resends_after_accept"),
        counts.total("resends_after_accept_explained"),
    );
    if input.status_answers.unreadable > 0 {
        summary = format!(
            "{} status API answers were not the contract's; {summary}",
            input.status_answers.unreadable
        );
    }
    let figs = figures(json!({
        "by_channel": counts.to_json(),
        "states_judged": judged_states,
        "no_status_row": no_row,
        "status_api": has_status,
        "accepted_but_failed": counts.total("accepted_but_failed"),
        "never_accepted": counts.total("never_accepted"),
        "unknown_but_accepted": counts.total("unknown_but_accepted"),
        "deliveries_resent_after_accept": counts.total("resend_after_accept"),
        "resends_after_accept": counts.total("resends_after_accept"),
        "resends_after_accept_explained": counts.total("resends_after_accept_explained"),
        "status_requests": input.status_answers.requests,
        "status_unreadable": input.status_answers.unreadable,
    }));
    findings.verdict(NAME, summary, figs)
}

/// `status_unreadable`: every status API answer that was not the contract's (the first few, with
/// what was wrong and the answer's first bytes), or one finding for an API that never answered.
/// Judged: the requests made (none is no shortfall: a run may end before the first poll).
fn status_unreadable(input: &Input, findings: &mut Findings) {
    let a = input.status_answers;
    let rule = Rule::StatusUnreadable.as_str();
    findings.judged_at_least(rule, a.requests, 0);
    for u in &a.examples {
        findings.push(json!({
            "rule": rule, "batch_id": u.batch_id, "at_ms": ms(u.at_ns),
            "http_status": u.http_status, "error": u.error, "body_head": u.body_head,
            "reason": format!(
                "the status API answered {} for this batch with what is not the contract's \
                 answer ({} such answers in all)", u.http_status, a.unreadable),
        }));
    }
    let never = a.requests > 0 && a.readable == 0 && a.unreadable == 0;
    if never && input.quiescence.stopped_early.is_none() {
        findings.push(json!({
            "rule": rule, "requests": a.requests, "last_failure": a.last_failure,
            "reason": format!(
                "none of the {} requests to the status API got an answer (a stack without one \
                 answers 404)", a.requests),
        }));
    }
}

/// What each rule judged: the state rules every delivery with a status row (short when more than
/// 1% of the expected deliveries have none), the resend rule every delivery with an accept; all
/// of them need the sender of each accept answered to a sender (short when more than 1% of
/// those have no known pid).
fn declare_judged(
    input: &Input,
    sends: &Sends,
    findings: &mut Findings,
    status_api: bool,
    judged_states: u64,
    no_row: u64,
) {
    let (mut accepted, mut answered, mut unattributed) = (0u64, 0u64, 0u64);
    for e in input.expected {
        let attempts = sends.of_expected(e);
        let accepts: Vec<_> = attempts
            .iter()
            .filter(|s| matches!(s.outcome, Outcome::Accepted | Outcome::IdempotentRepeat))
            .collect();
        accepted += u64::from(!accepts.is_empty());
        for s in accepts
            .iter()
            .filter(|s| s.fault().is_none() && !s.client_hung_up)
        {
            answered += 1;
            unattributed += u64::from(!input.pids.contains(s.seq));
        }
    }
    let expected = input.expected.len() as u64;
    if status_api {
        for rule in [
            Rule::AcceptedButFailed,
            Rule::NeverAccepted,
            Rule::UnknownButAccepted,
        ] {
            findings.judged(rule.as_str(), judged_states);
        }
        findings.unjudged(
            Rule::NeverAccepted.as_str(),
            expected,
            no_row,
            MAX_UNJUDGED_SHARE,
            "deliveries with no status API row",
        );
        findings.unattributed(Rule::AcceptedButFailed.as_str(), answered, unattributed);
        findings.unattributed(Rule::UnknownButAccepted.as_str(), answered, unattributed);
    }
    findings.judged(Rule::ResendAfterAccept.as_str(), accepted);
    findings.unattributed(Rule::ResendAfterAccept.as_str(), answered, unattributed);
}

/// Counts the sends to `e` that arrived after its first accept, and reports the delivery once
/// when any of them followed an accept the stack saw: one answered to a sender that was not
/// disturbed (nor the database) from a lease before that accept until the resend.
fn resends(
    input: &Input,
    e: &super::Expected,
    attempts: &[&Entry],
    dist: &Disturbances,
    lease: u64,
    counts: &mut PerChannel,
    findings: &mut Findings,
) {
    let is_accept = |s: &Entry| matches!(s.outcome, Outcome::Accepted | Outcome::IdempotentRepeat);
    let Some(first) = attempts.iter().position(|s| is_accept(s)) else {
        return;
    };
    let mut unexcused: Vec<(&Entry, &Entry)> = Vec::new();
    for (i, r) in attempts.iter().enumerate().skip(first + 1) {
        // A resend from a process woken or stopped meanwhile (a zombie's request written before
        // its freeze) is chaos's doing, not the stack's.
        let from = |a: &Entry| a.received_ns.saturating_sub(lease);
        let resender_disturbed = |a: &Entry| {
            input
                .pids
                .get(r.seq)
                .is_some_and(|p| dist.any(p, from(a), r.received_ns))
        };
        // A jump that lapsed the accepting attempt's lease: from a lease before it until a lease
        // after its answer (a jump after the stack recorded the accept cannot cause a resend).
        let lapsed = |a: &Entry| dist.lapsed(from(a), a.mono_ns.saturating_add(lease));
        let seen = attempts[..i].iter().find(|a| {
            answered_accept(a, input).is_some_and(|pid| {
                !dist.any(pid, from(a), r.received_ns) && !resender_disturbed(a) && !lapsed(a)
            })
        });
        match seen {
            Some(a) => {
                counts.add(e.channel, "resends_after_accept");
                unexcused.push((a, r));
            }
            None => counts.add(e.channel, "resends_after_accept_explained"),
        }
    }
    let Some((a, r)) = unexcused.first() else {
        return;
    };
    counts.add(e.channel, Rule::ResendAfterAccept.as_str());
    let mut c = delivery_json(e);
    c.insert("rule".into(), json!(Rule::ResendAfterAccept.as_str()));
    c.insert("accept".into(), attempt_json(a, input));
    c.insert("resends".into(), json!(unexcused.len()));
    c.insert("first_resend".into(), attempt_json(r, input));
    findings.push(Value::Object(c));
}

#[cfg(test)]
#[path = "agreement_tests.rs"]
mod tests;
