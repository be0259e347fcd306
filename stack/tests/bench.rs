//! The claim benchmark runs end to end (tiny sizes; the figures themselves are not asserted), and
//! its double-claim audit is seen to fail when a row is claimed twice.

mod common;

#[tokio::test]
async fn claim_bench_measures_both_sides() {
    let db = common::fresh_db().await;
    let pgbench = which("pgbench");
    let opts = stack::bench::BenchOptions {
        workers: vec![1, 2],
        batches: vec![1, 4],
        amount: stack::bench::Amount::Rows(80),
        pgbench: pgbench.clone(),
        ..Default::default()
    };
    let rows = stack::bench::claim_bench(&db.url, &opts, |_| {})
        .await
        .unwrap();
    let table = stack::bench::render(&rows);
    eprintln!("{table}");
    assert_eq!(rows.len(), 4);
    for r in &rows {
        assert!(r.stack > 0.0);
        assert_eq!(r.claimed, r.seeded, "rows mode drains the queue: {r:?}");
        assert_eq!((r.double_claims, r.unclaimed), (0, 0));
        assert!(r.latency_ms.p50 > 0.0 && r.latency_ms.p999 >= r.latency_ms.p50);
        assert_eq!(
            r.pgbench.is_some(),
            pgbench.is_some(),
            "pgbench ran iff installed"
        );
        assert!(r.efficiency.is_some(), "1 worker measured first");
        // Every claim and completion writes WAL (two updates and two audit events per row).
        assert!(
            r.stack_profile.wal_bytes.is_some_and(|b| b > 100.0),
            "{r:?}"
        );
        if std::env::var_os("DATABASE_URL").is_none() {
            // The throwaway cluster runs on this machine: its CPU is visible in /proc.
            assert!(r.stack_profile.server_cpu_us.is_some(), "{r:?}");
        }
        assert_eq!(r.pgbench_profile.is_some(), pgbench.is_some());
    }
    assert!(table.contains("profile per row"), "{table}");
    assert!(table.contains("verification: OK"), "{table}");
}

#[tokio::test]
async fn audit_catches_a_row_claimed_twice() {
    let db = common::fresh_db().await;
    let opts = stack::bench::BenchOptions {
        workers: vec![1],
        batches: vec![5],
        amount: stack::bench::Amount::Rows(20),
        pgbench: None,
        ..Default::default()
    };
    stack::bench::claim_bench(&db.url, &opts, |_| {})
        .await
        .unwrap();
    let pool = common::pool(&db.url).await;
    assert_eq!(stack::bench::audit(&pool).await.unwrap(), (20, 0));
    // A second claim of one row, as a racy claim would record it.
    sqlx::query(
        "INSERT INTO delivery_events (delivery_id, from_state, to_state, source, detail) \
         SELECT min(id), 'pending', 'sending', 'worker', 'intruder' FROM deliveries",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(stack::bench::audit(&pool).await.unwrap(), (20, 1));
}

fn which(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(bin))
        .find(|p| p.is_file())
}
