//! The claim benchmark behind `ting-chaos bench claim`: claims/s of the stack's own claim path
//! ([`crate::claim::claim`]) beside `pgbench` running the identical statement
//! ([`crate::claim::pgbench_script`], bind parameters and all) on the same database in the same run, at several
//! connection counts, single-row and batched.
//!
//! Both sides do the same work: the same number of claim statements per connection over a table
//! freshly seeded with exactly enough ready rows. It is a command that prints figures, not a
//! test. This module must never be pointed at a database with real deliveries: it truncates.

use std::fmt::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sqlx::PgPool;

use crate::claim;

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Connection counts (default 1, 4, 16).
    pub connections: Vec<usize>,
    /// Claim sizes (default 1 and 32).
    pub batches: Vec<i64>,
    /// Claim statements per measurement, split over the connections (default 4 000).
    pub statements: usize,
    /// The `pgbench` binary; `None` measures the stack side only.
    pub pgbench: Option<PathBuf>,
    pub lease: Duration,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            connections: vec![1, 4, 16],
            batches: vec![1, 32],
            statements: 4_000,
            pgbench: Some(PathBuf::from("pgbench")),
            lease: Duration::from_secs(60),
        }
    }
}

/// One line of the result.
#[derive(Clone, Debug)]
pub struct BenchRow {
    pub connections: usize,
    pub batch: i64,
    /// Rows claimed per second by the stack's claim path.
    pub stack: f64,
    /// Rows claimed per second by pgbench with the same SQL, if it ran.
    pub pgbench: Option<f64>,
}

impl BenchRow {
    /// stack / pgbench.
    pub fn ratio(&self) -> Option<f64> {
        self.pgbench.filter(|p| *p > 0.0).map(|p| self.stack / p)
    }
}

/// Runs every (connections × batch) measurement on `database_url` (migrated; it is truncated).
pub async fn claim_bench(database_url: &str, opts: &BenchOptions) -> anyhow::Result<Vec<BenchRow>> {
    let max = opts.connections.iter().copied().max().unwrap_or(1) as u32 + 1;
    let pool = crate::pool(database_url, max).await?;
    let mut out = Vec::new();
    for &conns in &opts.connections {
        for &batch in &opts.batches {
            let per_conn = (opts.statements / conns).max(1);
            let rows = (per_conn * conns) as i64 * batch;
            seed(&pool, rows).await?;
            let stack = stack_side(&pool, conns, per_conn, batch, opts.lease).await?;
            let pgbench = match &opts.pgbench {
                Some(bin) => {
                    seed(&pool, rows).await?;
                    Some(pgbench_side(bin, database_url, conns, per_conn, batch, opts.lease).await?)
                }
                None => None,
            };
            out.push(BenchRow {
                connections: conns,
                batch,
                stack,
                pgbench,
            });
        }
    }
    pool.close().await;
    Ok(out)
}

/// The printed table.
pub fn render(rows: &[BenchRow]) -> String {
    let mut s = String::from("connections  batch   stack rows/s  pgbench rows/s  stack/pgbench\n");
    for r in rows {
        let pg = r.pgbench.map_or("-".to_string(), |p| format!("{p:.0}"));
        let ratio = r
            .ratio()
            .map_or("-".to_string(), |x| format!("{:.0}%", x * 100.0));
        let _ = writeln!(
            s,
            "{:>11}  {:>5}  {:>13.0}  {:>14}  {:>13}",
            r.connections, r.batch, r.stack, pg, ratio
        );
    }
    s
}

async fn seed(pool: &PgPool, rows: i64) -> anyhow::Result<()> {
    sqlx::query("TRUNCATE delivery_events, deliveries, batches, callback_receipts")
        .execute(pool)
        .await
        .context("truncating")?;
    sqlx::query("INSERT INTO batches (id, template_id, template_version, deliveries) VALUES ('bench', 't', 1, 0)")
        .execute(pool)
        .await?;
    sqlx::query(
        "INSERT INTO deliveries (batch_id, key, recipient, channel, address, template_version, payload, \
         payload_sha256, correlation_id) \
         SELECT 'bench', 'bench:r' || g || ':line', 'r' || g, 'line', 'U' || g, 1, \
         '{\"text\": \"bench\"}'::jsonb, md5(g::text), 'bench-' || g FROM generate_series(1, $1) g",
    )
    .bind(rows)
    .execute(pool)
    .await
    .context("seeding")?;
    sqlx::query("VACUUM ANALYZE deliveries")
        .execute(pool)
        .await?;
    Ok(())
}

async fn stack_side(
    pool: &PgPool,
    conns: usize,
    per_conn: usize,
    batch: i64,
    lease: Duration,
) -> anyhow::Result<f64> {
    let mut connections = Vec::new();
    for _ in 0..conns {
        connections.push(pool.acquire().await?);
    }
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, mut conn) in connections.into_iter().enumerate() {
        tasks.spawn(async move {
            let mut n = 0usize;
            for _ in 0..per_conn {
                n += claim::claim(&mut conn, &format!("bench-{i}"), batch, lease)
                    .await?
                    .len();
            }
            Ok::<usize, sqlx::Error>(n)
        });
    }
    let mut total = 0;
    while let Some(r) = tasks.join_next().await {
        total += r??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

async fn pgbench_side(
    bin: &PathBuf,
    url: &str,
    conns: usize,
    per_conn: usize,
    batch: i64,
    lease: Duration,
) -> anyhow::Result<f64> {
    let dir = std::env::temp_dir().join(format!("ting-claim-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("claim.sql");
    std::fs::write(&script, claim::pgbench_script())?;
    let out = tokio::process::Command::new(bin)
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &conns.to_string(),
            "-j",
            &conns.to_string(),
        ])
        .args(claim::pgbench_defines("bench", batch, lease))
        .args(["-t", &per_conn.to_string(), "-f"])
        .arg(&script)
        .arg(url)
        .output()
        .await
        .with_context(|| format!("running {}", bin.display()))?;
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "pgbench failed: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // "tps = 1234.56 (without initial connection time)"
    let tps = stdout
        .lines()
        .filter(|l| l.starts_with("tps = "))
        .find_map(|l| l[6..].split_whitespace().next()?.parse::<f64>().ok())
        .with_context(|| format!("no tps in pgbench output: {stdout}"))?;
    Ok(tps * batch as f64)
}
