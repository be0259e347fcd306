//! `responsiveness`: enqueueing a batch stays fast while the stack is under load and chaos.
//!
//! Compares the p99 of the harness's measured `POST /v1/batches` latencies with
//! `expect.enqueue_p99`. Without an SLO the figures are still computed and the verdict is
//! `NotChecked`. Judged: the enqueues measured; a p99 needs at least 100 (fewer is
//! insufficient, unless more than one of them is already over the SLO: then the p99 is over it
//! whatever the rest would have been). Must never use latencies the stack reports about itself.

use serde_json::json;

use super::common::{figures, Findings};
use super::{Input, Status, Verdict};

pub const NAME: &str = "responsiveness";

/// Enqueues a p99 needs: below 100 samples the "p99" is just the slowest one or two.
pub const P99_MIN_SAMPLES: u64 = 100;

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
            // More than 1% of P99_MIN_SAMPLES over the SLO proves the p99 over it however many
            // more enqueues there had been; fewer samples prove nothing either way.
            let over = h.count_between((slo_ms * 1e3) as u64 + 1, u64::MAX);
            let proven = if h.len() >= P99_MIN_SAMPLES {
                q(0.99) > slo_ms
            } else {
                over * 100 > P99_MIN_SAMPLES
            };
            if proven {
                findings.push(json!({"rule": "enqueue_p99_over_slo", "p99_ms": q(0.99), "slo_ms": slo_ms, "count": h.len(), "over_slo": over}));
                (
                    Status::Violated,
                    format!("{stats}: p99 over the {slo_ms} ms SLO"),
                )
            } else {
                (
                    Status::Holds,
                    format!("{stats}: p99 within the {slo_ms} ms SLO"),
                )
            }
        }
    };
    if slo.is_some() {
        findings.judged_at_least("enqueue_p99_over_slo", h.len(), P99_MIN_SAMPLES);
    }
    findings.verdict_with(NAME, status, summary, figs)
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
}
