//! `ting-chaos bench claim|e2e|mocks|dblink`: commands that print figures, each beside what it is
//! compared against in the same run, and write `reports/bench/<name>-<stamp>/{bench.json,chart.svg}`.
//!
//! - `claim`: the reference stack's claim path against `pgbench` on the identical SQL. This
//!   library must not import the stack, so [`claim`] provisions the database, finds pgbench and
//!   writes the results, while the measurement itself is a closure `main.rs` passes in (it calls
//!   `stack::bench`).
//! - `e2e`: deliveries/s through a whole stack (any stack: it goes through [`crate::run::run`]
//!   and the stack contract) at several worker counts, provider latencies and channel sets.
//! - `mocks`: the fake providers' capacity beside a plain hyper/tokio ceiling.
//! - `dblink`: the round trip through a database-link proxy beside a direct connection.
//!
//! Nothing here is a test and nothing here asserts a figure; exit 1 means a correctness check
//! under load failed (a row claimed twice, a run that violated an invariant), never "too slow".

mod claim;
mod dblink;
mod e2e;
mod machine;
pub mod output;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

pub use claim::{claim, find_pgbench, ClaimOutcome, ClaimPlan};
pub use dblink::{dblink, DblinkArgs};
pub use e2e::e2e;
pub use machine::{describe as describe_machine, Machine, PgInfo};

/// What `ting-chaos bench` measures.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Claims/s of the reference stack's claim path beside pgbench with the identical SQL.
    Claim(ClaimArgs),
    /// Deliveries/s through a whole stack and the fake providers.
    E2e(E2eArgs),
    /// Requests/s the fake providers sustain beside a plain hyper/tokio ceiling.
    Mocks(MocksArgs),
    /// Round-trip time through a database-link proxy beside a direct connection.
    Dblink(DblinkArgs),
}

#[derive(Args, Debug)]
pub struct ClaimArgs {
    /// Worker counts (one connection each), comma-separated.
    #[arg(long, default_value = "1,2,4,8,16,32")]
    pub workers: String,
    /// Claim sizes (rows per claim statement), comma-separated.
    #[arg(long = "batch", default_value = "1,10,100")]
    pub batches: String,
    /// Rows per measurement (rounded down to a multiple of workers × batch); drained completely,
    /// or with --duration the queue's size (default 20000, or 300000 with --duration).
    #[arg(long)]
    pub rows: Option<u64>,
    /// Claim for this long per measurement instead (e.g. "5s"), from a queue of --rows rows.
    #[arg(long)]
    pub duration: Option<String>,
    /// PostgreSQL server to create the benchmark's database on (default: a throwaway cluster).
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Measure the stack side only, even when pgbench is installed.
    #[arg(long)]
    pub no_pgbench: bool,
    /// Rounds per measurement, alternating which side goes first; the round with the median
    /// stack/pgbench ratio is reported and every round's ratio is listed (a shared machine's
    /// noise shows as their spread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub rounds: u32,
    /// Where the result directory is created.
    #[arg(long, default_value = "reports/bench")]
    pub report_dir: PathBuf,
}

#[derive(Args, Debug)]
pub struct E2eArgs {
    /// Worker process counts, comma-separated.
    #[arg(long, default_value = "1,2,4,8,16")]
    pub workers: String,
    /// Recipients per run (one delivery per recipient and channel), comma-separated: several
    /// sizes give the cost curve (wall time, harness CPU per 1,000 deliveries, peak memory of
    /// every process) as a campaign grows. Runs above 10,000 recipients are enqueued in batches
    /// of at most 10,000 (a `--scenario` paced by rate keeps its own batches).
    #[arg(long, default_value = "1000")]
    pub recipients: String,
    /// Fixed provider latencies to measure at, comma-separated.
    #[arg(long, default_value = "0ms,50ms")]
    pub latency: String,
    /// Channel sets, comma-separated: `line` (one channel) and/or `all` (LINE, e-mail and SMS).
    #[arg(long, default_value = "line,all")]
    pub channels: String,
    /// A scenario whose stack (built-in or `[stack.external]`), providers and settings are used;
    /// workers, recipients, channels and latency are overridden and chaos is removed.
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// PostgreSQL server to create each run's database on (default: one throwaway cluster).
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Where the result directory is created.
    #[arg(long, default_value = "reports/bench")]
    pub report_dir: PathBuf,
}

#[derive(Args, Debug)]
pub struct MocksArgs {
    /// Measurement time per target (and as long again for its ceiling).
    #[arg(long, default_value = "3s")]
    pub duration: String,
}

/// `ting-chaos bench mocks`.
pub async fn mocks(args: MocksArgs) -> i32 {
    let d = match measuring_time(&args.duration) {
        Ok(d) => d,
        Err(e) => return usage(&format!("--duration: {e}")),
    };
    match mock_providers::bench::capacity(d).await {
        Ok(report) => {
            print!("{report}");
            crate::exit::OK
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            crate::exit::INFRA
        }
    }
}

pub(crate) fn usage(msg: &str) -> i32 {
    eprintln!("error: {msg}");
    crate::exit::USAGE
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("`{s}`: {e}"))
}

/// The longest a benchmark's `--duration` may measure.
const MAX_MEASURING: Duration = Duration::from_secs(24 * 3600);

/// A `--duration` to measure for: above zero (nothing measured in no time is no figure: it
/// printed `NaN`) and at most a day.
pub(crate) fn measuring_time(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(format!(
            "`{s}`: a benchmark needs time to measure, e.g. \"3s\""
        )),
        d if d > MAX_MEASURING => Err(format!("`{s}`: at most 24h")),
        d => Ok(d),
    }
}

/// A comma-separated list of positive numbers, e.g. "1,2,4".
pub(crate) fn parse_list<T: std::str::FromStr + PartialOrd + Default>(
    flag: &str,
    s: &str,
) -> Result<Vec<T>, String> {
    let out: Vec<T> = s
        .split(',')
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse::<T>()
                .ok()
                .filter(|n| *n > T::default())
                .ok_or_else(|| format!("{flag}: `{v}` is not a positive number"))
        })
        .collect::<Result<_, _>>()?;
    if out.is_empty() {
        return Err(format!("{flag}: empty list"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measuring_times() {
        for (input, ok) in [
            ("3s", true),
            ("24h", true),
            ("0s", false),
            ("25h", false),
            ("x", false),
        ] {
            assert_eq!(measuring_time(input).is_ok(), ok, "{input}");
        }
    }

    #[test]
    fn lists() {
        let cases: &[(&str, Option<Vec<usize>>)] = &[
            ("1,2,4", Some(vec![1, 2, 4])),
            (" 8 ", Some(vec![8])),
            ("1,,2", Some(vec![1, 2])),
            ("0,1", None),
            ("x", None),
            ("", None),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_list::<usize>("--workers", input).ok(),
                *want,
                "{input:?}"
            );
        }
    }
}
