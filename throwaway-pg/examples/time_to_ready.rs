//! Prints how long a private cluster takes to become ready (initdb included), to restart
//! (immediate stop + crash recovery), and to stop, over a few rounds.
//!
//! `cargo run -p throwaway-pg --release --example time_to_ready [ROUNDS]`. A benchmark prints
//! figures; it asserts nothing and must never be run as a test.

use std::time::{Duration, Instant};

use throwaway_pg::{Cluster, ClusterOptions};

fn summary(name: &str, mut v: Vec<Duration>) {
    v.sort();
    println!(
        "{name:>8}: min {:>4} ms  median {:>4} ms  max {:>4} ms  (n={})",
        v[0].as_millis(),
        v[v.len() / 2].as_millis(),
        v[v.len() - 1].as_millis(),
        v.len()
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // RUST_LOG=throwaway_pg=info shows each start's split (init_ms = initdb or template copy).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(5);
    let (mut ready, mut restart, mut stop) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let mut cluster = Cluster::start(ClusterOptions::default()).await?;
        ready.push(cluster.ready_in());
        let t = Instant::now();
        cluster.restart().await?;
        restart.push(t.elapsed());
        let t = Instant::now();
        cluster.stop().await?;
        stop.push(t.elapsed());
    }
    summary("ready", ready);
    summary("restart", restart);
    summary("stop", stop);
    Ok(())
}
