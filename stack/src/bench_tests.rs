//! Tests of the claim benchmark (`bench.rs`), kept apart so the benchmark reads in one sitting.

use super::*;

fn round(stack: f64, pgbench: Option<f64>, doubles: u64) -> BenchRow {
    BenchRow {
        workers: 4,
        batch: 1,
        seeded: 100,
        claimed: 100,
        claims: 100,
        seconds: 1.0,
        stack,
        efficiency: None,
        latency_ms: LatencyMs::default(),
        double_claims: doubles,
        unclaimed: 0,
        pgbench,
        pgbench_double_claims: pgbench.map(|_| doubles),
        stack_profile: usage::Profile::default(),
        pgbench_profile: None,
        round_ratios: Vec::new(),
    }
}

#[test]
fn the_median_round_is_reported_with_every_rounds_ratio() {
    let rounds = vec![
        round(90.0, Some(100.0), 0),
        round(70.0, Some(100.0), 1),
        round(120.0, Some(100.0), 0),
    ];
    let m = median_round(rounds);
    assert_eq!(m.stack, 90.0);
    assert_eq!(m.round_ratios, vec![0.9, 0.7, 1.2], "in the order run");
    // A double claim in any round is not hidden by the choice of round.
    assert_eq!((m.double_claims, m.pgbench_double_claims), (1, Some(1)));
    let table = render_rounds(&[m]);
    assert!(
        table.contains("90% 70% 120%   (min 70%, max 120%)"),
        "{table}"
    );

    // Even count: the lower median. One round: nothing extra to list.
    let m = median_round(vec![
        round(80.0, Some(100.0), 0),
        round(60.0, Some(100.0), 0),
    ]);
    assert_eq!(m.stack, 60.0);
    let one = median_round(vec![round(80.0, Some(100.0), 0)]);
    assert!(one.round_ratios.is_empty() && render_rounds(&[one]).is_empty());
    // Without pgbench: the median stack figure.
    let m = median_round(vec![
        round(5.0, None, 0),
        round(9.0, None, 0),
        round(7.0, None, 0),
    ]);
    assert_eq!((m.stack, m.pgbench_double_claims), (7.0, None));
}

/// A claimer that cannot connect fails the measurement with its own reason; the call returns
/// instead of waiting for every claimer to get ready.
#[tokio::test]
async fn a_claimer_that_cannot_connect_fails_the_measurement() {
    let nowhere = "postgres://nobody@127.0.0.1:1/none";
    let pool = PgPool::connect_lazy(nowhere).expect("a lazy pool");
    let side = stack_side(&pool, nowhere, 3, 1, Duration::from_secs(1), None, None);
    let err = tokio::time::timeout(Duration::from_secs(60), side)
        .await
        .expect("returns instead of hanging")
        .expect_err("nothing to connect to");
    assert!(
        format!("{err:#}").contains("connecting a claimer"),
        "{err:#}"
    );
}
