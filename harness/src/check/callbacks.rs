//! `callbacks`: the stack's final state agrees with the providers' genuine delivery reports,
//! and duplicate, stale, out-of-order, forged and unknown-id reports changed nothing.
//!
//! Ground truth is the ledger's `Callback` entries: the `Genuine` report with a final status
//! (SMS `delivered`/`undelivered`/`failed`, e-mail `delivered`/`bounced`) per message id. The
//! other reports are intermediate or informational (SMS `sent`; e-mail `processed`, `deferred`,
//! `complained`) and never decide a state: arriving after the final one (out of order), they must
//! change nothing, which `regression` sees (stack/STATE_MACHINE.md, "E-mail delivery events"). Only
//! messages whose genuine final report the stack acknowledged (2xx) are judged (an unacknowledged
//! one only when the state agrees with it), and a row still `submitted` while callbacks are
//! pending is skipped (quiescence reports those). Rules:
//!
//! - **disagrees**: the status row with that `provider_message_id` (angle brackets ignored, so an
//!   e-mail matches on its Message-ID) is not `delivered` for a delivered report, or not
//!   `permanent_failure`/`failed` for a failure report.
//! - **forged_accepted**: same, and the final state is what a forged report (a wrong signature,
//!   or none at all) or an unknown-id report to the same address claimed.
//! - **regression**: any transition out of `delivered`, `permanent_failure` or `failed` (a stale or
//!   out-of-order report applied), on any row.
//! - **duplicate_applied**: two transitions with source `callback` into the same state on one row
//!   (each from another state: a same-state entry the stack logged for a report it ignored
//!   changed nothing).
//! - **forged_answered_2xx**: a forged report — a wrong signature, or none at all — answered 2xx
//!   (the contract says 403: a stack that accepts it would accept anyone's; one that checks a
//!   signature only when there is one accepts every unsigned report).
//!
//! Judged: genuine final reports matched to a status row by message id (`disagrees`, needs one
//! whenever there are genuine final reports; reports never acknowledged or matching no row are
//! unjudged, and more than 1% of them makes the verdict insufficient — a stack that leaves
//! `provider_message_id` empty cannot be judged, it does not hold); rows with transitions
//! (`regression`, `duplicate_applied`); forged reports (`forged_answered_2xx`).
//!
//! Figures count the genuine reports by type per provider, and the intermediate or
//! informational ones the stack acknowledged after it had acknowledged the final report about the
//! same message (`late_non_final_acked`): how often out-of-order arrival was actually put to it.
//! A regression's counterexample lists those late reports about its message.
//!
//! `delivery_timing` says how the reports went out: tries, tries the stack did not answer in
//! time, and how many of those the fakes themselves began more than [`HARNESS_LATE_MS`] late (the
//! harness's fault, not the stack's), with the fakes' lateness and the stack's answer times.
//!
//! Needs the status API: without it the verdict is `NotChecked`, never `Holds`.

use std::collections::{BTreeMap, HashMap};

use super::Entry;
use mock_providers::ledger::{CallbackVariant, EntryKind, Provider};
use serde_json::{json, Value};

use super::common::{channel_of, figures, ms, not_checked, Findings};
use super::keyed::Keyed;
use super::{Input, Source, State, StatusDelivery, Verdict};

pub const NAME: &str = "callbacks";

/// A try the fakes began this much later than due says the harness's machine was starved.
pub const HARNESS_LATE_MS: u64 = 250;

/// A message id as both sides may write it (`<id@host>` or `id@host`).
fn norm(id: &str) -> &str {
    id.trim().trim_start_matches('<').trim_end_matches('>')
}

fn is_final_report(status: &str) -> bool {
    matches!(status, "delivered" | "undelivered" | "failed" | "bounced")
}

/// Whether a stack state is what a final report with `status` calls for.
fn agrees(report: &str, state: &State) -> bool {
    if report == "delivered" {
        *state == State::Delivered
    } else {
        matches!(state, State::PermanentFailure | State::Failed)
    }
}

#[derive(Clone, Copy)]
struct Truth<'a> {
    status: &'a str,
    acked: bool,
    first: &'a Entry,
}

pub fn check(input: &Input) -> Verdict {
    let Some(rows) = input.status else {
        return not_checked(NAME, "stack exposes no status API");
    };
    let cbs: Vec<&Entry> = input
        .ledger
        .iter()
        .filter(|e| e.kind == EntryKind::Callback)
        .collect();
    if cbs.is_empty() {
        return not_checked(NAME, "no callbacks were sent");
    }

    let late = late_non_final(&cbs);
    let mut by_type: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for cb in cbs
        .iter()
        .filter(|c| c.callback_variant() == Some(CallbackVariant::Genuine))
    {
        if let Some(status) = cb.callback_status.as_deref() {
            *by_type
                .entry(cb.provider.as_str())
                .or_default()
                .entry(status)
                .or_default() += 1;
        }
    }
    let mut findings = Findings::default();
    // Every genuine final report, keyed by its message: grouped below by sorting (a map of
    // 200,000 messages took three times the room).
    let mut finals: Vec<((Provider, &str), Truth)> = Vec::new();
    let mut forged: HashMap<(Provider, &str), Vec<&str>> = HashMap::new();
    let mut forged_sig = 0u64;
    // Forged reports answered 2xx, reported after the disagreements (a state changed by a forged
    // report is the graver news, so it comes first in the kept counterexamples).
    let mut forged_acked: Vec<serde_json::Value> = Vec::new();
    for cb in &cbs {
        let (Some(id), Some(status)) = (cb.message_id.as_deref(), cb.callback_status.as_deref())
        else {
            continue;
        };
        let acked = cb
            .callback_response()
            .is_some_and(|c| (200..300).contains(&c));
        match cb.callback_variant() {
            Some(CallbackVariant::Genuine) if is_final_report(status) => {
                let truth = Truth {
                    status,
                    acked,
                    first: cb,
                };
                finals.push(((cb.provider, norm(id)), truth));
            }
            Some(v) if v.is_forged() || v == CallbackVariant::UnknownId => {
                forged
                    .entry((cb.provider, cb.recipient.as_str()))
                    .or_default()
                    .push(status);
                if v.is_forged() {
                    forged_sig += 1;
                    if acked {
                        forged_acked.push(json!({
                            "rule": "forged_answered_2xx",
                            "channel": channel_of(cb.provider).as_str(),
                            "address": cb.recipient,
                            "message_id": id,
                            "signature": if v == CallbackVariant::Unsigned { "none" } else { "wrong key" },
                            "claimed": status,
                            "answered": cb.callback_response(),
                            "at_ms": ms(cb.mono_ns),
                        }));
                    }
                }
            }
            _ => {}
        }
    }

    let truth = truth_of(finals);
    let by_id = RowsById::of(rows);
    let (mut judged, mut not_acked, mut unmatched, mut pending) = (0u64, 0u64, 0u64, 0u64);
    for ((provider, id), t) in &truth {
        let Some(row) = by_id.get(*provider, id) else {
            unmatched += 1;
            continue;
        };
        if row.state == State::Submitted && input.quiescence.callbacks_pending > 0 {
            pending += 1;
            continue;
        }
        if !t.acked {
            // Never acknowledged (5xx, timeouts until the provider gave up): a state that agrees
            // is judged (the stack learned it, perhaps from an answer it could not send back);
            // one that does not cannot be blamed on the stack.
            if agrees(t.status, &row.state) {
                judged += 1;
            } else {
                not_acked += 1;
            }
            continue;
        }
        judged += 1;
        if agrees(t.status, &row.state) {
            continue;
        }
        let claims = forged.get(&(*provider, t.first.recipient.as_str()));
        let forged_claim = claims.and_then(|c| c.iter().find(|s| agrees(s, &row.state)));
        findings.push(json!({
            "rule": if forged_claim.is_some() { "forged_accepted" } else { "disagrees" },
            "recipient": row.recipient,
            "channel": row.channel.as_str(),
            "address": t.first.recipient,
            "message_id": id,
            "genuine_report": t.status,
            "report_at_ms": ms(t.first.mono_ns),
            "stack_state": row.state,
            "forged_claim": forged_claim,
        }));
    }

    let forged_2xx = forged_acked.len() as u64;
    for f in forged_acked {
        findings.push(f);
    }
    let (mut regressions, mut duplicates) = (0u64, 0u64);
    for row in rows {
        let mut prev: Option<State> = None;
        let mut by_callback: BTreeMap<State, u32> = BTreeMap::new();
        let mut regressed = false;
        for t in &row.transitions {
            let (to, source) = (t.to(), t.source());
            let from = t.from().or(prev.take());
            if let Some(f) = from.as_ref().filter(|f| f.is_terminal() && **f != to) {
                if !regressed {
                    regressed = true;
                    regressions += 1;
                    let mut c = row_json(
                        row,
                        "regression",
                        json!({"from": f, "to": to, "source": source, "at": t.at()}),
                    );
                    let id = row.provider_message_id.as_deref().map(norm);
                    let reports = id.and_then(|id| late.get(&(row.channel.provider(), id)));
                    c["late_reports"] = json!(reports
                        .map(|r| r
                            .iter()
                            .map(|(s, at)| json!({"status": s, "at_ms": ms(*at)}))
                            .collect::<Vec<_>>())
                        .unwrap_or_default());
                    findings.push(c);
                }
            }
            // A history entry that left the state as it was (a duplicate the stack logged and
            // ignored) changed nothing; only moves into a state count.
            if source == Source::Callback && from.as_ref() != Some(&to) {
                *by_callback.entry(to.clone()).or_default() += 1;
            }
            prev = Some(to);
        }
        for (to, n) in by_callback.into_iter().filter(|(_, n)| *n > 1) {
            duplicates += 1;
            findings.push(row_json(
                row,
                "duplicate_applied",
                json!({"to": to, "times": n}),
            ));
        }
    }

    let summary = format!(
        "{} callbacks, {} genuine final reports: {judged} judged, {} disagree, {unmatched} match no \
         status row, {not_acked} never acknowledged; {regressions} regressions, {duplicates} \
         duplicates applied, {forged_2xx} forged reports answered 2xx",
        cbs.len(),
        truth.len(),
        findings.total() as u64 - regressions - duplicates - forged_2xx,
    );
    if !truth.is_empty() {
        // A genuine final report the stack never acknowledged, or whose message id no status row
        // carries, is one the agreement rules could not judge: too many and "holds" means nothing.
        let truths = truth.len() as u64;
        findings.unjudged(
            "disagrees",
            truths - pending,
            not_acked + unmatched,
            super::common::MAX_UNJUDGED_SHARE,
            "genuine final reports never acknowledged (2xx) or matching no status row's provider_message_id",
        );
        findings.judged("disagrees", judged);
    }
    let with_transitions = rows.iter().filter(|r| !r.transitions.is_empty()).count();
    findings.judged("regression", with_transitions as u64);
    if forged_sig > 0 {
        findings.judged("forged_answered_2xx", forged_sig);
    }
    let figs = figures(json!({
        "callbacks": cbs.len(),
        "genuine_final": truth.len(),
        "judged": judged,
        "final_not_acknowledged": not_acked,
        "unmatched_message_ids": unmatched,
        "skipped_pending": pending,
        "forged_answered_2xx": forged_2xx,
        "regressions": regressions,
        "duplicates_applied": duplicates,
        "genuine_by_type": by_type,
        "late_non_final_acked": late.values().map(Vec::len).sum::<usize>(),
        "delivery_timing": delivery_timing(&cbs),
    }));
    findings.verdict(NAME, summary, figs)
}

/// How the reports went out: tries, unanswered tries (timeouts and connection errors) and how
/// many of those began late on the fakes' side, the fakes' lateness (p99, max), the wait for a
/// connection slot while the stack answered earlier reports (p99, max) and the stack's answer
/// time (p99) over the answered tries.
fn delivery_timing(cbs: &[&Entry]) -> Value {
    let unanswered = |cb: &&&Entry| cb.callback_response().is_none();
    let begun_late = |cb: &&&Entry| u64::from(cb.callback_late_ms().unwrap_or(0)) > HARNESS_LATE_MS;
    let mut late: Vec<u64> = cbs
        .iter()
        .filter_map(|c| c.callback_late_ms().map(u64::from))
        .collect();
    let mut queued: Vec<u64> = cbs
        .iter()
        .filter_map(|c| c.callback_queued_ms().map(u64::from))
        .collect();
    let mut took: Vec<u64> = cbs
        .iter()
        .filter(|c| c.callback_response().is_some())
        .filter_map(|c| c.callback_took_ms().map(u64::from))
        .collect();
    json!({
        "tries": cbs.len(),
        "unanswered": cbs.iter().filter(unanswered).count(),
        "unanswered_begun_late": cbs.iter().filter(unanswered).filter(begun_late).count(),
        "begun_late": cbs.iter().filter(begun_late).count(),
        "late_p99_ms": p99(&mut late),
        "late_max_ms": late.iter().max(),
        "queued_p99_ms": p99(&mut queued),
        "queued_max_ms": queued.iter().max(),
        "answer_p99_ms": p99(&mut took),
    })
}

fn p99(v: &mut [u64]) -> Option<u64> {
    v.sort_unstable();
    let sorted: Vec<f64> = v.iter().map(|x| *x as f64).collect();
    (!v.is_empty()).then(|| crate::report::stats::percentile(&sorted, 0.99) as u64)
}

/// Genuine non-final reports (SMS `sent`; e-mail `processed`, `deferred`, `complained`) the stack
/// acknowledged after it had acknowledged the genuine final report about the same message, per
/// (provider, message id): (status, when acknowledged).
fn late_non_final<'a>(cbs: &[&'a Entry]) -> HashMap<(Provider, &'a str), Vec<(&'a str, u64)>> {
    let acked = |cb: &&&Entry| {
        cb.callback_response()
            .is_some_and(|c| (200..300).contains(&c))
            && cb
                .callback_variant()
                .is_none_or(|v| !v.is_forged() && v != CallbackVariant::UnknownId)
    };
    let mut final_at: HashMap<(Provider, &str), u64> = HashMap::new();
    for cb in cbs.iter().filter(acked) {
        let (Some(id), Some(status)) = (cb.message_id.as_deref(), cb.callback_status.as_deref())
        else {
            continue;
        };
        if is_final_report(status) {
            let t = final_at
                .entry((cb.provider, norm(id)))
                .or_insert(cb.mono_ns);
            *t = (*t).min(cb.mono_ns);
        }
    }
    let mut out: HashMap<(Provider, &str), Vec<(&str, u64)>> = HashMap::new();
    for cb in cbs.iter().filter(acked) {
        let (Some(id), Some(status)) = (cb.message_id.as_deref(), cb.callback_status.as_deref())
        else {
            continue;
        };
        let key = (cb.provider, norm(id));
        if !is_final_report(status) && final_at.get(&key).is_some_and(|f| cb.mono_ns > *f) {
            out.entry(key).or_default().push((status, cb.mono_ns));
        }
    }
    out
}

/// What the genuine final reports about each message say, in (provider, message id) order:
/// the first report's status, and whether any was acknowledged. `finals`: each report's own,
/// in ledger order.
fn truth_of<'a>(
    mut finals: Vec<((Provider, &'a str), Truth<'a>)>,
) -> Vec<((Provider, &'a str), Truth<'a>)> {
    // Stable: each message's reports stay in ledger order, so the first is its first.
    finals.sort_by_key(|(key, _)| *key);
    finals
        .chunk_by(|a, b| a.0 == b.0)
        .map(|reports| {
            let (key, first) = &reports[0];
            let acked = reports.iter().any(|(_, t)| t.acked);
            (*key, Truth { acked, ..*first })
        })
        .collect()
}

/// The status rows that name a provider message id, found by (provider, id) as the reports
/// write it (`norm`; [`Keyed`]). Of rows naming the same message, the last listed is the one
/// found.
struct RowsById<'a> {
    by: Keyed<'a, StatusDelivery>,
}

impl<'a> RowsById<'a> {
    fn of(rows: &'a [StatusDelivery]) -> RowsById<'a> {
        let named = rows.iter().filter(|r| r.provider_message_id.is_some());
        RowsById {
            by: Keyed::new(named, |r| {
                let id = r.provider_message_id.as_deref().map_or("", norm);
                (r.channel.provider(), id)
            }),
        }
    }

    fn get(&self, provider: Provider, id: &str) -> Option<&'a StatusDelivery> {
        self.by.last((provider, id))
    }
}

fn row_json(row: &StatusDelivery, rule: &str, detail: Value) -> Value {
    json!({
        "rule": rule,
        "recipient": row.recipient,
        "channel": row.channel.as_str(),
        "address": row.address,
        "key": row.key(),
        "transition": detail,
        "stack_state": row.state,
    })
}

#[cfg(test)]
#[path = "callbacks_tests.rs"]
mod tests;
