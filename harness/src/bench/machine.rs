//! The machine a benchmark ran on, recorded beside its figures: cores, CPU model, kernel, load
//! when it started, and the PostgreSQL server's version and the settings that move queue
//! throughput. A figure without this is not comparable with anything.
//!
//! It only reads (`/proc`, `pg_settings`); it must never change a setting.

use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu_model: Option<String>,
    pub kernel: Option<String>,
    /// 1-minute load average when the benchmark started (other work on the machine).
    pub load_1m: Option<f64>,
    pub postgres: Option<PgInfo>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PgInfo {
    pub version: String,
    /// `throwaway` (a private cluster started for the run) or `server`.
    pub kind: String,
    pub settings: BTreeMap<String, String>,
}

const SETTINGS: &[&str] = &[
    "max_connections",
    "shared_buffers",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "checkpoint_timeout",
    "max_wal_size",
    "autovacuum",
    "work_mem",
];

/// Describes this machine and, given a URL, the PostgreSQL server behind it.
pub async fn describe(database_url: Option<&str>, kind: &str) -> Machine {
    let postgres = match database_url {
        Some(url) => pg_info(url, kind).await.ok(),
        None => None,
    };
    Machine {
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        cpu_model: std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        }),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .map(|s| s.trim().to_string()),
        load_1m: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok()),
        postgres,
    }
}

async fn pg_info(url: &str, kind: &str) -> anyhow::Result<PgInfo> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let (version,): (String,) = sqlx::query_as("SHOW server_version")
        .fetch_one(&mut conn)
        .await?;
    let rows: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT name, setting, unit FROM pg_settings WHERE name = ANY($1)")
            .bind(SETTINGS)
            .fetch_all(&mut conn)
            .await?;
    let _ = conn.close().await;
    let settings = rows
        .into_iter()
        .map(|(n, v, unit)| {
            let v = match unit.as_deref() {
                Some("8kB") => v
                    .parse::<u64>()
                    .map(|p| format!("{}MB", p * 8 / 1024))
                    .unwrap_or(v),
                Some(u) => format!("{v}{u}"),
                None => v,
            };
            (n, v)
        })
        .collect();
    Ok(PgInfo {
        version,
        kind: kind.to_string(),
        settings,
    })
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "machine: {} cores ({}), load {}",
            self.cores,
            self.cpu_model.as_deref().unwrap_or("unknown CPU"),
            self.load_1m.map_or("?".into(), |l| format!("{l:.2}"))
        )?;
        if let Some(pg) = &self.postgres {
            let s = |k: &str| pg.settings.get(k).map_or("?", |v| v.as_str());
            write!(
                f,
                "; PostgreSQL {} ({}; shared_buffers {}, fsync {}, synchronous_commit {}, max_connections {})",
                pg.version,
                pg.kind,
                s("shared_buffers"),
                s("fsync"),
                s("synchronous_commit"),
                s("max_connections")
            )?;
        }
        Ok(())
    }
}
