//! The harness half of `ting-chaos bench claim`: flags → a [`ClaimPlan`], a database (the given
//! server or a throwaway cluster sized for the worker count), `pgbench` found or reported missing,
//! the machine described, then the measurement closure `main.rs` supplies (the stack's
//! `claim_bench`), then the table, `bench.json` and `chart.svg`.
//!
//! This module must never import the stack: what the stack measured comes back as a table, JSON
//! rows and chart series.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use super::output::{self, Series};
use super::{measuring_time, parse_list, usage, ClaimArgs};
use crate::exit;

/// What to measure, resolved from the flags.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ClaimPlan {
    #[serde(skip)]
    pub database_url: String,
    pub workers: Vec<usize>,
    pub batches: Vec<i64>,
    /// Rows per measurement (seeded; drained unless `duration` is set).
    pub rows: u64,
    #[serde(with = "secs_opt")]
    pub duration: Option<Duration>,
    /// `None`: not installed or not wanted; the stack side only.
    pub pgbench: Option<PathBuf>,
    /// Rounds per measurement (stack and pgbench alternating which goes first).
    pub rounds: u32,
}

mod secs_opt {
    pub fn serialize<S: serde::Serializer>(
        d: &Option<std::time::Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_f64(d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

/// What the measurement returns.
pub struct ClaimOutcome {
    /// The printed table (ending with the verification line).
    pub table: String,
    /// One JSON object per (workers, batch) measurement.
    pub rows: serde_json::Value,
    pub series: Vec<Series>,
    /// False when a row was claimed twice (or a drained queue left rows behind).
    pub verified: bool,
}

/// `ting-chaos bench claim`: exit 0, 1 when the verification failed, 2 usage, 3 infrastructure.
pub async fn claim<F, Fut>(mut args: ClaimArgs, measure: F) -> i32
where
    F: FnOnce(ClaimPlan) -> Fut,
    Fut: Future<Output = anyhow::Result<ClaimOutcome>>,
{
    args.database_url = match crate::cli::database_url_flag(args.database_url.take()) {
        Ok(url) => url,
        Err(e) => return usage(&e),
    };
    let workers = match parse_list::<usize>("--workers", &args.workers) {
        Ok(w) if w.iter().all(|n| *n <= 256) => w,
        Ok(_) => return usage("--workers: at most 256"),
        Err(e) => return usage(&e),
    };
    let batches = match parse_list::<i64>("--batch", &args.batches) {
        Ok(b) => b,
        Err(e) => return usage(&e),
    };
    let duration = match args.duration.as_deref().map(measuring_time).transpose() {
        Ok(d) => d,
        Err(e) => return usage(&format!("--duration: {e}")),
    };
    if args.rows == Some(0) {
        return usage("--rows: at least 1 (a claim benchmark over no rows measures nothing)");
    }
    let rows = args
        .rows
        .unwrap_or(if duration.is_some() { 300_000 } else { 20_000 });
    let pgbench = if args.no_pgbench {
        None
    } else {
        find_pgbench()
    };
    if pgbench.is_none() && !args.no_pgbench {
        eprintln!("pgbench not found (PATH, /usr/lib/postgresql/*/bin, /usr/pgsql-*/bin): measuring the stack side only");
    }
    let max_workers = workers.iter().copied().max().unwrap_or(1) as u32;
    let pg_opts = throwaway_pg::ClusterOptions {
        max_connections: 2 * max_workers + 20,
        ..Default::default()
    };
    let db = match throwaway_pg::Database::provision(args.database_url.as_deref(), pg_opts, false)
        .await
    {
        Ok(db) => db,
        Err(e) => {
            eprintln!("error: database: {e}");
            return exit::INFRA;
        }
    };
    let kind = if db.cluster().is_some() {
        "throwaway"
    } else {
        "server"
    };
    let machine = super::describe_machine(Some(db.url()), kind).await;
    eprintln!("{machine}");
    let plan = ClaimPlan {
        database_url: db.url().to_string(),
        workers,
        batches,
        rows,
        duration,
        pgbench,
        rounds: args.rounds,
    };
    let result = measure(plan.clone()).await;
    if let Err(e) = db.close().await {
        eprintln!("warning: database cleanup: {e}");
    }
    let out = match result {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e:#}");
            return exit::INFRA;
        }
    };
    print!("{}", out.table);
    let json = serde_json::json!({
        "benchmark": "claim",
        "tool_version": env!("CARGO_PKG_VERSION"),
        "finished_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "machine": machine,
        "plan": plan,
        "verified": out.verified,
        "rows": out.rows,
    });
    match output::write(
        &args.report_dir,
        "claim",
        &json,
        "claim + complete, rows/s",
        "rows/s",
        &out.series,
    ) {
        Ok(dir) => println!("results: {}", dir.display()),
        Err(e) => eprintln!("warning: could not write results: {e:#}"),
    }
    if out.verified {
        exit::OK
    } else {
        exit::VIOLATION
    }
}

/// `pgbench` on `PATH`, else next to the PostgreSQL server binaries, newest version first.
pub fn find_pgbench() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let beside_server = throwaway_pg::find_binaries().ok().map(|b| b.dir);
    let mut dirs: Vec<PathBuf> = on_path.into_iter().chain(beside_server).collect();
    dirs.extend(throwaway_pg::default_candidates(
        None,
        std::path::Path::new("/"),
    ));
    dirs.into_iter()
        .map(|d| d.join("pgbench"))
        .find(|p| p.is_file())
}
