//! The claim benchmark runs end to end (tiny sizes; the figures themselves are not asserted).

mod common;

#[tokio::test]
async fn claim_bench_measures_both_sides() {
    let db = common::fresh_db().await;
    let pgbench = which("pgbench");
    let opts = stack::bench::BenchOptions {
        connections: vec![1, 2],
        batches: vec![1, 4],
        statements: 50,
        pgbench: pgbench.clone(),
        ..Default::default()
    };
    let rows = stack::bench::claim_bench(&db.url, &opts).await.unwrap();
    eprintln!("{}", stack::bench::render(&rows));
    assert_eq!(rows.len(), 4);
    for r in &rows {
        assert!(r.stack > 0.0);
        assert_eq!(
            r.pgbench.is_some(),
            pgbench.is_some(),
            "pgbench ran iff installed"
        );
    }
}

fn which(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(bin))
        .find(|p| p.is_file())
}
