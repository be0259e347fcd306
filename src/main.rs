//! The one `ting-chaos` binary: parses flags and dispatches thinly into the crates.
//!
//! `run`, `validate`, `schema`, `mocks`, `db` belong to the harness library; `stack
//! api|worker|migrate` are the reference stack's process roles, linked here so one installed binary
//! serves both. This file is the only place the harness and the stack meet, and it passes nothing
//! between them: the harness spawns `ting-chaos stack …` as a child through the stack contract.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ting_chaos_harness::{exit, scenario};

#[derive(Parser)]
#[command(
    name = "ting-chaos",
    version,
    about = "Load and chaos tests for notification delivery stacks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a scenario against a stack and check it; exit 0 pass, 1 violation, 2 usage,
    /// 3 infrastructure, 4 inconclusive (nothing violated, but a checker judged too little, a
    /// gate had no data or a chaos step did not take effect: never a pass).
    Run {
        scenario: PathBuf,
        /// Override the scenario's seed.
        #[arg(long, allow_negative_numbers = true)]
        seed: Option<u64>,
        /// Override the number of workers.
        #[arg(long)]
        workers: Option<u32>,
        /// A file holding `[stack.external]` that replaces the scenario's stack (paths relative to it).
        #[arg(long, value_name = "FILE")]
        stack: Option<PathBuf>,
        /// Override one scenario key before validation, e.g. `--set load.recipients=200` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// PostgreSQL server to create the run's database on (default: a throwaway cluster).
        #[arg(long, env = "DATABASE_URL")]
        database_url: Option<String>,
        /// Where report directories are created.
        #[arg(long, default_value = "reports")]
        report_dir: PathBuf,
        /// Keep the database after the run.
        #[arg(long)]
        keep: bool,
        /// Print the report JSON on stdout instead of the summary.
        #[arg(long)]
        json: bool,
        /// A previous run's report.json: fail when throughput or latency regress beyond --tolerance.
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// Allowed regression against --baseline, e.g. "15%".
        #[arg(long, default_value = "10%", requires = "baseline")]
        tolerance: String,
    },
    /// Run a scenario over several seeds and print pass/fail/inconclusive per seed (a false-alarm
    /// sweep); exits with the worst seed's code (3, then 1, then 4), 0 only when every seed passed.
    Sweep {
        scenario: PathBuf,
        /// Seeds to run: a count K (seeds 1..=K) or a list "3,7,11".
        #[arg(long, default_value = "10")]
        seeds: String,
        /// A file holding `[stack.external]` that replaces the scenario's stack (paths relative to it).
        #[arg(long, value_name = "FILE")]
        stack: Option<PathBuf>,
        /// Override one scenario key before validation, e.g. `--set load.recipients=200` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        #[arg(long, env = "DATABASE_URL")]
        database_url: Option<String>,
        #[arg(long, default_value = "reports")]
        report_dir: PathBuf,
    },
    /// Re-render report.html, junit.xml and summary.md from a saved report directory.
    Report {
        dir: PathBuf,
        /// Also append summary.md to $GITHUB_STEP_SUMMARY (`run` already does; off by default so
        /// a re-render in the same job does not list the run twice).
        #[arg(long)]
        step_summary: bool,
    },
    /// Check scenario files; exit 0 when all are valid, 2 otherwise.
    Validate {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// A file holding `[stack.external]` that replaces the scenario's stack (paths relative to it).
        #[arg(long, value_name = "FILE")]
        stack: Option<PathBuf>,
        /// Override one scenario key before validation, e.g. `--set load.recipients=200` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Print the JSON Schema of scenario files.
    Schema,
    /// Serve the fake providers standalone until Ctrl-C or SIGTERM.
    Mocks(ting_chaos_harness::cli::MocksArgs),
    /// The reference stack's process roles (started by `run`; configured by TING_* env vars).
    Stack {
        #[command(subcommand)]
        role: StackRole,
        /// Switch on a classic mistake (repeatable); adds to TING_STACK_FLAWS.
        #[arg(long = "flaw", global = true)]
        flaws: Vec<String>,
    },
    /// Throwaway PostgreSQL.
    Db {
        #[command(subcommand)]
        command: DbCommand,
    },
    /// Benchmarks that print figures beside a same-run ceiling: claim, e2e, mocks, dblink.
    Bench {
        #[command(subcommand)]
        what: ting_chaos_harness::bench::BenchCommand,
    },
}

#[derive(Subcommand)]
enum StackRole {
    /// Create or upgrade the schema in TING_DATABASE_URL, then exit.
    Migrate,
    /// Serve the HTTP API on TING_API_ADDR until SIGTERM.
    Api,
    /// Claim and send deliveries until SIGTERM, then drain.
    Worker,
}

#[derive(Subcommand)]
enum DbCommand {
    /// Start a throwaway cluster, print its URL, and keep it until Ctrl-C.
    Up,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Stack { role, flaws } = cli.command {
        return ExitCode::from(stack_role(role, flaws) as u8);
    }
    init_tracing();
    let code = match cli.command {
        Command::Validate { files, stack, set } => validate(
            &files,
            &scenario::Overrides {
                stack,
                set,
                ..Default::default()
            },
        ),
        Command::Schema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&scenario::json_schema()).expect("schema")
            );
            exit::OK
        }
        Command::Run {
            scenario,
            seed,
            workers,
            stack,
            set,
            database_url,
            report_dir,
            keep,
            json,
            baseline,
            tolerance,
        } => {
            let baseline =
                match ting_chaos_harness::cli::load_baseline(baseline.as_deref(), &tolerance) {
                    Ok(b) => b,
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::from(exit::USAGE as u8);
                    }
                };
            let opts = ting_chaos_harness::run::RunOptions {
                baseline,
                seed,
                workers,
                database_url,
                report_root: report_dir,
                keep,
                self_exe: std::env::current_exe().unwrap_or_else(|_| "ting-chaos".into()),
                progress: !json,
            };
            let overrides = scenario::Overrides {
                workers,
                stack,
                set,
                ..Default::default()
            };
            runtime().block_on(ting_chaos_harness::cli::run(
                &scenario, &overrides, opts, json,
            ))
        }
        Command::Mocks(args) => runtime().block_on(ting_chaos_harness::cli::mocks(args)),
        Command::Db {
            command: DbCommand::Up,
        } => runtime().block_on(ting_chaos_harness::cli::db_up()),
        Command::Report { dir, step_summary } => {
            ting_chaos_harness::cli::report(&dir, step_summary)
        }
        Command::Sweep {
            scenario,
            seeds,
            stack,
            set,
            database_url,
            report_dir,
        } => {
            let self_exe = std::env::current_exe().unwrap_or_else(|_| "ting-chaos".into());
            let overrides = scenario::Overrides {
                stack,
                set,
                ..Default::default()
            };
            runtime().block_on(ting_chaos_harness::cli::sweep(
                &scenario,
                &overrides,
                &seeds,
                database_url,
                report_dir,
                self_exe,
            ))
        }
        Command::Bench { what } => runtime().block_on(async move {
            use ting_chaos_harness::bench::{self, BenchCommand};
            match what {
                BenchCommand::Claim(args) => bench::claim(args, bench_claim_stack).await,
                BenchCommand::E2e(args) => {
                    let me = std::env::current_exe().unwrap_or_else(|_| "ting-chaos".into());
                    bench::e2e(args, &me).await
                }
                BenchCommand::Mocks(args) => bench::mocks(args).await,
                BenchCommand::Dblink(args) => bench::dblink(args).await,
            }
        }),
        Command::Stack { .. } => unreachable!("dispatched above"),
    };
    ExitCode::from(code as u8)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn init_tracing() {
    // sqlx warns about every statement over a second ("slow statement"); on a loaded machine that
    // is a wall of noise between a benchmark's rows and says nothing a user can act on.
    let filter = tracing_subscriber::EnvFilter::try_from_env("TING_LOG")
        .unwrap_or_else(|_| "warn,sqlx::query=error".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn validate(files: &[PathBuf], overrides: &scenario::Overrides) -> i32 {
    let mut code = exit::OK;
    for f in files {
        match scenario::load_with(f, overrides) {
            Ok(s) => println!("ok: {} ({})", f.display(), s.name),
            Err(e) => {
                eprintln!("error: {e}");
                code = exit::USAGE;
            }
        }
    }
    code
}

/// `ting-chaos stack …`: one process role of the reference stack, configured only by the contract's
/// environment, exactly as an external stack would be.
fn stack_role(role: StackRole, flaws: Vec<String>) -> i32 {
    if !flaws.is_empty() {
        let mut all: Vec<String> = std::env::var("TING_STACK_FLAWS")
            .ok()
            .filter(|v| !v.is_empty())
            .map(|v| v.split(',').map(String::from).collect())
            .unwrap_or_default();
        all.extend(flaws);
        // Edition 2021, single-threaded at this point: no other thread reads the environment.
        std::env::set_var("TING_STACK_FLAWS", all.join(","));
    }
    stack::init_logging();
    let cfg = match stack::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let rt = runtime();
    let result = rt.block_on(async move {
        match role {
            StackRole::Migrate => stack::migrate(&cfg.database_url).await,
            StackRole::Api => {
                let listener = tokio::net::TcpListener::bind(&cfg.api_addr)
                    .await
                    .map_err(|e| anyhow::anyhow!("bind {}: {e}", cfg.api_addr))?;
                tracing::info!(addr = %listener.local_addr()?, "api listening");
                stack::api::run(cfg, listener, stack::sigterm()).await
            }
            StackRole::Worker => stack::worker::run(cfg, stack::sigterm()).await,
        }
    });
    match result {
        Ok(()) => exit::OK,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            1
        }
    }
}

/// `ting-chaos bench claim`'s measurement: the reference stack's own claim benchmark
/// (`stack::bench`) on the database the harness provisioned, handed back as plain figures.
async fn bench_claim_stack(
    plan: ting_chaos_harness::bench::ClaimPlan,
) -> anyhow::Result<ting_chaos_harness::bench::ClaimOutcome> {
    use stack::bench::{Amount, BenchOptions};
    stack::migrate(&plan.database_url).await?;
    let opts = BenchOptions {
        workers: plan.workers,
        batches: plan.batches,
        amount: match plan.duration {
            Some(duration) => Amount::Duration {
                duration,
                rows: plan.rows,
            },
            None => Amount::Rows(plan.rows),
        },
        pgbench: plan.pgbench,
        rounds: plan.rounds.max(1) as usize,
        ..Default::default()
    };
    let rows = stack::bench::claim_bench(&plan.database_url, &opts, |r| {
        eprintln!(
            "  workers {:>3} batch {:>4}: {:>8.0} rows/s, pgbench {}",
            r.workers,
            r.batch,
            r.stack,
            r.pgbench.map_or("-".into(), |p| format!("{p:.0} rows/s"))
        )
    })
    .await?;
    let verified = rows.iter().all(|r| {
        r.double_claims == 0
            && r.pgbench_double_claims.unwrap_or(0) == 0
            && (plan.duration.is_some() || r.unclaimed == 0)
    });
    Ok(ting_chaos_harness::bench::ClaimOutcome {
        table: stack::bench::render(&rows),
        rows: serde_json::to_value(&rows)?,
        series: stack::bench::chart_series(&rows)
            .into_iter()
            .map(|(name, points)| ting_chaos_harness::bench::output::Series {
                reference: name.starts_with("pgbench"),
                name,
                points,
            })
            .collect(),
        verified,
    })
}
