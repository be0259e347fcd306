//! `responsiveness`: enqueueing a batch stays fast while the stack is under load and chaos.
//!
//! Compares the p99 of the harness's measured `POST /v1/batches` latencies with
//! `expect.enqueue_p99`, each less the machine's stalls inside its request (`crate::stalls`: the
//! time allowance grows by them, as every timed rule's does; the measured p99 stays in the
//! figures). Without an SLO the figures are still computed and the verdict is `NotChecked`.
//! Judged: the enqueues measured; a p99 needs at least 100 (fewer is
//! insufficient, unless more than one of them is already over the SLO: then the p99 is over it
//! whatever the rest would have been). Must never use latencies the stack reports about itself.
//!
//! Besides the latency, every enqueue attempt that failed (`load.enqueue_failures`), with or
//! without an SLO, judged over the batches posted (the trickle's orders too):
//! - **enqueue_not_accepted**: no attempt of a batch was accepted within the load's retry window
//!   (30 s), or the stack refused it (an answer but 202, 200, 5xx or 429, which is final): the
//!   stack failed to take a valid batch. Its deliveries are not expected of anyone.
//! - **enqueue_failed**: an accepted batch needed more than [`MAX_FAILURES_PER_BATCH`] attempts
//!   that failed without shedding load. Shedding is what the contract allows a stack under load
//!   (`503` or `429` with a `Retry-After`, which the harness waits out): counted, never a
//!   violation by itself — the wait shows in the latency the SLO judges, and a stack that sheds
//!   for the whole window is `enqueue_not_accepted`. Any other failure (a `500`, `502`, `504`,
//!   a `503` without `Retry-After`, a reset, no answer) is the stack failing a valid batch; one
//!   per batch is tolerated, because a correct stack meets one at a restart of its API or pool
//!   and a client retries it for free; a second for the same batch is not chance. An attempt
//!   that was under way while a chaos step had the API down (from the step's signal until the
//!   replacement answered its readiness check) failed because the harness took the API away:
//!   counted apart (`enqueue_failed_api_down`), never against the stack.

use serde_json::json;

use super::common::{figures, Findings};
use super::{EventKind, Input, Status, Verdict};
use crate::stalls::stalled_ns;

pub const NAME: &str = "responsiveness";

/// Enqueues a p99 needs: below 100 samples the "p99" is just the slowest one or two.
pub const P99_MIN_SAMPLES: u64 = 100;

/// Failed attempts that did not shed load one accepted batch may need before `enqueue_failed`.
pub const MAX_FAILURES_PER_BATCH: usize = 1;

fn ms(us: u64) -> f64 {
    us as f64 / 1_000.0
}

pub fn check(input: &Input) -> Verdict {
    let h = input.enqueue_us;
    let q = |p: f64| ms(h.value_at_quantile(p));
    let mut figs = figures(json!({
        "count": h.len(),
        "p50_ms": q(0.50),
        "p90_ms": q(0.90),
        "p99_ms": q(0.99),
        "max_ms": ms(h.max()),
    }));
    let slo = input.scenario.expect.enqueue_p99;
    if let Some(slo) = slo {
        figs.insert("slo_p99_ms".into(), json!(slo.as_secs_f64() * 1e3));
    }
    let stats = format!(
        "{} enqueues: p50 {} ms, p90 {} ms, p99 {} ms, max {} ms",
        h.len(),
        q(0.50),
        q(0.90),
        q(0.99),
        ms(h.max())
    );
    let mut findings = Findings::default();
    let (status, summary) = match slo {
        None => (
            Status::NotChecked,
            format!("no enqueue_p99 in [expect]; {stats}"),
        ),
        Some(_) if h.is_empty() => (
            Status::Holds, // made insufficient by the population below
            "no enqueue latency was measured".to_string(),
        ),
        Some(slo) => {
            let slo_ms = slo.as_secs_f64() * 1e3;
            let unstalled = without_stalls(input);
            let judged = unstalled.as_ref().unwrap_or(h);
            let p99 = ms(judged.value_at_quantile(0.99));
            let stalled = match &unstalled {
                Some(_) => {
                    figs.insert("p99_ms_without_stalls".into(), json!(p99));
                    format!(" ({p99} ms less the machine's stalls inside the requests)")
                }
                None => String::new(),
            };
            // More than 1% of P99_MIN_SAMPLES over the SLO proves the p99 over it however many
            // more enqueues there had been; fewer samples prove nothing either way.
            let over = judged.count_between((slo_ms * 1e3) as u64 + 1, u64::MAX);
            let proven = if judged.len() >= P99_MIN_SAMPLES {
                p99 > slo_ms
            } else {
                over * 100 > P99_MIN_SAMPLES
            };
            if proven {
                findings.push(json!({"rule": "enqueue_p99_over_slo", "p99_ms": q(0.99), "p99_ms_without_stalls": unstalled.as_ref().map(|_| p99), "slo_ms": slo_ms, "count": h.len(), "over_slo": over}));
                (
                    Status::Violated,
                    format!("{stats}{stalled}: p99 over the {slo_ms} ms SLO"),
                )
            } else {
                (
                    Status::Holds,
                    format!("{stats}{stalled}: p99 within the {slo_ms} ms SLO"),
                )
            }
        }
    };
    if slo.is_some() {
        findings.judged_at_least("enqueue_p99_over_slo", h.len(), P99_MIN_SAMPLES);
    }
    let failed = judge_failures(input, &mut findings, &mut figs);
    let (status, summary) = match (status, failed) {
        (_, Some(why)) => (Status::Violated, format!("{why}; {summary}")),
        // No SLO, but the batches' enqueues were judged and nothing failed for good.
        (Status::NotChecked, None) if !posted(input).is_empty() => (Status::Holds, summary),
        (s, None) => (s, summary),
    };
    findings.verdict_with(NAME, status, summary, figs)
}

/// The enqueue latencies, each less the machine's stalls inside it (the `latency_us` ending at
/// the answer); `None` when the machine never stalled, or a latency's request is not known (a
/// report written before they were kept): the measured latencies are then what is judged.
fn without_stalls(input: &Input) -> Option<hdrhistogram::Histogram<u64>> {
    let measured = input.batches.iter().all(|b| b.latency_us > 0);
    if input.stalls.is_empty() || input.batches.is_empty() || !measured {
        return None;
    }
    let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).ok()?;
    for b in input.batches {
        let took = b.latency_us.saturating_mul(1_000);
        let from = b.acked_ns.saturating_sub(took);
        let ran = took.saturating_sub(stalled_ns(input.stalls, from, b.acked_ns));
        h.saturating_record((ran / 1_000).max(1));
    }
    Some(h)
}

/// Every batch posted: the accepted ones and those never accepted.
fn posted<'a>(input: &Input<'a>) -> std::collections::BTreeSet<&'a str> {
    let f = input.enqueue_failures;
    input
        .batches
        .iter()
        .map(|b| b.batch_id.as_str())
        .chain(f.not_accepted.iter().map(|b| b.batch_id.as_str()))
        .collect()
}

/// When a chaos step had the API down: from each signal to the API (`api_signal`) until the next
/// API answered its readiness check (`api_ready`), or the end of the run if none did.
fn api_down(input: &Input) -> Vec<(u64, u64)> {
    let mut spans = Vec::new();
    let mut since: Option<u64> = None;
    for e in input.timeline {
        match e.kind {
            EventKind::ApiSignal => {
                since.get_or_insert(e.mono_ns);
            }
            EventKind::ApiReady => {
                if let Some(from) = since.take() {
                    spans.push((from, e.mono_ns));
                }
            }
            _ => {}
        }
    }
    if let Some(from) = since {
        spans.push((from, u64::MAX));
    }
    spans
}

/// The `enqueue_not_accepted` and `enqueue_failed` rules; `Some(summary)` when one was broken.
fn judge_failures(
    input: &Input,
    findings: &mut Findings,
    figs: &mut serde_json::Map<String, serde_json::Value>,
) -> Option<String> {
    let f = input.enqueue_failures;
    let posted = posted(input);
    let shed = f.attempts.iter().filter(|a| a.shed()).count();
    figs.insert("enqueue_failed".into(), json!(f.attempts.len()));
    figs.insert("enqueue_shed".into(), json!(shed));
    figs.insert("batches_not_accepted".into(), json!(f.not_accepted.len()));
    if posted.is_empty() {
        return None;
    }
    for b in &f.not_accepted {
        let attempts: Vec<_> = f
            .attempts
            .iter()
            .filter(|a| a.batch_id == b.batch_id)
            .collect();
        findings.push(json!({
            "rule": "enqueue_not_accepted", "batch_id": b.batch_id, "trickle": b.trickle,
            "deliveries": b.deliveries, "attempts": b.attempts, "first_sent_ns": b.first_sent_ns,
            "gave_up_ns": b.gave_up_ns, "last_error": b.last_error,
            "failed_attempts": attempts.iter().take(5).collect::<Vec<_>>(),
        }));
    }
    let down = api_down(input);
    let during_downtime = |a: &crate::report::FailedEnqueue| {
        down.iter()
            .any(|&(from, to)| a.sent_ns <= to && a.done_ns >= from)
    };
    let mut unshed: std::collections::BTreeMap<&str, Vec<&crate::report::FailedEnqueue>> =
        Default::default();
    let mut api_was_down = 0u64;
    for a in f.attempts.iter().filter(|a| !a.shed()) {
        if during_downtime(a) {
            api_was_down += 1;
        } else if !f.never_accepted(&a.batch_id) {
            unshed.entry(a.batch_id.as_str()).or_default().push(a);
        }
    }
    figs.insert("enqueue_failed_api_down".into(), json!(api_was_down));
    let mut over = 0;
    for (batch_id, attempts) in &unshed {
        if attempts.len() > MAX_FAILURES_PER_BATCH {
            over += 1;
            findings.push(json!({
                "rule": "enqueue_failed", "batch_id": batch_id, "failed_attempts": attempts.len(),
                "allowed": MAX_FAILURES_PER_BATCH, "attempts": attempts.iter().take(5).collect::<Vec<_>>(),
            }));
        }
    }
    let n = posted.len() as u64;
    findings.judged("enqueue_not_accepted", n);
    findings.judged("enqueue_failed", n);
    let mut why = Vec::new();
    if !f.not_accepted.is_empty() {
        why.push(format!(
            "{} of {n} batches never accepted (last: {})",
            f.not_accepted.len(),
            f.not_accepted[f.not_accepted.len() - 1].last_error
        ));
    }
    if over > 0 {
        why.push(format!(
            "{over} accepted batches failed more than {MAX_FAILURES_PER_BATCH} attempt without shedding load"
        ));
    }
    if why.is_empty() {
        None
    } else {
        Some(format!(
            "{} ({} failed enqueue attempts, {shed} of them shed with Retry-After)",
            why.join("; "),
            f.attempts.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::check::testkit::*;

    #[test]
    fn p99_against_slo() {
        // (latencies in ms, slo in ms, expected status)
        let many_fast_few_slow: Vec<u64> =
            (0..1_000).map(|i| if i < 995 { 20 } else { 900 }).collect();
        let two_percent_slow: Vec<u64> =
            (0..1_000).map(|i| if i < 980 { 20 } else { 900 }).collect();
        let cases: [(&[u64], Option<u64>, Status); 7] = [
            (&many_fast_few_slow, Some(100), Status::Holds),
            (&two_percent_slow, Some(100), Status::Violated),
            (&two_percent_slow, None, Status::NotChecked),
            (&[], Some(100), Status::Insufficient),
            // One enqueue (one batch): its "p99" is that enqueue; nothing is proven.
            (&[20], Some(100), Status::Insufficient),
            (&[900], Some(100), Status::Insufficient),
            // Three enqueues, all over: the p99 is over whatever the other 97 would have been.
            (&[900, 900, 900], Some(100), Status::Violated),
        ];
        for (lat, slo, status) in cases {
            let mut w = World::new();
            w.scenario.expect.enqueue_p99 = slo.map(Duration::from_millis);
            for &l in lat {
                w.enqueue_us.record(l * 1_000).unwrap();
            }
            let v = check(&w.input());
            assert_eq!(v.status, status, "{slo:?}: {v:#?}");
            assert_eq!(v.figures["count"], lat.len());
            if status == Status::Violated {
                assert_eq!(rules(&v), ["enqueue_p99_over_slo"]);
                assert!(v.counterexamples[0]["p99_ms"].as_f64().unwrap() > 899.0);
            }
        }
    }

    /// 200 enqueues of 50 ms and 5 of 1 s against a 500 ms SLO: a p99 over it, unless the
    /// machine stalled for most of each slow request (the stack could not run then); stalls
    /// elsewhere, or too short, excuse nothing.
    #[test]
    fn the_machine_stalls_inside_a_request_do_not_count_against_the_slo() {
        let ms_ns = |m: u64| m * 1_000_000;
        let run = |stalls: &[(u64, u64)]| {
            let mut w = World::new();
            w.scenario.expect.enqueue_p99 = Some(Duration::from_millis(500));
            for i in 0..205u64 {
                let (sent, took) = (ms_ns(i * 2_000), ms_ns(if i < 5 { 1_000 } else { 50 }));
                w.enqueue_us.record(took / 1_000).unwrap();
                // Every 50th was a repeat after the harness hung up on the first answer: its
                // window is longer than the latency measured, which ends at the answer.
                let hung_up = if i % 50 == 49 { ms_ns(1_500) } else { 0 };
                w.batches.push(crate::report::BatchEnqueue {
                    batch_id: format!("b{i}"),
                    sent_ns: sent - hung_up.min(sent),
                    acked_ns: sent + took,
                    trickle: false,
                    latency_us: took / 1_000,
                });
            }
            w.stalls = stalls
                .iter()
                .map(|&(from, to)| crate::stalls::Stall {
                    from_ns: ms_ns(from),
                    to_ns: ms_ns(to),
                })
                .collect();
            check(&w.input())
        };
        let slow_ones = |len: u64| (0..5).map(move |i| (i * 2_000 + 100, i * 2_000 + 100 + len));
        let stalled: Vec<(u64, u64)> = slow_ones(700).collect();
        // No stall: the same p99 as measured (the repeats' longer windows do not count).
        let v = run(&[(399_000, 399_001)]);
        assert_eq!(
            v.figures["p99_ms_without_stalls"], v.figures["p99_ms"],
            "{v:#?}"
        );
        let v = run(&stalled);
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        assert!(v.figures["p99_ms"].as_f64().unwrap() > 999.0);
        assert!(v.figures["p99_ms_without_stalls"].as_f64().unwrap() <= 300.5);
        assert!(
            v.summary.contains("less the machine's stalls"),
            "{}",
            v.summary
        );
        // Too short to bring them under the SLO, or outside the requests: still over.
        let short: Vec<(u64, u64)> = slow_ones(200).collect();
        assert_eq!(run(&short).status, Status::Violated);
        let elsewhere: Vec<(u64, u64)> = (0..5)
            .map(|i| (i * 2_000 + 1_100, i * 2_000 + 1_900))
            .collect();
        let v = run(&elsewhere);
        assert_eq!(v.status, Status::Violated);
        assert_eq!(rules(&v), ["enqueue_p99_over_slo"]);
        assert_eq!(run(&[]).status, Status::Violated);
    }

    /// `(status, retry_after_s)` of one failed attempt of batch `b1`.
    fn failed(status: Option<u16>, retry_after_s: Option<u64>) -> crate::report::FailedEnqueue {
        crate::report::FailedEnqueue {
            batch_id: "b1".into(),
            sent_ns: 0,
            done_ns: 1,
            status,
            retry_after_s,
            error: "HTTP 5xx".into(),
            trickle: false,
        }
    }

    /// `n` failed attempts of `b1` (no answer) from `from_ms`, `step_ms` apart, each 50 ms long.
    fn failed_between(from_ms: u64, n: u64, step_ms: u64) -> Vec<crate::report::FailedEnqueue> {
        (0..n)
            .map(|i| crate::report::FailedEnqueue {
                sent_ns: ns(from_ms + i * step_ms),
                done_ns: ns(from_ms + i * step_ms + 50),
                ..failed(None, None)
            })
            .collect()
    }

    #[test]
    fn failures_while_chaos_had_the_api_down_are_not_the_stacks() {
        // The API is signalled at 1 s and its replacement answers at 1.5 s.
        let run = |attempts: Vec<crate::report::FailedEnqueue>| {
            let mut w = World::new();
            w.event(EventKind::ApiSignal, Some(7), 1_000);
            w.event(EventKind::ApiReady, Some(8), 1_500);
            w.enqueue_failures.attempts = attempts;
            w.enqueued("b1", 0, false);
            w.enqueue_us.record(20_000).unwrap();
            check(&w.input())
        };
        // Three connection errors while it was down, the last one begun just before the ready.
        let v = run(failed_between(1_020, 3, 200));
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        assert_eq!(v.figures["enqueue_failed_api_down"], 3);
        // The same failures after the replacement answered are the stack's.
        let v = run(failed_between(1_600, 3, 200));
        assert_eq!(v.status, Status::Violated, "{v:#?}");
        assert_eq!(rules(&v), ["enqueue_failed"]);
        assert_eq!(v.figures["enqueue_failed_api_down"], 0);
        // An API that never came back: everything after the signal is excused.
        let mut w = World::new();
        w.event(EventKind::ApiSignal, Some(7), 1_000);
        w.enqueue_failures.attempts = failed_between(5_000, 2, 100);
        w.enqueued("b1", 0, false);
        assert_eq!(check(&w.input()).figures["enqueue_failed_api_down"], 2);
    }

    #[test]
    fn failed_enqueues_against_the_contract() {
        let shed = (Some(503), Some(1));
        let too_many = (Some(429), Some(1));
        let error = (Some(500), None);
        let bare_503 = (Some(503), None);
        let reset = (None, None);
        // (failed attempts of b1, b1 accepted in the end, expected status, rules broken)
        type Attempt = (Option<u16>, Option<u64>);
        let cases: &[(&[Attempt], bool, Status, &[&str])] = &[
            (&[], true, Status::Holds, &[]),
            // One failure without shedding is what a correct stack meets at a restart: tolerated.
            (&[error], true, Status::Holds, &[]),
            (&[reset], true, Status::Holds, &[]),
            // Shedding load with Retry-After is allowed however often, while it ends in an accept.
            (&[shed; 12], true, Status::Holds, &[]),
            (&[too_many, shed, error], true, Status::Holds, &[]),
            (&[error, reset], true, Status::Violated, &["enqueue_failed"]),
            (
                &[bare_503, bare_503],
                true,
                Status::Violated,
                &["enqueue_failed"],
            ),
            (
                &[error; 20],
                false,
                Status::Violated,
                &["enqueue_not_accepted"],
            ),
            (
                &[shed; 20],
                false,
                Status::Violated,
                &["enqueue_not_accepted"],
            ),
        ];
        for (attempts, accepted, status, broken) in cases {
            let mut w = World::new();
            w.enqueue_failures.attempts = attempts.iter().map(|&(s, r)| failed(s, r)).collect();
            if *accepted {
                w.enqueued("b1", 0, false);
                w.enqueue_us.record(20_000).unwrap();
            } else {
                w.enqueue_failures
                    .not_accepted
                    .push(crate::report::NotAccepted {
                        batch_id: "b1".into(),
                        first_sent_ns: 0,
                        gave_up_ns: 30_000_000_000,
                        attempts: attempts.len() as u32,
                        deliveries: 3,
                        last_error: "HTTP 500: database error".into(),
                        trickle: false,
                    });
            }
            let v = check(&w.input());
            assert_eq!(v.status, *status, "{attempts:?}: {v:#?}");
            assert_eq!(rules(&v), *broken, "{attempts:?}");
            assert_eq!(v.figures["enqueue_failed"], attempts.len(), "{v:#?}");
            assert_eq!(v.judged["enqueue_failed"].judged, 1);
        }
    }

    #[test]
    fn a_batch_never_accepted_fails_the_run_beside_an_slo() {
        let mut w = World::new();
        w.scenario.expect.enqueue_p99 = Some(Duration::from_millis(100));
        for _ in 0..200 {
            w.enqueue_us.record(20_000).unwrap();
        }
        w.enqueued("b2", 0, false);
        w.enqueue_failures.attempts.push(failed(Some(500), None));
        w.enqueue_failures
            .not_accepted
            .push(crate::report::NotAccepted {
                batch_id: "b1".into(),
                first_sent_ns: 0,
                gave_up_ns: 1,
                attempts: 1,
                deliveries: 3,
                last_error: "HTTP 500".into(),
                trickle: false,
            });
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated, "{v:#?}");
        assert_eq!(rules(&v), ["enqueue_not_accepted"]);
        assert!(v.summary.contains("never accepted"), "{}", v.summary);
        // The SLO stays the main rule ([expect] min_judged raises it).
        assert_eq!(v.main_rule.as_deref(), Some("enqueue_p99_over_slo"));
    }
}
