//! The harness's subcommands, one function each, called by `main.rs` after flag parsing.

use std::net::IpAddr;
use std::path::Path;

use crate::exit;
use crate::run::{self, RunOptions};
use crate::scenario;

/// Resolves on Ctrl-C or SIGTERM.
pub async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// `ting-chaos run`.
pub async fn run(path: &Path, opts: RunOptions, json: bool) -> i32 {
    let s = match scenario::load(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    if let Some(w) = opts.workers {
        if !(1..=64).contains(&w) {
            eprintln!("error: --workers must be between 1 and 64 (got {w})");
            return exit::USAGE;
        }
    }
    let outcome = run::run(s, opts, interrupted()).await;
    match &outcome.report {
        Some(r) if json => println!("{}", serde_json::to_string_pretty(r).unwrap_or_default()),
        Some(r) => {
            eprint!("{}", crate::report::summary_text(r));
            eprintln!(
                "  report: {}",
                outcome.report_dir.join("report.json").display()
            );
        }
        None => {}
    }
    outcome.exit_code
}

/// `ting-chaos mocks`: serve the fake providers until Ctrl-C.
pub async fn mocks(config: Option<&Path>, seed: u64, bind: IpAddr) -> i32 {
    let (seed, cfg) = match config {
        None => (seed, mock_providers::config::ProvidersConfig::default()),
        Some(p) => match load_providers(p) {
            Ok((s, c)) => (if seed != 0 { seed } else { s }, c),
            Err(e) => {
                eprintln!("error: {e}");
                return exit::USAGE;
            }
        },
    };
    let ledger = mock_providers::ledger::Ledger::new();
    let providers = match mock_providers::start(seed, cfg, bind, ledger).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e:#}");
            return exit::INFRA;
        }
    };
    println!(
        "LINE  http://{}  (push: POST /v2/bot/message/push; control: /_mock/*)",
        providers.line_addr
    );
    println!("SMS   http://{}  (Twilio: POST /2010-04-01/Accounts/{{sid}}/Messages.json; control: /_mock/*)", providers.sms_addr);
    println!(
        "SMTP  smtp://{}  (control: http://{}/_mock/*)",
        providers.smtp_addr, providers.smtp_control_addr
    );
    println!("seed {seed}; Ctrl-C to stop");
    interrupted().await;
    providers.shutdown().await;
    exit::OK
}

/// A scenario file (seed + `[providers]`), or a file holding only `[line]`/`[smtp]`/`[sms]` tables.
fn load_providers(path: &Path) -> Result<(u64, mock_providers::config::ProvidersConfig), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if text.lines().any(|l| l.trim_start().starts_with("[load]")) {
        let s = scenario::parse(path, &text).map_err(|e| e.to_string())?;
        return Ok((s.seed, s.providers));
    }
    let file = path.display().to_string();
    toml::from_str(&text)
        .map(|c| (0, c))
        .map_err(|e| scenario::error::from_toml(&file, &text, &e).to_string())
}

/// `ting-chaos db up`: a throwaway cluster until Ctrl-C.
pub async fn db_up() -> i32 {
    let cluster = match throwaway_pg::Cluster::start(Default::default()).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::INFRA;
        }
    };
    println!("{}", cluster.admin_url());
    eprintln!(
        "throwaway PostgreSQL ready in {:?} (data in {}); Ctrl-C to stop",
        cluster.ready_in(),
        cluster.data_dir().display()
    );
    interrupted().await;
    if let Err(e) = cluster.stop().await {
        eprintln!("warning: {e}");
    }
    exit::OK
}

/// Reads `--baseline FILE` and `--tolerance` into what the run compares against.
pub fn load_baseline(
    path: Option<&Path>,
    tolerance: &str,
) -> Result<Option<(crate::report::Report, f64)>, String> {
    let Some(path) = path else { return Ok(None) };
    let tol =
        crate::report::gate::parse_tolerance(tolerance).map_err(|e| format!("--tolerance: {e}"))?;
    let data = std::fs::read(path).map_err(|e| format!("--baseline {}: {e}", path.display()))?;
    let report = serde_json::from_slice(&data)
        .map_err(|e| format!("--baseline {}: not a report.json: {e}", path.display()))?;
    Ok(Some((report, tol)))
}

/// `ting-chaos report DIR`: re-render HTML, JUnit and Markdown from `DIR/report.json`.
pub fn report(dir: &Path) -> i32 {
    match crate::report::rerender(dir) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            exit::OK
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            exit::USAGE
        }
    }
}

/// Parses `--seeds`: a count K (1..=K) or a comma-separated list.
pub fn parse_seeds(s: &str) -> Result<Vec<u64>, String> {
    let s = s.trim();
    if s.contains(',') {
        return s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("bad seed `{x}` in --seeds"))
            })
            .collect();
    }
    match s.parse::<u64>() {
        Ok(k) if (1..=1000).contains(&k) => Ok((1..=k).collect()),
        _ => Err(format!(
            "--seeds takes a count 1..=1000 or a list like \"3,7,11\" (got `{s}`)"
        )),
    }
}

/// `ting-chaos sweep`: the scenario over several seeds; exit 1 when any seed fails.
pub async fn sweep(
    path: &Path,
    seeds: &str,
    database_url: Option<String>,
    report_root: std::path::PathBuf,
    self_exe: std::path::PathBuf,
) -> i32 {
    let seeds = match parse_seeds(seeds) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let s = match scenario::load(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let (mut passed, mut failed) = (0, 0);
    let mut worst = exit::OK;
    for seed in &seeds {
        let opts = RunOptions {
            seed: Some(*seed),
            database_url: database_url.clone(),
            report_root: report_root.clone(),
            self_exe: self_exe.clone(),
            ..Default::default()
        };
        let t = std::time::Instant::now();
        let outcome = tokio::select! {
            o = run::run(s.clone(), opts, std::future::pending::<()>()) => o,
            _ = interrupted() => { eprintln!("interrupted"); return 130; }
        };
        let violated: Vec<String> = outcome
            .report
            .as_ref()
            .map(|r| {
                r.violated()
                    .map(|v| v.checker.clone())
                    .chain(r.regressions.iter().cloned())
                    .collect()
            })
            .unwrap_or_default();
        let verdict = match outcome.exit_code {
            exit::OK => "pass",
            exit::VIOLATION => "FAIL",
            _ => "ERROR",
        };
        println!(
            "seed {seed:>6}  {verdict:<5} {:>6.1}s  {}  {}",
            t.elapsed().as_secs_f64(),
            violated.join(", "),
            outcome.report_dir.display()
        );
        if outcome.exit_code == exit::OK {
            passed += 1;
        } else {
            failed += 1;
            worst = worst.max(outcome.exit_code);
        }
    }
    println!("{}: {passed} passed, {failed} failed", s.name);
    worst
}
