//! The `pgbench` side of the claim benchmark: the same claim and completion statements as the
//! stack side, as a pgbench script run with `-M prepared` (so parameters travel as bind
//! parameters and the plan is cached, as sqlx does), one connection and thread per worker.
//!
//! This module only runs `pgbench` and parses its summary; it must never touch the database
//! itself.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::claim::{for_batch, CLAIM_SQL};

/// The script for claims of `batch` rows: [`CLAIM_SQL`] with that batch size in its text, as the
/// stack sends it, then [`super::COMPLETE_SQL`]. The worker id (`$1` on the stack side, a text
/// bind parameter) is built from pgbench's own `:client_id`, so each client holds its leases
/// under its own name exactly as each stack worker does; the lease (`$2`) is pgbench's `:lease`.
pub fn script(batch: i64) -> String {
    let worker = "('bench-pg-'::text || :client_id)";
    let claim = for_batch(CLAIM_SQL, batch)
        .replace("$1", worker)
        .replace("$2", ":lease");
    let complete = super::COMPLETE_SQL.replace("$1", worker);
    format!("{};\n{};\n", claim.trim(), complete.trim())
}

/// One pgbench invocation.
pub(super) struct Run<'a> {
    pub bin: &'a Path,
    pub url: &'a str,
    pub workers: usize,
    pub batch: i64,
    pub lease: Duration,
    /// Transactions per client (ignored when `duration` is set).
    pub transactions: u64,
    pub duration: Option<Duration>,
}

/// What pgbench reported.
pub(super) struct Tx {
    pub transactions: u64,
    /// Transactions per second, without connection time.
    pub tps: f64,
}

impl Run<'_> {
    pub async fn execute(&self) -> anyhow::Result<Tx> {
        let dir = std::env::temp_dir().join(format!("ting-claim-bench-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).context("creating the pgbench script directory")?;
        let file = dir.join("claim.sql");
        std::fs::write(&file, script(self.batch)).context("writing the pgbench script")?;
        let n = self.workers.to_string();
        let mut cmd = tokio::process::Command::new(self.bin);
        cmd.args(["-n", "-M", "prepared", "-c", &n, "-j", &n])
            .arg("-D")
            .arg(format!("lease={}", self.lease.as_millis()));
        match self.duration {
            Some(d) => cmd.arg("-T").arg(d.as_secs().max(1).to_string()),
            None => cmd.arg("-t").arg(self.transactions.max(1).to_string()),
        };
        let out = cmd
            .arg("-f")
            .arg(&file)
            .arg(self.url)
            .output()
            .await
            .with_context(|| format!("running {}", self.bin.display()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = out?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "pgbench failed: {}{}",
                stdout,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        parse(&stdout).with_context(|| format!("unexpected pgbench output: {stdout}"))
    }
}

/// Reads "number of transactions actually processed: N[/M]" and "tps = X (without initial
/// connection time)".
fn parse(stdout: &str) -> Option<Tx> {
    let transactions = stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))?
        .split('/')
        .next()?
        .trim()
        .parse()
        .ok()?;
    let tps = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("tps = "))
        .find_map(|l| l.split_whitespace().next()?.parse().ok())?;
    Some(Tx { transactions, tps })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pgbench_15_summary() {
        let out = "transaction type: claim.sql\nnumber of clients: 2\n\
                   number of transactions actually processed: 200/200\n\
                   latency average = 0.5 ms\n\
                   initial connection time = 3.1 ms\n\
                   tps = 3981.447 (without initial connection time)\n";
        let tx = parse(out).expect("parses");
        assert_eq!(tx.transactions, 200);
        assert!((tx.tps - 3981.447).abs() < 1e-9);
        assert!(parse("tps = 1 (x)\n").is_none());
    }

    #[test]
    fn script_has_no_positional_parameters_left() {
        let s = script(100);
        for p in ["$1", "$2", "$3", "{batch}"] {
            assert!(!s.contains(p), "{p} left in {s}");
        }
        assert!(s.contains("LIMIT 100\n"), "{s}");
        assert_eq!(s.matches(";\n").count(), 2);
    }
}
