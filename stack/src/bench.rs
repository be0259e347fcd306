//! The claim benchmark behind `ting-chaos bench claim`: rows/s of the stack's own claim path
//! ([`crate::claim::claim`], then one batched completion of what it holds) beside `pgbench`
//! running the identical two statements on the same database in the same run, at several worker
//! (connection) counts and claim sizes.
//!
//! Both sides start from a table freshly seeded with the same number of ready rows and claim and
//! complete until it is empty (or for a fixed duration). Each stack-side claimer runs as the stack
//! deploys a worker and as pgbench runs a client: on a thread of its own, with its own
//! single-threaded runtime and connection, so the two sides differ in the claim path alone, not in
//! how many threads share the connections. The stack side also measures claim latency
//! (HdrHistogram, corrected for coordinated omission) and verifies afterwards, from the ids it got
//! back and from `delivery_transitions`, that no row was claimed twice and none was left behind.
//!
//! It is a command that prints figures, not a test. This module must never be pointed at a
//! database with real deliveries: it truncates.

mod pgbench;
pub mod usage;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use crate::claim;

/// The completion both sides run after each claim: every row this worker holds goes to
/// `delivered`, fenced on its lease owner, recording the transition on the row as
/// [`crate::state::transition`] does, in one round trip. (The worker's real per-row completion is
/// that function; a batched claim followed by one statement per row would measure round trips,
/// not the queue.)
pub const COMPLETE_SQL: &str = r#"
WITH done AS (
    UPDATE delivery_state d
    SET state = 'delivered', updated_at = now(), lease_owner = NULL, lease_expires_at = NULL,
        head_from = 'sending', head_source = 'worker', head_detail = $1,
        head_outcome_class = 'accepted', head_at = clock_timestamp(), head_claimed_by = $1
    WHERE d.state = 'sending' AND d.lease_owner = $1
    RETURNING d.id
)
SELECT count(*) FROM done
"#;

/// How much work one measurement is.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Amount {
    /// Seed about this many rows (rounded down to a multiple of workers × batch) and drain them.
    Rows(u64),
    /// Seed this many rows and claim for this long (stopping early if they run out).
    Duration {
        #[serde(serialize_with = "ser_secs")]
        duration: Duration,
        rows: u64,
    },
}

impl Amount {
    /// How long each side claims, when the amount is a duration (else: until the rows run out).
    fn duration(&self) -> Option<Duration> {
        match self {
            Amount::Rows(_) => None,
            Amount::Duration { duration, .. } => Some(*duration),
        }
    }
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Worker counts: one connection each (default 1, 2, 4, 8, 16, 32).
    pub workers: Vec<usize>,
    /// Claim sizes (default 1, 10, 100).
    pub batches: Vec<i64>,
    pub amount: Amount,
    /// The `pgbench` binary; `None` measures the stack side only.
    pub pgbench: Option<PathBuf>,
    pub lease: Duration,
    /// Rounds per measurement: each runs both sides, alternating which goes first, and the round
    /// with the median stack/pgbench ratio is reported (default 1).
    pub rounds: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            workers: vec![1, 2, 4, 8, 16, 32],
            batches: vec![1, 10, 100],
            amount: Amount::Rows(20_000),
            pgbench: Some(PathBuf::from("pgbench")),
            lease: Duration::from_secs(60),
            rounds: 1,
        }
    }
}

/// Claim latency in milliseconds, from the intended start of each claim.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LatencyMs {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    /// p99 as measured, before the coordinated-omission correction.
    pub raw_p99: f64,
}

/// One line of the result.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    pub workers: usize,
    pub batch: i64,
    /// Rows seeded for each side.
    pub seeded: u64,
    /// Rows the stack side claimed (and completed).
    pub claimed: u64,
    /// Claim statements that returned rows.
    pub claims: u64,
    pub seconds: f64,
    /// Rows claimed per second by the stack's claim path.
    pub stack: f64,
    /// `stack` over (workers × the 1-worker figure at the same batch size).
    pub efficiency: Option<f64>,
    pub latency_ms: LatencyMs,
    /// Rows claimed more than once (from the returned ids and from `delivery_transitions`): must be 0.
    pub double_claims: u64,
    /// Ready rows left when the stack side stopped (must be 0 in rows mode).
    pub unclaimed: u64,
    /// Rows claimed per second by pgbench with the same SQL, if it ran.
    pub pgbench: Option<f64>,
    /// Rows claimed more than once on the pgbench side (same check).
    pub pgbench_double_claims: Option<u64>,
    /// Per-row client CPU, server CPU and WAL of the stack side.
    pub stack_profile: usage::Profile,
    /// The same for the pgbench side, if it ran.
    pub pgbench_profile: Option<usage::Profile>,
    /// stack/pgbench of every round, in the order run, when there was more than one (this row
    /// is the median round's; double claims and leftovers are summed over all rounds).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub round_ratios: Vec<f64>,
}

impl BenchRow {
    /// stack / pgbench.
    pub fn ratio(&self) -> Option<f64> {
        self.pgbench.filter(|p| *p > 0.0).map(|p| self.stack / p)
    }
}

/// Runs every (workers × batch) measurement on `database_url` (migrated; it is truncated).
/// `progress` gets one line per finished measurement.
pub async fn claim_bench(
    database_url: &str,
    opts: &BenchOptions,
    mut progress: impl FnMut(&BenchRow),
) -> anyhow::Result<Vec<BenchRow>> {
    // Seeding, snapshots and the audit; each claimer connects on its own.
    let pool = crate::pool(database_url, 2).await?;
    let postmaster = usage::postmaster(&pool).await;
    let mut out: Vec<BenchRow> = Vec::new();
    let mut single: BTreeMap<i64, f64> = BTreeMap::new();
    for &workers in &opts.workers {
        for &batch in &opts.batches {
            let seeded = match opts.amount {
                Amount::Rows(n) => {
                    let unit = workers as u64 * batch as u64;
                    (n / unit).max(1) * unit
                }
                Amount::Duration { rows, .. } => rows,
            };
            let mut rounds: Vec<BenchRow> = Vec::new();
            for round in 0..opts.rounds.max(1) {
                // Alternate which side goes first, so drift on a shared machine hits both alike.
                let pgbench_first = round % 2 == 1;
                let pgbench = || {
                    pgbench_side(
                        &pool,
                        database_url,
                        opts,
                        workers,
                        batch,
                        seeded,
                        postmaster,
                    )
                };
                let first = if pgbench_first {
                    pgbench().await?
                } else {
                    None
                };
                seed(&pool, seeded).await?;
                let mut row = stack_side(
                    &pool,
                    database_url,
                    workers,
                    batch,
                    opts.lease,
                    opts.amount.duration(),
                    postmaster,
                )
                .await?;
                row.seeded = seeded;
                let pg = if pgbench_first {
                    first
                } else {
                    pgbench().await?
                };
                if let Some(pg) = pg {
                    row.pgbench_profile = Some(pg.profile);
                    row.pgbench = Some(pg.rows_per_s);
                    row.pgbench_double_claims = Some(pg.doubles);
                }
                rounds.push(row);
            }
            let mut row = median_round(rounds);
            if workers == 1 {
                single.insert(batch, row.stack);
            }
            row.efficiency = single
                .get(&batch)
                .filter(|s| **s > 0.0)
                .map(|s| row.stack / (s * workers as f64));
            progress(&row);
            out.push(row);
        }
    }
    pool.close().await;
    Ok(out)
}

/// What the pgbench side of one round measured.
struct PgbenchRound {
    rows_per_s: f64,
    doubles: u64,
    profile: usage::Profile,
}

/// pgbench running the identical SQL on a freshly seeded table; `None` without pgbench.
async fn pgbench_side(
    pool: &PgPool,
    database_url: &str,
    opts: &BenchOptions,
    workers: usize,
    batch: i64,
    seeded: u64,
    postmaster: Option<u32>,
) -> anyhow::Result<Option<PgbenchRound>> {
    let Some(bin) = &opts.pgbench else {
        return Ok(None);
    };
    seed(pool, seeded).await?;
    let run = pgbench::Run {
        bin,
        url: database_url,
        workers,
        batch,
        lease: opts.lease,
        transactions: seeded / (workers as u64 * batch as u64),
        duration: opts.amount.duration(),
    };
    let before = usage::Snapshot::take(pool, postmaster).await;
    let tx = run.execute().await?;
    let after = usage::Snapshot::take(pool, postmaster).await;
    let (claimed, doubles) = audit(pool).await?;
    Ok(Some(PgbenchRound {
        rows_per_s: claimed as f64 * tx.tps / tx.transactions.max(1) as f64,
        doubles,
        profile: after.since(&before, usage::Client::Children, claimed),
    }))
}

/// The round with the median stack/pgbench ratio (the lower median for an even count), carrying
/// every round's ratio and the double claims and leftovers of all rounds. Without pgbench, the
/// round with the median stack figure.
fn median_round(mut rounds: Vec<BenchRow>) -> BenchRow {
    let ratios: Vec<f64> = if rounds.len() > 1 {
        rounds.iter().filter_map(BenchRow::ratio).collect()
    } else {
        Vec::new()
    };
    let doubles: u64 = rounds.iter().map(|r| r.double_claims).sum();
    let unclaimed: u64 = rounds.iter().map(|r| r.unclaimed).sum();
    let pg_doubles: Option<u64> = rounds.iter().map(|r| r.pgbench_double_claims).sum();
    let key = |r: &BenchRow| r.ratio().unwrap_or(r.stack);
    rounds.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let mut row = rounds.swap_remove((rounds.len() - 1) / 2);
    row.round_ratios = ratios;
    row.double_claims = doubles;
    row.unclaimed = unclaimed;
    row.pgbench_double_claims = pg_doubles;
    row
}

/// The printed table, with the verification line under it.
pub fn render(rows: &[BenchRow]) -> String {
    let mut s = String::from(
        "workers  batch     rows   stack rows/s  effic.  p50 ms  p99 ms  p999 ms  pgbench rows/s  stack/pgbench\n",
    );
    for r in rows {
        let pg = r.pgbench.map_or("-".to_string(), |p| format!("{p:.0}"));
        let ratio = r
            .ratio()
            .map_or("-".to_string(), |x| format!("{:.0}%", x * 100.0));
        let eff = r
            .efficiency
            .map_or("-".to_string(), |x| format!("{:.0}%", x * 100.0));
        let l = &r.latency_ms;
        let _ = writeln!(
            s,
            "{:>7}  {:>5}  {:>7}  {:>13.0}  {:>6}  {:>6.2}  {:>6.2}  {:>7.2}  {:>14}  {:>13}",
            r.workers, r.batch, r.claimed, r.stack, eff, l.p50, l.p99, l.p999, pg, ratio
        );
    }
    let _ = writeln!(s, "{}", verification(rows));
    s.push_str(&render_rounds(rows));
    s.push_str(&render_profile(rows));
    s
}

/// Every round's stack/pgbench, when measurements ran more than one round.
pub fn render_rounds(rows: &[BenchRow]) -> String {
    let mut s = String::new();
    if rows.iter().all(|r| r.round_ratios.is_empty()) {
        return s;
    }
    s.push_str("stack/pgbench per round (the median round is the one shown above)\n");
    for r in rows.iter().filter(|r| !r.round_ratios.is_empty()) {
        let each: Vec<String> = r
            .round_ratios
            .iter()
            .map(|x| format!("{:.0}%", x * 100.0))
            .collect();
        let (lo, hi) = r
            .round_ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        let _ = writeln!(
            s,
            "{:>7} × {:<4} {}   (min {:.0}%, max {:.0}%)",
            r.workers,
            r.batch,
            each.join(" "),
            lo * 100.0,
            hi * 100.0
        );
    }
    s
}

/// Where each side's time went, per row: client CPU, server CPU (µs) and WAL (bytes).
pub fn render_profile(rows: &[BenchRow]) -> String {
    let mut s = String::from(
        "profile per row   stack: client µs  server µs  WAL B   pgbench: client µs  server µs  WAL B\n",
    );
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |x| format!("{x:.prec$}"));
    for r in rows {
        let p = &r.stack_profile;
        let q = r.pgbench_profile.unwrap_or_default();
        let pg = r.pgbench_profile.is_some();
        let _ = writeln!(
            s,
            "{:>7} × {:<5}  {:>16.1}  {:>9}  {:>5}  {:>18}  {:>9}  {:>5}",
            r.workers,
            r.batch,
            p.client_cpu_us,
            opt(p.server_cpu_us, 1),
            opt(p.wal_bytes, 0),
            if pg {
                format!("{:.1}", q.client_cpu_us)
            } else {
                "-".into()
            },
            opt(q.server_cpu_us.filter(|_| pg), 1),
            opt(q.wal_bytes.filter(|_| pg), 0),
        );
    }
    s
}

/// The one-line verdict on double claims and left-over rows.
pub fn verification(rows: &[BenchRow]) -> String {
    let claimed: u64 = rows.iter().map(|r| r.claimed).sum();
    let doubles: u64 = rows.iter().map(|r| r.double_claims).sum();
    let pg_doubles: u64 = rows.iter().filter_map(|r| r.pgbench_double_claims).sum();
    let left: u64 = rows.iter().map(|r| r.unclaimed).sum();
    let ok = doubles == 0 && pg_doubles == 0;
    format!(
        "verification: {} — {claimed} rows claimed by the stack over {} measurements, \
         {doubles} claimed twice (pgbench side: {pg_doubles}), {left} left unclaimed",
        if ok { "OK" } else { "FAILED" },
        rows.len()
    )
}

/// Throughput series for a chart: (name, [(workers, rows/s)]), one per system and batch size.
pub fn chart_series(rows: &[BenchRow]) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut series: BTreeMap<(u8, i64), Vec<(f64, f64)>> = BTreeMap::new();
    for r in rows {
        series
            .entry((0, r.batch))
            .or_default()
            .push((r.workers as f64, r.stack));
        if let Some(p) = r.pgbench {
            series
                .entry((1, r.batch))
                .or_default()
                .push((r.workers as f64, p));
        }
    }
    series
        .into_iter()
        .map(|((side, batch), pts)| {
            let who = if side == 0 { "stack" } else { "pgbench" };
            (format!("{who} batch {batch}"), pts)
        })
        .collect()
}

async fn seed(pool: &PgPool, rows: u64) -> anyhow::Result<()> {
    sqlx::query(
        "TRUNCATE delivery_events, delivery_state, delivery_items, batches, callback_receipts",
    )
    .execute(pool)
    .await
    .context("truncating")?;
    sqlx::query("INSERT INTO batches (id, template_id, template_version, deliveries) VALUES ('bench', 't', 1, 0)")
        .execute(pool)
        .await?;
    sqlx::query(
        "WITH items AS (INSERT INTO delivery_items (batch_id, key, recipient, channel, address, \
         template_version, payload, payload_sha256, correlation_id) \
         SELECT 'bench', 'bench:r' || g || ':line', 'r' || g, 'line', 'U' || g, 1, \
         '{\"text\": \"bench\"}'::jsonb, md5(g::text), 'bench-' || g FROM generate_series(1, $1) g \
         RETURNING id) INSERT INTO delivery_state (id) SELECT id FROM items",
    )
    .bind(rows as i64)
    .execute(pool)
    .await
    .context("seeding")?;
    sqlx::query("VACUUM ANALYZE delivery_items, delivery_state")
        .execute(pool)
        .await?;
    Ok(())
}

/// (rows claimed, rows claimed more than once), from the audit trail (`delivery_transitions`:
/// every claim, ended or in flight) of the benchmark's database.
pub async fn audit(pool: &PgPool) -> anyhow::Result<(u64, u64)> {
    let (claimed, doubles): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE n > 1) FROM \
         (SELECT delivery_id, count(*) AS n FROM delivery_transitions WHERE to_state = 'sending' \
          GROUP BY delivery_id) c",
    )
    .fetch_one(pool)
    .await
    .context("verifying claims")?;
    Ok((claimed as u64, doubles as u64))
}

/// What one stack-side worker saw.
struct WorkerRun {
    ids: Vec<i64>,
    claims: u64,
    elapsed: Duration,
    hist: Histogram<u64>,
}

async fn worker(
    conn: &mut PgConnection,
    id: String,
    batch: i64,
    lease: Duration,
    deadline: Option<Instant>,
) -> anyhow::Result<WorkerRun> {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut ids = Vec::new();
    let mut claims = 0;
    let start = Instant::now();
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let t = Instant::now();
        let got = claim::claim(conn, &id, batch, lease).await?;
        if got.is_empty() {
            break;
        }
        hist.saturating_record(t.elapsed().as_micros().max(1) as u64);
        claims += 1;
        ids.extend(got.iter().map(|c| c.id));
        let _: (i64,) = sqlx::query_as(COMPLETE_SQL)
            .bind(&id)
            .fetch_one(&mut *conn)
            .await?;
    }
    Ok(WorkerRun {
        ids,
        claims,
        elapsed: start.elapsed(),
        hist,
    })
}

/// When a claimer thread may start: `None` until the clock starts, then the start instant.
/// Dropped without a start, every claimer gives up.
type Go = tokio::sync::watch::Receiver<Option<Instant>>;

/// One claimer as the stack deploys one: its own thread, with its own single-threaded runtime and
/// its own connection (each worker is a process of its own; `pgbench -j` gives each client a
/// thread too). It connects, says so on `ready` (dropped unsent if it cannot), waits for the start
/// on `go`, then claims until the queue is empty or `duration` has passed.
fn claimer(
    url: &str,
    id: String,
    batch: i64,
    lease: Duration,
    duration: Option<Duration>,
    ready: tokio::sync::oneshot::Sender<()>,
    mut go: Go,
) -> anyhow::Result<WorkerRun> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a claimer's runtime")?;
    rt.block_on(async move {
        use sqlx::Connection;
        let mut conn = PgConnection::connect(url)
            .await
            .context("connecting a claimer")?;
        let _ = ready.send(());
        let start = *go
            .wait_for(Option::is_some)
            .await
            .context("the benchmark stopped before it started")?;
        let deadline = duration.zip(start).map(|(d, s)| s + d);
        let run = worker(&mut conn, id, batch, lease, deadline).await;
        let _ = conn.close().await;
        run
    })
}

async fn stack_side(
    pool: &PgPool,
    url: &str,
    workers: usize,
    batch: i64,
    lease: Duration,
    duration: Option<Duration>,
    postmaster: Option<u32>,
) -> anyhow::Result<BenchRow> {
    let (go, wait) = tokio::sync::watch::channel(None);
    let mut claimers = Vec::new();
    for i in 0..workers {
        let (url, wait) = (url.to_string(), wait.clone());
        let (ready, readied) = tokio::sync::oneshot::channel();
        let (result, finished) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("bench-{i}"))
            .spawn(move || {
                let id = format!("bench-{i}");
                let _ = result.send(claimer(&url, id, batch, lease, duration, ready, wait));
            })
            .context("starting a claimer thread")?;
        claimers.push((readied, finished));
    }
    // A claimer that could not get ready says why in its result. Returning drops `go`, which
    // tells every claimer still waiting to give up.
    for (readied, finished) in &mut claimers {
        if readied.await.is_err() {
            let run = finished.await.context("a claimer thread died")?;
            return Err(run
                .err()
                .unwrap_or_else(|| anyhow::anyhow!("a claimer stopped before it was ready")));
        }
    }
    let before = usage::Snapshot::take(pool, postmaster).await;
    let start = Instant::now();
    let _ = go.send(Some(start));
    let mut runs = Vec::new();
    for (_, finished) in claimers {
        runs.push(finished.await.context("a claimer thread died")??);
    }
    let seconds = start.elapsed().as_secs_f64();
    let after = usage::Snapshot::take(pool, postmaster).await;
    // Coordinated omission: a closed-loop worker stuck in one slow claim issues no others, so
    // the stall would count once. Each worker's histogram is corrected with its own mean cycle
    // time as the interval it intended to keep, back-filling the claims it would have started.
    let mut raw = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut corrected = raw.clone();
    let mut ids = Vec::new();
    let mut claims = 0;
    for r in runs {
        raw.add(&r.hist)?;
        if let Some(interval) = (r.elapsed.as_micros() as u64).checked_div(r.claims) {
            corrected.add(r.hist.clone_correct(interval.max(1)))?;
        }
        claims += r.claims;
        ids.extend(r.ids);
    }
    let claimed = ids.len() as u64;
    ids.sort_unstable();
    ids.dedup();
    let client_doubles = claimed - ids.len() as u64;
    let (_, db_doubles) = audit(pool).await?;
    let (unclaimed,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM deliveries WHERE state IN ('pending', 'retryable')")
            .fetch_one(pool)
            .await?;
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Ok(BenchRow {
        workers,
        batch,
        seeded: 0,
        claimed,
        claims,
        seconds,
        stack: claimed as f64 / seconds,
        efficiency: None,
        latency_ms: LatencyMs {
            p50: ms(&corrected, 0.5),
            p99: ms(&corrected, 0.99),
            p999: ms(&corrected, 0.999),
            max: corrected.max() as f64 / 1000.0,
            raw_p99: ms(&raw, 0.99),
        },
        double_claims: client_doubles.max(db_doubles),
        unclaimed: unclaimed as u64,
        pgbench: None,
        pgbench_double_claims: None,
        stack_profile: after.since(&before, usage::Client::Own, claimed),
        pgbench_profile: None,
        round_ratios: Vec::new(),
    })
}

#[cfg(test)]
#[path = "bench_tests.rs"]
mod tests;
