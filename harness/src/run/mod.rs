//! `ting-chaos run`: one experiment from start to verdict, as phases, one file each:
//! [`provision`] (the database, the fake providers in-process), [`start`] (the workload, and the
//! stack through the contract: migrate, API, N workers), [`drive`] (the load while the chaos
//! schedule runs), [`quiesce`] (the wait for quiescence), [`judge`] (stop the stack, run every
//! checker) and [`output`] (the report and its files). Teardown runs on every path; the caller
//! interrupts [`run`] by resolving `interrupt` (Ctrl-C, SIGTERM).

mod chaos;
mod db_links;
mod drive;
mod env;
mod journal;
mod judge;
mod not_accepted;
mod output;
mod progress;
pub(crate) mod provision;
mod quiesce;
mod settle;
mod start;
mod status;
mod status_file;
mod watch;
mod world;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use mock_providers::ledger::Ledger;

use crate::exit;
use crate::report::{self, Report};
use crate::scenario::Scenario;
use crate::supervise::Supervisor;

pub use env::CONTRACT_VARS;
pub use world::WorkerCommand;

/// Flags of `ting-chaos run` that override the scenario.
#[derive(Debug, Default)]
pub struct RunOptions {
    pub seed: Option<u64>,
    pub workers: Option<u32>,
    pub database_url: Option<String>,
    pub report_root: PathBuf,
    pub keep: bool,
    /// The `ting-chaos` executable, for the built-in stack's processes.
    pub self_exe: PathBuf,
    /// Print progress lines (stderr).
    pub progress: bool,
    /// A previous run's report and the tolerance (share) for throughput/latency regressions.
    pub baseline: Option<(Report, f64)>,
}

/// How a run ended.
pub struct Outcome {
    pub exit_code: i32,
    pub report_dir: PathBuf,
    pub report: Option<Report>,
}

/// An error that makes the run an infrastructure failure (exit 3), not a verdict.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InfraError(pub String);

fn infra(msg: impl Into<String>) -> anyhow::Error {
    InfraError(msg.into()).into()
}

/// Runs `scenario` and returns its outcome; resolving `interrupt` stops it early (exit 130).
pub async fn run(
    mut scenario: Scenario,
    opts: RunOptions,
    interrupt: impl Future<Output = ()>,
) -> Outcome {
    if let Some(seed) = opts.seed {
        scenario.seed = seed;
    }
    if let Some(w) = opts.workers {
        scenario.stack.workers = w;
    }
    let report_dir = match fresh_report_dir(&opts.report_root, &scenario.name) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("error: {e:#}");
            return Outcome {
                exit_code: exit::INFRA,
                report_dir: opts.report_root.clone(),
                report: None,
            };
        }
    };
    let started = Instant::now();
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut res = Resources::default();
    let body = execute(
        &scenario,
        &opts,
        &report_dir,
        &mut res,
        (started, &started_at),
    );
    let result = tokio::select! {
        r = body => Some(r),
        _ = interrupt => None,
    };
    // Teardown on every path: stack processes first, then providers, then the database.
    res.teardown(&scenario).await;
    let (exit_code, mut report) = match result {
        None => {
            eprintln!(
                "interrupted: stack stopped, database cleaned up; logs in {}",
                report_dir.display()
            );
            (130, None)
        }
        Some(Ok(r)) => (r.exit_code, Some(r)),
        Some(Err(e)) => {
            // Anything that stops a run before its verdict is the infrastructure's failure.
            let code = exit::INFRA;
            let mut r = res.partial_report(&scenario, &format!("{e:#}"));
            r.exit_code = code;
            r.duration_ms = started.elapsed().as_millis() as u64;
            r.started_at = started_at;
            (code, Some(r))
        }
    };
    if let Some(r) = &mut report {
        // The usage was read before the report's files were rendered: its peak covers them.
        if let Some(h) = &mut r.harness {
            h.refresh_peak();
        }
        if std::fs::create_dir_all(&report_dir).is_ok() {
            if let Err(e) = report::write_json_atomic(&report_dir.join("report.json"), r) {
                eprintln!("error: could not write report: {e:#}");
            }
        }
    }
    Outcome {
        exit_code,
        report_dir,
        report,
    }
}

/// Creates the run's folder, `<root>/<scenario>-<UTC timestamp>`, never one that exists: two
/// runs of a scenario started in the same second (a sweep's seed that failed fast, two CI jobs
/// sharing a report folder) get `…-2`, `…-3`, so neither overwrites the other's files.
pub fn fresh_report_dir(root: &Path, scenario: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(root).with_context(|| format!("create {}", root.display()))?;
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    let base = format!("{scenario}-{stamp}");
    for n in 1..=1000 {
        let dir = match n {
            1 => root.join(&base),
            n => root.join(format!("{base}-{n}")),
        };
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("create {}", dir.display())),
        }
    }
    anyhow::bail!(
        "create a run folder in {}: {base} and 999 numbered ones exist already",
        root.display()
    )
}

/// What must be torn down, filled in as the run starts things.
#[derive(Default)]
struct Resources {
    supervisor: Option<Supervisor>,
    providers: Option<mock_providers::Providers>,
    database: Option<Arc<tokio::sync::Mutex<Option<throwaway_pg::Database>>>>,
    chaos: Option<Arc<chaos::Chaos>>,
    world: Option<Arc<world::World>>,
    keep: bool,
}

impl Resources {
    async fn teardown(&mut self, scenario: &Scenario) {
        if let Some(c) = self.chaos.take() {
            c.stop();
        }
        if let Some(s) = self.supervisor.take() {
            s.shutdown_all(scenario.stack.shutdown_grace.max(Duration::from_secs(1)))
                .await;
        }
        if let Some(p) = self.providers.take() {
            p.shutdown().await;
        }
        if let Some(db) = self.database.take() {
            // Chaos tasks may still hold the handle; taking the value out closes it regardless.
            let db = db.lock().await.take();
            if let Some(db) = db {
                let url = db.url().to_string();
                if let Err(e) = db.close().await {
                    eprintln!("warning: database cleanup: {e}");
                } else if self.keep {
                    eprintln!("kept database {url}");
                }
            }
        }
    }

    /// The report of a run that stopped before its verdict: what it had recorded so far.
    fn partial_report(&self, s: &Scenario, error: &str) -> Report {
        let kind = if s.database.url.is_some() {
            "server"
        } else {
            "throwaway"
        };
        let mut r = output::skeleton(s, kind);
        r.error = Some(error.into());
        if let Some(w) = &self.world {
            r.ledger_summary = w.journal.since(0, |all| {
                output::ledger_summary(all.iter().map(|e| (e.provider, e.kind, e.outcome)))
            });
            r.timeline = w.timeline();
            r.processes = w.supervisor.records();
        }
        if let Some(c) = &self.chaos {
            r.chaos_steps = c.results();
        }
        r
    }
}

/// The run's phases in order; every resource a phase starts is in `res` for teardown.
async fn execute(
    scenario: &Scenario,
    opts: &RunOptions,
    report_dir: &Path,
    res: &mut Resources,
    started: (Instant, &str),
) -> anyhow::Result<Report> {
    std::fs::create_dir_all(report_dir)
        .with_context(|| format!("create {}", report_dir.display()))?;
    let cpu_mark = crate::cpu::mark();
    // Freed memory goes back to the system every few seconds for the whole run.
    let _trimmer = crate::malloc::Trimmer::start();
    let mut progress = progress::Progress::new(opts.progress);
    // The ledger's clock is the run's clock: every timeline event and progress line uses it.
    let ledger = Ledger::new();
    let t0 = Instant::now();
    let mut clock = report::phases::PhaseClock::start();
    let probe = {
        let ledger = ledger.clone();
        crate::stalls::StallProbe::start(move || ledger.now_ns())
    };
    let say = |progress: &progress::Progress, msg: String| {
        progress.say(&format!("[{:>5.1}s] {msg}", t0.elapsed().as_secs_f64()))
    };

    let db = provision::database(scenario, opts, res).await?;
    say(&progress, format!("database ready ({})", db.kind()));
    let fakes = provision::providers(scenario, &db.url, &ledger, res).await?;
    clock.lap(|p| &mut p.provision_s);

    let mut work = start::Workload::of(scenario);
    let stack = start::stack(
        scenario,
        opts,
        report_dir,
        (&ledger, &progress),
        &db,
        &fakes,
        &work,
        res,
    )
    .await?;
    clock.lap(|p| &mut p.start_s);
    say(
        &progress,
        format!(
            "stack up: api pid {}, {} workers",
            stack.api_pid, scenario.stack.workers
        ),
    );

    let driven = drive::load_and_chaos(scenario, &ledger, &stack, &mut work).await?;
    clock.lap(|p| &mut p.enqueue_s);
    let settled = quiesce::wait(
        (scenario, report_dir),
        (&fakes, res),
        &stack,
        &mut work,
        driven,
        &mut progress,
        t0,
    )
    .await?;
    clock.lap(|p| &mut p.settle_s);
    progress.finish();
    *stack.world.printer.lock().unwrap() = None;
    stack.chaos.stop();

    let judged =
        judge::stop_and_judge(scenario, probe, &stack, &work, &settled, res, &mut clock).await?;
    output::report(
        (scenario, opts, report_dir),
        (&ledger, &db),
        &stack,
        &work,
        settled,
        judged,
        (started, cpu_mark),
        clock,
    )
    .await
}
