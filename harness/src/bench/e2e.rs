//! `ting-chaos bench e2e`: deliveries/s through a whole stack — API, worker processes, the fake
//! providers — at several worker counts, one channel and all three, at zero provider latency (the
//! stack's own cost) and at a fixed latency such as 50 ms (where concurrency, not CPU, bounds it).
//!
//! Each configuration is one ordinary [`crate::run::run`] of a scenario built here (or read from
//! `--scenario`, so an external stack is measured through the same contract), with its chaos
//! removed; the figure is the run's own `metrics.deliveries_per_s`, and a run whose invariants did
//! not hold is reported as such rather than as a throughput. This module must never reach into a
//! stack other than through `run`.

use std::path::Path;
use std::time::Duration;

use mock_providers::config::Latency;
use mock_providers::units::HumanDuration;
use serde::Serialize;

use super::output::{self, Series};
use super::{parse_duration, parse_list, usage, E2eArgs};
use crate::check::Role;
use crate::exit;
use crate::run::{self, RunOptions};
use crate::scenario::{self, Channel, Pacing, Scenario};

/// The scenario measured when no `--scenario` is given: the built-in stack, no faults.
const BASE: &str = r#"
name = "bench-e2e"
description = "Throughput benchmark: no faults, no chaos."
seed = 1

[stack]
workers = 1
lease = "10s"
heartbeat = "2s"
claim_batch = 20
shutdown_grace = "5s"

[load]
recipients = 100
channels = ["line"]

[expect]
quiescence = "300s"
"#;

/// One measured configuration.
#[derive(Clone, Debug, Serialize)]
pub struct E2eRow {
    pub channels: String,
    pub latency_ms: u64,
    pub workers: u32,
    pub recipients: u32,
    pub deliveries: u64,
    pub deliveries_per_s: f64,
    pub e2e_p50_ms: f64,
    pub e2e_p99_ms: f64,
    pub run_seconds: f64,
    /// Wall seconds the harness spent judging the frozen record and writing its files
    /// (`phases` judge + write): the part of a run that grows with the campaign, not the stack.
    pub judge_seconds: Option<f64>,
    /// The harness process's CPU seconds per 1,000 deliveries: what judging a campaign costs.
    pub harness_cpu_s_per_1k: Option<f64>,
    /// Peak resident memory of the harness during this run, of the API, and of the largest
    /// worker process, in MiB.
    pub harness_peak_rss_mib: Option<u64>,
    pub api_peak_rss_mib: Option<u64>,
    pub worker_peak_rss_mib: Option<u64>,
    pub verdict: String,
    pub exit_code: i32,
}

impl E2eRow {
    /// The figures a finished run's report gives for this configuration.
    fn of(
        report: &crate::report::Report,
        (channels, n_channels): (&str, usize),
        latency: Duration,
        (workers, recipients): (u32, u32),
    ) -> E2eRow {
        let deliveries = u64::from(recipients) * n_channels as u64;
        let mib = |kib: u64| kib.div_ceil(1024);
        let peak = |role: Role| {
            let of_role = report.processes.iter().filter(|p| p.role == role);
            of_role.filter_map(|p| p.peak_rss_kib).max().map(mib)
        };
        let harness = report.harness.as_ref();
        E2eRow {
            channels: channels.to_string(),
            latency_ms: latency.as_millis() as u64,
            workers,
            recipients,
            deliveries,
            // A bench row always ran a load; a figure without data shows as 0.
            deliveries_per_s: report.metrics.deliveries_per_s.unwrap_or_default(),
            e2e_p50_ms: report.metrics.e2e_p50_ms.unwrap_or_default(),
            e2e_p99_ms: report.metrics.e2e_p99_ms.unwrap_or_default(),
            run_seconds: report.duration_ms as f64 / 1000.0,
            judge_seconds: report.phases.as_ref().map(|p| p.judge_s + p.write_s),
            harness_cpu_s_per_1k: harness
                .filter(|_| deliveries > 0)
                .map(|h| h.cpu_s * 1000.0 / deliveries as f64),
            harness_peak_rss_mib: harness.and_then(|h| h.peak_rss_kib).map(mib),
            api_peak_rss_mib: peak(Role::Api),
            worker_peak_rss_mib: peak(Role::Worker),
            verdict: report.verdict.clone(),
            exit_code: report.exit_code,
        }
    }

    /// The row as the table prints it, under [`HEADER`].
    fn line(&self) -> String {
        let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        format!(
            "{:<8} {:>6}ms {:>7} {:>10} {:>10} {:>13.0} {:>9.1} {:>9.1} {:>8.1} {:>8} {:>9} {:>7} {:>6} {:>7}  {}",
            self.channels,
            self.latency_ms,
            self.workers,
            self.recipients,
            self.deliveries,
            self.deliveries_per_s,
            self.e2e_p50_ms,
            self.e2e_p99_ms,
            self.run_seconds,
            self.judge_seconds
                .map_or("-".to_string(), |v| format!("{v:.1}")),
            self.harness_cpu_s_per_1k
                .map_or("-".to_string(), |v| format!("{v:.3}")),
            opt(self.harness_peak_rss_mib),
            opt(self.api_peak_rss_mib),
            opt(self.worker_peak_rss_mib),
            self.verdict,
        )
    }
}

/// The table's header: per row the configuration, throughput and latency, wall time, the
/// harness's judging and writing time, its CPU seconds per 1,000 deliveries and each process's
/// peak RSS in MiB.
const HEADER: [&str; 15] = [
    "channels",
    "latency",
    "workers",
    "recipients",
    "deliveries",
    "deliveries/s",
    "p50 ms",
    "p99 ms",
    "run s",
    "judge s",
    "h.cpu/1k",
    "h.MiB",
    "api",
    "worker",
    "verdict",
];

/// `ting-chaos bench e2e`: exit 0, 1 when a run violated an invariant, 2 usage, 3 infrastructure.
pub async fn e2e(mut args: E2eArgs, self_exe: &Path) -> i32 {
    args.database_url = match crate::cli::database_url_flag(args.database_url.take()) {
        Ok(url) => url,
        Err(e) => return usage(&e),
    };
    let workers = match parse_list::<u32>("--workers", &args.workers) {
        Ok(w) if w.iter().all(|n| *n <= 64) => w,
        Ok(_) => return usage("--workers: at most 64"),
        Err(e) => return usage(&e),
    };
    let mut latencies = Vec::new();
    for l in args.latency.split(',').filter(|l| !l.trim().is_empty()) {
        match parse_duration(l) {
            Ok(d) => latencies.push(d),
            Err(e) => return usage(&format!("--latency: {e}")),
        }
    }
    let mut sets: Vec<(&str, Vec<Channel>)> = Vec::new();
    for c in args.channels.split(',').map(str::trim) {
        match c {
            "line" => sets.push(("line", vec![Channel::Line])),
            "all" => sets.push(("all", vec![Channel::Line, Channel::Email, Channel::Sms])),
            other => return usage(&format!("--channels: `{other}` is not `line` or `all`")),
        }
    }
    let sizes = match parse_list::<u32>("--recipients", &args.recipients) {
        Ok(r) if r.contains(&0) => return usage("--recipients: each size must be at least 1"),
        Ok(r) => r,
        Err(e) => return usage(&e),
    };
    if sizes.is_empty() || latencies.is_empty() {
        return usage("--recipients and --latency must not be empty");
    }
    // The runs are built from a validated scenario by hand: the scenario's own bounds again.
    if sizes.iter().any(|n| *n > 1_000_000) {
        return usage("--recipients: each size at most 1000000");
    }
    if latencies
        .iter()
        .any(|l| *l > mock_providers::validate::MAX_WAIT)
    {
        return usage("--latency: at most 24h, the longest a fake may wait");
    }
    let base = match &args.scenario {
        Some(p) => scenario::load(p),
        None => scenario::parse(Path::new("bench-e2e.toml"), BASE),
    };
    let base = match base {
        Ok(s) => s,
        Err(e) => return usage(&e.to_string()),
    };
    // One server for every run (each run still gets a fresh database on it).
    let cluster = match &args.database_url {
        Some(_) => None,
        None => {
            let opts = throwaway_pg::ClusterOptions {
                max_connections: crate::run::provision::max_connections(
                    workers.iter().max().copied().unwrap_or(1),
                ),
                ..Default::default()
            };
            match throwaway_pg::Cluster::start(opts).await {
                Ok(c) => Some(c),
                Err(e) => {
                    eprintln!("error: database: {e}");
                    return exit::INFRA;
                }
            }
        }
    };
    let server = args
        .database_url
        .clone()
        .or_else(|| cluster.as_ref().map(|c| c.admin_url()));
    let kind = if cluster.is_some() {
        "throwaway"
    } else {
        "server"
    };
    let machine = super::describe_machine(server.as_deref(), kind).await;
    eprintln!("{machine}");
    let runs_dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: temporary directory: {e}");
            return exit::INFRA;
        }
    };
    let mut rows = Vec::new();
    let mut code = exit::OK;
    let h = HEADER;
    println!(
        "{:<8} {:>8} {:>7} {:>10} {:>10} {:>13} {:>9} {:>9} {:>8} {:>8} {:>9} {:>7} {:>6} {:>7}  {}",
        h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12], h[13],
        h[14]
    );
    let mut configs = Vec::new();
    for set in &sets {
        for &latency in &latencies {
            for &recipients in &sizes {
                configs.extend(workers.iter().map(|&w| (set, latency, recipients, w)));
            }
        }
    }
    for ((set, channels), latency, recipients, w) in configs {
        let s = configure(&base, w, recipients, channels, latency);
        let opts = RunOptions {
            workers: Some(w),
            database_url: server.clone(),
            report_root: runs_dir.path().to_path_buf(),
            self_exe: self_exe.to_path_buf(),
            ..Default::default()
        };
        let outcome = run::run(s, opts, crate::cli::interrupted()).await;
        if outcome.exit_code == 130 {
            code = 130;
            break;
        }
        let Some(r) = outcome.report else {
            code = exit::INFRA;
            break;
        };
        let row = E2eRow::of(&r, (set, channels.len()), latency, (w, recipients));
        let error = r.error.as_deref().map(|e| format!(": {e}"));
        println!("{}{}", row.line(), error.unwrap_or_default());
        if r.exit_code != exit::OK && code == exit::OK {
            code = match r.exit_code {
                exit::VIOLATION | exit::INCONCLUSIVE => r.exit_code,
                _ => exit::INFRA,
            };
        }
        rows.push(row);
    }
    if let Some(c) = cluster {
        if let Err(e) = c.stop().await {
            eprintln!("warning: database cleanup: {e}");
        }
    }
    let json = serde_json::json!({
        "benchmark": "e2e",
        "tool_version": env!("CARGO_PKG_VERSION"),
        "finished_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "machine": machine,
        "stack": if base.stack.external.is_some() { "external" } else { "built-in" },
        "scenario": args.scenario.as_ref().map(|p| p.display().to_string()),
        "recipients": sizes,
        "rows": rows,
    });
    match output::write(
        &args.report_dir,
        "e2e",
        &json,
        "deliveries/s through the whole stack",
        "deliveries/s",
        &series(&rows),
    ) {
        Ok(dir) => println!("results: {}", dir.display()),
        Err(e) => eprintln!("warning: could not write results: {e:#}"),
    }
    code
}

/// Recipients one batch carries at most: a campaign's batch (campaign-100k's size, and the
/// reference stack's limit), so a large run is enqueued as a real client would.
pub const BATCH_RECIPIENTS: u32 = 10_000;

/// `base` with the benchmark's overrides: workers, load, channels, a fixed latency on every
/// provider, and no chaos.
fn configure(
    base: &Scenario,
    workers: u32,
    recipients: u32,
    channels: &[Channel],
    latency: Duration,
) -> Scenario {
    let mut s = base.clone();
    s.name = format!(
        "bench-e2e-{}ch-{}ms-w{workers}",
        channels.len(),
        latency.as_millis()
    );
    s.stack.workers = workers;
    s.load.recipients = recipients;
    if let Pacing::Batches(n) = &mut s.load.pacing {
        *n = (*n).max(recipients.div_ceil(BATCH_RECIPIENTS));
    }
    s.load.channels = channels.to_vec();
    s.chaos.clear();
    let fixed = Latency::Fixed {
        value: HumanDuration(latency),
    };
    s.providers.line.latency = fixed.clone();
    s.providers.smtp.latency = fixed.clone();
    s.providers.sms.latency = fixed;
    s
}

/// One series per (channels, latency, recipients), deliveries/s against workers; failed runs are
/// left out.
fn series(rows: &[E2eRow]) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for r in rows.iter().filter(|r| r.exit_code == exit::OK) {
        let name = format!(
            "{} channel(s), {} ms, {} recipients",
            r.channels, r.latency_ms, r.recipients
        );
        match out.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push((f64::from(r.workers), r.deliveries_per_s)),
            None => out.push(Series {
                name,
                points: vec![(f64::from(r.workers), r.deliveries_per_s)],
                reference: false,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_scenario_is_valid_and_overrides_apply() {
        let base = scenario::parse(Path::new("bench-e2e.toml"), BASE).expect("valid");
        let s = configure(
            &base,
            4,
            50,
            &[Channel::Line, Channel::Sms],
            Duration::from_millis(50),
        );
        assert_eq!(s.stack.workers, 4);
        assert_eq!(s.load.recipients, 50);
        assert_eq!(s.load.pacing.batch_count(), 1);
        assert_eq!(s.load.channels.len(), 2);
        assert!(s.chaos.is_empty());
        assert_eq!(
            s.providers.sms.latency,
            Latency::Fixed {
                value: HumanDuration::from_millis(50)
            }
        );
    }

    #[test]
    fn a_large_run_is_enqueued_in_campaign_sized_batches() {
        let base = scenario::parse(Path::new("bench-e2e.toml"), BASE).expect("valid");
        let batches = |recipients| {
            configure(&base, 4, recipients, &[Channel::Line], Duration::ZERO)
                .load
                .pacing
                .batch_count()
        };
        assert_eq!(batches(10_000), 1);
        assert_eq!(batches(10_001), 2);
        assert_eq!(batches(100_000), 10);
    }
}
