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
use crate::exit;
use crate::run::{self, RunOptions};
use crate::scenario::{self, Channel, Scenario};

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
    pub deliveries: u64,
    pub deliveries_per_s: f64,
    pub e2e_p50_ms: f64,
    pub e2e_p99_ms: f64,
    pub run_seconds: f64,
    pub verdict: String,
    pub exit_code: i32,
}

/// `ting-chaos bench e2e`: exit 0, 1 when a run violated an invariant, 2 usage, 3 infrastructure.
pub async fn e2e(args: E2eArgs, self_exe: &Path) -> i32 {
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
    if args.recipients == 0 || latencies.is_empty() {
        return usage("--recipients and --latency must not be empty");
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
                max_connections: 60 + workers.iter().max().copied().unwrap_or(1) * 16,
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
    println!(
        "{:<8} {:>8} {:>7} {:>10} {:>13} {:>9} {:>9} {:>8}  verdict",
        "channels", "latency", "workers", "deliveries", "deliveries/s", "p50 ms", "p99 ms", "run s"
    );
    'outer: for (set, channels) in &sets {
        for &latency in &latencies {
            for &w in &workers {
                let s = configure(&base, w, args.recipients, channels, latency);
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
                    break 'outer;
                }
                let Some(r) = outcome.report else {
                    code = exit::INFRA;
                    break 'outer;
                };
                let row = E2eRow {
                    channels: set.to_string(),
                    latency_ms: latency.as_millis() as u64,
                    workers: w,
                    deliveries: u64::from(args.recipients) * channels.len() as u64,
                    // A bench row always ran a load; a figure without data shows as 0.
                    deliveries_per_s: r.metrics.deliveries_per_s.unwrap_or_default(),
                    e2e_p50_ms: r.metrics.e2e_p50_ms.unwrap_or_default(),
                    e2e_p99_ms: r.metrics.e2e_p99_ms.unwrap_or_default(),
                    run_seconds: r.duration_ms as f64 / 1000.0,
                    verdict: r.verdict.clone(),
                    exit_code: r.exit_code,
                };
                println!(
                    "{:<8} {:>6}ms {:>7} {:>10} {:>13.0} {:>9.1} {:>9.1} {:>8.1}  {}{}",
                    row.channels,
                    row.latency_ms,
                    row.workers,
                    row.deliveries,
                    row.deliveries_per_s,
                    row.e2e_p50_ms,
                    row.e2e_p99_ms,
                    row.run_seconds,
                    row.verdict,
                    r.error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                );
                if r.exit_code != exit::OK && code == exit::OK {
                    code = match r.exit_code {
                        exit::VIOLATION | exit::INCONCLUSIVE => r.exit_code,
                        _ => exit::INFRA,
                    };
                }
                rows.push(row);
            }
        }
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
        "recipients": args.recipients,
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

/// One series per (channels, latency), deliveries/s against workers; failed runs are left out.
fn series(rows: &[E2eRow]) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for r in rows.iter().filter(|r| r.exit_code == exit::OK) {
        let name = format!("{} channel(s), {} ms", r.channels, r.latency_ms);
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
        assert_eq!(s.load.channels.len(), 2);
        assert!(s.chaos.is_empty());
        assert_eq!(
            s.providers.sms.latency,
            Latency::Fixed {
                value: HumanDuration::from_millis(50)
            }
        );
    }
}
