//! `ting-chaos bench dblink`: what the database-link proxy (`crate::netchaos`) adds to a round
//! trip, beside a direct connection to the same server in the same run. One connection each way,
//! `SELECT 1` round trips in alternating rounds (direct, proxied, direct, …) so a shared
//! machine's noise falls on both sides alike; p50, p99 and mean per side, and the added p50/p99.
//!
//! It measures the proxy with no fault on it: the fast path every run with a link step pays.

use std::time::Instant;

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::json;
use sqlx::{Connection, PgConnection};

use crate::netchaos::{LinkOwner, Links};

#[derive(Args, Debug)]
pub struct DblinkArgs {
    /// Round trips per side, in all.
    #[arg(long, default_value_t = 20_000)]
    pub round_trips: u32,
    /// Rounds the round trips are split into, alternating which side goes first.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rounds: u32,
    /// PostgreSQL server to measure against (default: a throwaway cluster).
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Where the result directory is created.
    #[arg(long, default_value = "reports/bench")]
    pub report_dir: std::path::PathBuf,
}

/// `ting-chaos bench dblink`.
pub async fn dblink(mut args: DblinkArgs) -> i32 {
    args.database_url = match crate::cli::database_url_flag(args.database_url.take()) {
        Ok(url) => url,
        Err(e) => return super::usage(&e),
    };
    if args.round_trips < args.rounds {
        return super::usage("--round-trips must be at least --rounds");
    }
    match measure(&args).await {
        Ok(()) => crate::exit::OK,
        Err(e) => {
            eprintln!("error: {e:#}");
            crate::exit::INFRA
        }
    }
}

struct Side {
    conn: PgConnection,
    hist: Histogram<u64>,
}

async fn measure(args: &DblinkArgs) -> anyhow::Result<()> {
    let db = throwaway_pg::Database::provision(
        args.database_url.as_deref(),
        throwaway_pg::ClusterOptions::default(),
        false,
    )
    .await
    .context("database")?;
    let kind = if db.cluster().is_some() {
        "throwaway"
    } else {
        "server"
    };
    let machine = super::describe_machine(Some(db.url()), kind).await;
    let links = Links::new(db.url(), 1)?;
    let proxied_url = links.url_for(LinkOwner::Worker(1)).await?;
    let mut sides = [
        Side {
            conn: PgConnection::connect(db.url()).await?,
            hist: Histogram::new(3)?,
        },
        Side {
            conn: PgConnection::connect(&proxied_url).await?,
            hist: Histogram::new(3)?,
        },
    ];
    // Warm both: prepared statement cached, buffers allocated.
    for s in &mut sides {
        for _ in 0..200 {
            sqlx::query("SELECT 1").execute(&mut s.conn).await?;
        }
    }
    let per_round = args.round_trips / args.rounds;
    for round in 0..args.rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let s = &mut sides[i];
            for _ in 0..per_round {
                let t = Instant::now();
                sqlx::query("SELECT 1").execute(&mut s.conn).await?;
                s.hist.record(t.elapsed().as_nanos() as u64)?;
            }
        }
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    let fig = |h: &Histogram<u64>| {
        (
            us(h.value_at_quantile(0.5)),
            us(h.value_at_quantile(0.99)),
            h.mean() / 1000.0,
        )
    };
    let (d, p) = (fig(&sides[0].hist), fig(&sides[1].hist));
    let load = machine.load_1m.map_or("?".into(), |l| format!("{l:.2}"));
    let mut out = format!(
        "database link proxy: {} SELECT 1 round trips per side in {} alternating rounds, one connection each, {} cores, load {load}\n",
        per_round * args.rounds,
        args.rounds,
        machine.cores
    );
    out.push_str("side          p50       p99      mean\n");
    for (name, (p50, p99, mean)) in [("direct", d), ("proxy", p)] {
        out.push_str(&format!(
            "{name:<8} {p50:>7.1}us {p99:>7.1}us {mean:>7.1}us\n"
        ));
    }
    out.push_str(&format!(
        "added    {:>7.1}us {:>7.1}us {:>7.1}us\n",
        p.0 - d.0,
        p.1 - d.1,
        p.2 - d.2
    ));
    print!("{out}");
    let report = json!({
        "machine": machine,
        "plan": { "round_trips_per_side": per_round * args.rounds, "rounds": args.rounds, "query": "SELECT 1" },
        "direct_us": { "p50": d.0, "p99": d.1, "mean": d.2 },
        "proxy_us": { "p50": p.0, "p99": p.1, "mean": p.2 },
        "added_us": { "p50": p.0 - d.0, "p99": p.1 - d.1, "mean": p.2 - d.2 },
    });
    let dir = super::output::write(&args.report_dir, "dblink", &report, "", "", &[])?;
    std::fs::write(dir.join("output.txt"), &out).context("writing output.txt")?;
    eprintln!("wrote {}", dir.display());
    for s in sides {
        let _ = s.conn.close().await;
    }
    Ok(())
}
