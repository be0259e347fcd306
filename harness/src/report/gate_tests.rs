//! Tables for the regression gate: parsing, comparison, thresholds — each with cases that must
//! be reported, so the gate is seen to fail.

use super::*;

fn m(deliveries_per_s: f64, enqueue_p99_ms: f64, e2e_p50_ms: f64, e2e_p99_ms: f64) -> Metrics {
    Metrics {
        deliveries_per_s: Some(deliveries_per_s),
        enqueue_p99_ms: Some(enqueue_p99_ms),
        e2e_p50_ms: Some(e2e_p50_ms),
        e2e_p99_ms: Some(e2e_p99_ms),
    }
}

#[test]
fn thresholds_parse() {
    use Metric::*;
    let cases: [(&str, Metric, Op, f64); 8] = [
        ("deliveries_per_s >= 400", DeliveriesPerS, Op::Ge, 400.0),
        ("deliveries_per_s>400/s", DeliveriesPerS, Op::Gt, 400.0),
        ("enqueue_p99 <= 50ms", EnqueueP99, Op::Le, 50.0),
        ("enqueue_p99 <= \"50ms\"", EnqueueP99, Op::Le, 50.0),
        ("e2e_p99 <= 3s", E2eP99, Op::Le, 3000.0),
        ("e2e_p99_ms < 2500", E2eP99, Op::Lt, 2500.0),
        ("  e2e_p50 <= 1m ", E2eP50, Op::Le, 60_000.0),
        ("e2e_p50 <= 1s 500ms", E2eP50, Op::Le, 1500.0),
    ];
    for (input, metric, op, limit) in cases {
        let t: Threshold = input.parse().unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!((t.metric, t.op, t.limit), (metric, op, limit), "{input}");
        assert_eq!(t.as_str(), input.trim());
    }
}

#[test]
fn bad_thresholds_say_what_is_wrong() {
    let cases = [
        ("deliveries_per_s 400", "expected `METRIC OP VALUE`"),
        ("throughput >= 400", "unknown metric \"throughput\"; metrics: deliveries_per_s, enqueue_p99, e2e_p50, e2e_p99"),
        ("e2e_p99 <= soon", "is not a duration like 50ms or 3s"),
        ("deliveries_per_s >= many", "is not a number of deliveries per second"),
        ("e2e_p99 <= -5", "is not a finite, non-negative value"),
        (">= 5", "expected `METRIC OP VALUE`"),
        ("e2e_p99 <=", "expected `METRIC OP VALUE`"),
    ];
    for (input, want) in cases {
        let err = input.parse::<Threshold>().expect_err(input).to_string();
        assert!(err.contains(want), "{input}: {err}");
    }
}

#[test]
fn thresholds_round_trip_through_serde() {
    let t: Vec<Threshold> =
        serde_json::from_str(r#"["e2e_p99 <= 3s", "deliveries_per_s >= 400"]"#).unwrap();
    assert_eq!(
        serde_json::to_string(&t).unwrap(),
        r#"["e2e_p99 <= 3s","deliveries_per_s >= 400"]"#
    );
    let bad = serde_json::from_str::<Vec<Threshold>>(r#"["p99 <= 3s"]"#).unwrap_err();
    assert!(bad.to_string().contains("unknown metric"), "{bad}");
}

#[test]
fn tolerance_parses() {
    for (input, want) in [
        ("15%", Some(0.15)),
        ("0.15", Some(0.15)),
        (" 5 % ", Some(0.05)),
        ("0", Some(0.0)),
        ("-1%", None),
        ("lots", None),
        // A bare number is a share: 15 would mean 1500%.
        ("1", Some(1.0)),
        ("15", None),
        ("150%", Some(1.5)),
        ("inf%", None),
        ("NaN", None),
    ] {
        assert_eq!(parse_tolerance(input).ok(), want, "{input}");
    }
}

#[test]
fn baseline_comparison() {
    let base = m(400.0, 50.0, 800.0, 3000.0);
    // (new metrics, tolerance, metrics expected to regress)
    let cases: [(Metrics, f64, &[Metric]); 7] = [
        (m(400.0, 50.0, 800.0, 3000.0), 0.15, &[]),
        (m(341.0, 57.0, 5000.0, 3449.0), 0.15, &[]), // within 15%; p50 is not compared
        (
            m(339.0, 50.0, 800.0, 3000.0),
            0.15,
            &[Metric::DeliveriesPerS],
        ),
        (m(400.0, 58.0, 800.0, 3000.0), 0.15, &[Metric::EnqueueP99]),
        (m(400.0, 50.0, 800.0, 3451.0), 0.15, &[Metric::E2eP99]),
        (m(0.0, 0.0, 0.0, 0.0), 0.15, &[Metric::DeliveriesPerS]),
        (
            m(399.0, 50.1, 800.0, 3000.1),
            0.0,
            &[Metric::DeliveriesPerS, Metric::EnqueueP99, Metric::E2eP99],
        ),
    ];
    for (new, tol, want) in cases {
        let got: Vec<Metric> = compare_metrics(&base, &new, tol)
            .iter()
            .map(|r| r.metric)
            .collect();
        assert_eq!(got, want, "{new:?} tol {tol}");
    }
}

#[test]
fn an_old_baseline_without_metrics_never_fails_a_run() {
    assert_eq!(
        compare_metrics(&Metrics::default(), &m(1.0, 9e9, 9e9, 9e9), 0.0),
        []
    );
}

#[test]
fn regressions_read_well() {
    let r = compare_metrics(
        &m(412.0, 10.0, 0.0, 100.0),
        &m(301.5, 10.0, 0.0, 180.0),
        0.15,
    );
    let lines: Vec<String> = r.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "deliveries_per_s regressed: baseline 412.0 → this run 301.5 (−26.8%, tolerance 15%)",
            "e2e_p99_ms regressed: baseline 100.0 → this run 180.0 (+80.0%, tolerance 15%)",
        ]
    );
    let t: Threshold = "e2e_p99 <= 3s".parse().unwrap();
    let r = check_thresholds(&m(0.0, 0.0, 0.0, 3412.0), &[t]);
    assert_eq!(
        r[0].to_string(),
        "e2e_p99_ms over threshold: this run 3412.0 (threshold e2e_p99 <= 3s)"
    );
}

#[test]
fn thresholds_are_checked() {
    let ts: Vec<Threshold> = [
        "deliveries_per_s >= 400",
        "enqueue_p99 <= 50ms",
        "e2e_p99 <= 3s",
        "e2e_p50 < 1s",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    let cases: [(Metrics, &[&str]); 5] = [
        (m(400.0, 50.0, 999.0, 3000.0), &[]),
        (m(399.9, 50.0, 999.0, 3000.0), &["deliveries_per_s >= 400"]),
        (m(500.0, 51.0, 999.0, 3000.0), &["enqueue_p99 <= 50ms"]),
        (
            m(500.0, 1.0, 1000.0, 3001.0),
            &["e2e_p99 <= 3s", "e2e_p50 < 1s"],
        ),
        (m(0.0, 0.0, 0.0, 0.0), &["deliveries_per_s >= 400"]),
    ];
    for (metrics, want) in cases {
        let got = check_thresholds(&metrics, &ts);
        let got: Vec<&str> = got
            .iter()
            .map(|r| r.threshold.as_ref().unwrap().as_str())
            .collect();
        assert_eq!(got, want, "{metrics:?}");
    }
}

#[test]
fn every_gate_is_listed_and_failures_carry_their_line() {
    let ts: Vec<Threshold> = ["deliveries_per_s >= 400", "e2e_p99 <= 3s"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let base = m(4000.0, 5.0, 0.0, 300.0);
    let new = m(412.0, 5.0, 0.0, 3412.0);
    let gates = evaluate(&new, &ts, Some((&base, 0.15)));
    let got: Vec<(&str, &str, bool)> = gates
        .iter()
        .map(|g| (g.kind.as_str(), g.name.as_str(), g.passed))
        .collect();
    assert_eq!(
        got,
        [
            ("threshold", "deliveries_per_s >= 400", true),
            ("threshold", "e2e_p99 <= 3s", false),
            ("baseline", "deliveries_per_s within 15% of baseline", false),
            ("baseline", "enqueue_p99_ms within 15% of baseline", true),
            ("baseline", "e2e_p99_ms within 15% of baseline", false),
        ]
    );
    assert!(gates
        .iter()
        .filter(|g| g.passed)
        .all(|g| g.message.is_empty()));
    assert_eq!(
        gates[2].message,
        "deliveries_per_s regressed: baseline 4000.0 → this run 412.0 (−89.7%, tolerance 15%)"
    );
    assert_eq!((gates[2].limit, gates[2].value), (4000.0, Some(412.0)));
    // A metric the baseline lacks is not a gate at all.
    let gates = evaluate(&new, &[], Some((&m(0.0, 5.0, 0.0, 0.0), 0.15)));
    assert_eq!(gates.len(), 1);
    assert_eq!(gates[0].metric, "enqueue_p99_ms");
}

/// A metric this run has no data for never passes a gate: it is insufficient, with the reason;
/// a baseline that has none (null) is not compared.
#[test]
fn a_gate_without_data_is_insufficient_never_passed() {
    let ts: Vec<Threshold> = ["e2e_p99 <= 3s", "deliveries_per_s >= 1"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let mut new = m(412.0, 5.0, 100.0, 300.0);
    new.e2e_p99_ms = None;
    let base = m(400.0, 5.0, 100.0, 300.0);
    let gates = evaluate(&new, &ts, Some((&base, 0.15)));
    let got: Vec<(&str, bool, bool)> = gates
        .iter()
        .map(|g| (g.name.as_str(), g.passed, g.insufficient))
        .collect();
    assert_eq!(
        got,
        [
            ("e2e_p99 <= 3s", false, true),
            ("deliveries_per_s >= 1", true, false),
            ("deliveries_per_s within 15% of baseline", true, false),
            ("enqueue_p99_ms within 15% of baseline", true, false),
            ("e2e_p99_ms within 15% of baseline", false, true),
        ]
    );
    assert!(gates[0].message.contains("no data"), "{}", gates[0].message);
    assert_eq!(gates[0].value, None);
    // A baseline without the metric compares nothing, whatever this run has.
    let mut base = base;
    base.e2e_p99_ms = None;
    assert_eq!(evaluate(&new, &[], Some((&base, 0.15))).len(), 2);
}
