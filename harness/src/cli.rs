//! The harness's subcommands, one function each, called by `main.rs` after flag parsing.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::check::Status;
use crate::exit;
use crate::run::{self, RunOptions};
use crate::scenario;

/// Resolves on Ctrl-C (SIGINT) or SIGTERM. The handlers are installed by this call, not when
/// the future is first polled: a signal that arrives in between is neither lost nor fatal (a
/// caller may print its address, or spawn children, before it starts waiting).
pub fn interrupted() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    }
}

/// Which flag or variable puts the run's database on a server, if one does: `--database-url`
/// (which clap also fills from `DATABASE_URL`: named as the variable when it came from there).
fn database_server(flag: Option<&str>) -> Option<&'static str> {
    let env = std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty());
    match flag.filter(|u| !u.is_empty()) {
        Some(f) if env.as_deref() != Some(f) => Some("--database-url"),
        Some(_) => Some("DATABASE_URL"),
        None => env.map(|_| "DATABASE_URL"),
    }
}

/// `--database-url` (or `DATABASE_URL`, which clap reads into it; empty is none) checked by the
/// very rule provisioning applies, so a URL that cannot work is the flag's mistake (exit 2),
/// named, with its password never printed — not an infrastructure failure after the fact.
pub fn database_url_flag(url: Option<String>) -> Result<Option<String>, String> {
    let Some(url) = url.filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    let flag = database_server(Some(&url)).unwrap_or("--database-url");
    throwaway_pg::url_with_database(&url, "ting_probe").map_err(|e| format!("{flag}: {e}"))?;
    Ok(Some(url))
}

/// `ting-chaos run`.
/// `overrides` (`--workers`, `--stack`, `--set`) replace the file's values before validation, so
/// the chaos targets are checked against the worker count the run will really have.
pub async fn run(
    path: &Path,
    overrides: &scenario::Overrides,
    opts: RunOptions,
    json: bool,
) -> i32 {
    if let Some(w) = overrides.workers {
        if !(1..=64).contains(&w) {
            eprintln!("error: --workers must be between 1 and 64 (got {w})");
            return exit::USAGE;
        }
    }
    let mut opts = opts;
    opts.database_url = match database_url_flag(opts.database_url.take()) {
        Ok(url) => url,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let mut overrides = overrides.clone();
    overrides.database_server = database_server(opts.database_url.as_deref());
    let s = match scenario::load_with(path, &overrides) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    if let Err(e) = usable_report_root(&opts.report_root) {
        eprintln!("error: {e}");
        return exit::USAGE;
    }
    let outcome = run::run(s, opts, interrupted()).await;
    // The verdict table goes to stdout (progress goes to stderr); `--json` prints only the report.
    match &outcome.report {
        Some(r) if json => println!("{}", serde_json::to_string_pretty(r).unwrap_or_default()),
        Some(r) => {
            print!("{}", crate::report::summary_text(r));
            println!(
                "  report: {}",
                outcome.report_dir.join("report.json").display()
            );
        }
        None => {}
    }
    outcome.exit_code
}

/// `--report-dir DIR` exists as a folder (created if need be) before anything starts: a path
/// that cannot hold run folders is the flag's mistake (exit 2), found before a database and a
/// stack are started for nothing.
fn usable_report_root(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir)
        .and_then(|()| tempfile::tempdir_in(dir))
        .and_then(|probe| probe.close())
        .map_err(|e| {
            format!(
                "--report-dir {}: cannot create run folders there: {e}",
                dir.display()
            )
        })
}

/// `ting-chaos mocks` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct MocksArgs {
    /// A scenario file (its [providers] tables and seed) or a providers-only TOML file
    /// ([line], [smtp], [sms] and [ports] tables).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The seed faults derive from (default: the scenario's, else 0).
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Address to bind; anything but loopback must be asked for explicitly.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// Fixed port of the LINE fake (default: [ports] line in the config file, else any free port).
    #[arg(long)]
    pub line_port: Option<u16>,
    /// Fixed port of the SMS (Twilio) fake.
    #[arg(long)]
    pub sms_port: Option<u16>,
    /// Fixed port of the SMTP fake.
    #[arg(long)]
    pub smtp_port: Option<u16>,
    /// Fixed port of the SMTP fake's control API (/_mock/*).
    #[arg(long, visible_alias = "control-port")]
    pub smtp_control_port: Option<u16>,
}

/// `ting-chaos mocks`: serve the fake providers until Ctrl-C or SIGTERM.
pub async fn mocks(args: MocksArgs) -> i32 {
    let (file_seed, cfg, file_ports) = match args.config.as_deref() {
        None => (
            0,
            mock_providers::config::ProvidersConfig::default(),
            mock_providers::Ports::default(),
        ),
        Some(p) => match load_providers(p) {
            Ok(loaded) => loaded,
            Err(e) => {
                eprintln!("error: {e}");
                return exit::USAGE;
            }
        },
    };
    let seed = args.seed.unwrap_or(file_seed);
    let ports = mock_providers::Ports {
        line: args.line_port.unwrap_or(file_ports.line),
        sms: args.sms_port.unwrap_or(file_ports.sms),
        smtp: args.smtp_port.unwrap_or(file_ports.smtp),
        smtp_control: args.smtp_control_port.unwrap_or(file_ports.smtp_control),
    };
    if let Err(e) = distinct_ports(&ports) {
        eprintln!("error: {e}");
        return exit::USAGE;
    }
    // Armed before the addresses are printed: whoever reads them may signal at once.
    let stop = interrupted();
    let ledger = mock_providers::ledger::Ledger::new();
    let credentials = credentials_banner(&cfg);
    let providers =
        match mock_providers::start_with_ports(seed, cfg, args.bind, ports, ledger).await {
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
    print!("{credentials}");
    println!("seed {seed}; Ctrl-C to stop");
    stop.await;
    providers.shutdown().await;
    exit::OK
}

/// What a client must present to each fake (set them in `--config`: `[line] channel_token`,
/// `[sms] account_sid` / `auth_token`, `[smtp] events_secret`), printed with the addresses so a
/// user pointing an app at the fakes is not left guessing at a 401.
fn credentials_banner(cfg: &mock_providers::config::ProvidersConfig) -> String {
    format!(
        "LINE  Authorization: Bearer {}\n\
         SMS   account SID {}, auth token {} (HTTP Basic; callbacks signed with the auth token)\n\
         SMTP  no auth; delivery events signed with HMAC-SHA256 secret {}\n",
        cfg.line.channel_token, cfg.sms.account_sid, cfg.sms.auth_token, cfg.smtp.events_secret
    )
}

/// Two fakes cannot listen on one port: say which settings clash (port 0 means "any free port").
fn distinct_ports(p: &mock_providers::Ports) -> Result<(), String> {
    let named = [
        ("LINE (--line-port / [ports] line)", p.line),
        ("SMS (--sms-port / [ports] sms)", p.sms),
        ("SMTP (--smtp-port / [ports] smtp)", p.smtp),
        (
            "SMTP control (--smtp-control-port / [ports] smtp_control)",
            p.smtp_control,
        ),
    ];
    for (i, (a, pa)) in named.iter().enumerate() {
        if let Some((b, _)) = named[i + 1..].iter().find(|(_, pb)| *pa != 0 && pb == pa) {
            return Err(format!(
                "the {a} and {b} fakes are both given port {pa}: each needs its own"
            ));
        }
    }
    Ok(())
}

/// A providers-only `ting-chaos mocks --config` file: the three profiles and fixed ports.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct MocksFile {
    #[serde(default)]
    line: mock_providers::config::LineConfig,
    #[serde(default)]
    smtp: mock_providers::config::SmtpConfig,
    #[serde(default)]
    sms: mock_providers::config::SmsConfig,
    #[serde(default)]
    ports: mock_providers::Ports,
}

/// A scenario file (seed + `[providers]`; ports only from flags) or a file holding only
/// `[line]`/`[smtp]`/`[sms]`/`[ports]` tables (seed 0).
fn load_providers(
    path: &Path,
) -> Result<
    (
        u64,
        mock_providers::config::ProvidersConfig,
        mock_providers::Ports,
    ),
    String,
> {
    let bytes = crate::files::read_bounded(path, crate::files::CONFIG_LIMIT)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        scenario::not_utf8(&path.display().to_string(), e.as_bytes(), e.utf8_error()).to_string()
    })?;
    // A scenario has a `load` table, however it is written (`[load]` or dotted `load.…` keys).
    let is_scenario = toml::from_str::<toml::Table>(&text).is_ok_and(|t| t.contains_key("load"));
    if is_scenario {
        let s = scenario::parse(path, &text).map_err(|e| e.to_string())?;
        return Ok((s.seed, s.providers, mock_providers::Ports::default()));
    }
    let file = path.display().to_string();
    let f: MocksFile = toml::from_str(&text)
        .map_err(|e| scenario::error::from_toml(&file, &text, &e).to_string())?;
    let cfg = mock_providers::config::ProvidersConfig {
        line: f.line,
        smtp: f.smtp,
        sms: f.sms,
    };
    scenario::check_providers(path, &text, &cfg).map_err(|e| e.to_string())?;
    Ok((0, cfg, f.ports))
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
    // Listen before the URL is out: whoever reads it may stop us at once.
    let stop = interrupted();
    println!("{}", cluster.admin_url());
    eprintln!(
        "throwaway PostgreSQL ready in {:?} (data in {}); Ctrl-C to stop",
        cluster.ready_in(),
        cluster.data_dir().display()
    );
    stop.await;
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
    let report = crate::report::read_report(path).map_err(|e| format!("--baseline: {e}"))?;
    Ok(Some((report, tol)))
}

/// `ting-chaos report DIR`: re-render HTML, JUnit and Markdown from `DIR/report.json`; append
/// the summary to `$GITHUB_STEP_SUMMARY` only with `step_summary` (the run appended it already).
pub fn report(dir: &Path, step_summary: bool) -> i32 {
    match crate::report::rerender(dir, step_summary) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            exit::OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                crate::report::RerenderError::Input(_) => exit::USAGE,
                crate::report::RerenderError::Output(_) => exit::INFRA,
            }
        }
    }
}

/// The most runs one sweep makes, as a count or a list.
const MAX_SEEDS: usize = 1000;

/// Parses `--seeds`: a count K (1..=K) or a comma-separated list (a seed listed again runs
/// again: how a flaky seed is re-checked).
pub fn parse_seeds(s: &str) -> Result<Vec<u64>, String> {
    let s = s.trim();
    if s.contains(',') {
        let seeds = s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("bad seed `{x}` in --seeds"))
            })
            .collect::<Result<Vec<u64>, String>>()?;
        if seeds.len() > MAX_SEEDS {
            return Err(format!(
                "--seeds lists {} seeds; at most {MAX_SEEDS}",
                seeds.len()
            ));
        }
        return Ok(seeds);
    }
    match s.parse::<u64>() {
        Ok(k) if (1..=1000).contains(&k) => Ok((1..=k).collect()),
        _ => Err(format!(
            "--seeds takes a count 1..=1000 or a list like \"3,7,11\" (got `{s}`)"
        )),
    }
}

/// `ting-chaos sweep`: the scenario over several seeds; exit 0 only when every seed passed, else
/// the worst seed's code ([`exit::worst`]): an inconclusive seed is not a pass.
pub async fn sweep(
    path: &Path,
    overrides: &scenario::Overrides,
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
    let database_url = match database_url_flag(database_url) {
        Ok(url) => url,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let mut overrides = overrides.clone();
    overrides.database_server = database_server(database_url.as_deref());
    let s = match scenario::load_with(path, &overrides) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    if let Err(e) = usable_report_root(&report_root) {
        eprintln!("error: {e}");
        return exit::USAGE;
    }
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
                r.checks
                    .iter()
                    .filter(|v| matches!(v.status, Status::Violated | Status::Insufficient))
                    .map(|v| format!("{} {}", v.checker, v.status.as_str()))
                    .chain(
                        r.gates
                            .iter()
                            .filter(|g| g.insufficient)
                            .map(|g| format!("{} no data", g.name)),
                    )
                    .chain(r.regressions.iter().cloned())
                    .collect()
            })
            .unwrap_or_default();
        let verdict = match outcome.exit_code {
            exit::OK => "pass",
            exit::VIOLATION => "FAIL",
            exit::INCONCLUSIVE => "INCONCLUSIVE",
            _ => "ERROR",
        };
        println!(
            "seed {seed:>6}  {verdict:<12} {:>6.1}s  {}  {}",
            t.elapsed().as_secs_f64(),
            violated.join(", "),
            outcome.report_dir.display()
        );
        if outcome.exit_code == exit::OK {
            passed += 1;
        } else {
            failed += 1;
            worst = exit::worst(worst, outcome.exit_code);
        }
    }
    println!("{}: {passed} passed, {failed} not passed", s.name);
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scenario is read as one (its seed and `[providers]`) whether its `load` table is written
    /// as `[load]` or with dotted keys; a file of provider tables alone is a providers file.
    #[test]
    fn seeds_table() {
        let many = (1..=1001)
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(",");
        #[rustfmt::skip]
        let cases: &[(&str, Result<Vec<u64>, &str>)] = &[
            ("3", Ok(vec![1, 2, 3])),
            ("3,7,11", Ok(vec![3, 7, 11])),
            (" 5 , 9 ", Ok(vec![5, 9])),
            ("0", Err("--seeds takes a count 1..=1000")),
            ("1001", Err("--seeds takes a count 1..=1000")),
            ("1,,2", Err("bad seed `` in --seeds")),
            ("1,-2", Err("bad seed `-2` in --seeds")),
            ("7,3,7", Ok(vec![7, 3, 7])),
            (&many, Err("--seeds lists 1001 seeds; at most 1000")),
        ];
        for (input, want) in cases {
            match (parse_seeds(input), want) {
                (Ok(got), Ok(want)) => assert_eq!(&got, want, "{input}"),
                (Err(got), Err(want)) => assert!(got.starts_with(want), "{input}: {got}"),
                (got, _) => panic!("{input}: {got:?}"),
            }
        }
    }

    #[test]
    fn mocks_config_is_a_scenario_when_it_has_a_load_table() {
        let dir = tempfile::tempdir().unwrap();
        let providers = "[providers.line]\nlatency = { kind = \"fixed\", value = \"5ms\" }\n";
        for load in [
            "[load]\nrecipients = 5\nchannels = [\"line\"]\n",
            "load.recipients = 5\nload.channels = [\"line\"]\n",
        ] {
            let path = dir.path().join("s.toml");
            std::fs::write(&path, format!("name = \"s\"\nseed = 9\n{load}{providers}")).unwrap();
            let (seed, cfg, _) = load_providers(&path).unwrap();
            assert_eq!(seed, 9, "{load}");
            assert_eq!(cfg.line.latency, five_ms(), "{load}");
        }
        let path = dir.path().join("p.toml");
        std::fs::write(
            &path,
            "[line]\nlatency = { kind = \"fixed\", value = \"5ms\" }\n",
        )
        .unwrap();
        let (seed, cfg, _) = load_providers(&path).unwrap();
        assert_eq!(seed, 0);
        assert_eq!(cfg.line.latency, five_ms());
    }

    fn five_ms() -> mock_providers::config::Latency {
        mock_providers::config::Latency::Fixed {
            value: mock_providers::units::HumanDuration::from_millis(5),
        }
    }
}
