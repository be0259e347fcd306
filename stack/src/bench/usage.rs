//! Where one measurement's work went, per row claimed: CPU of the client (this process for the
//! stack side; `pgbench`, a reaped child, for its side), CPU of the PostgreSQL server (the
//! postmaster and every backend, live or already exited), and WAL written. This is the profile
//! that says *why* one side is slower: a client spending more CPU per row on a machine whose
//! cores the server shares, or a statement writing more per row.
//!
//! Server CPU is read from `/proc`, so it is only known when the database runs on this machine;
//! WAL comes from `pg_current_wal_lsn()` and counts everything the server wrote meanwhile (the
//! benchmark should be its only user).

use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;

/// `/proc/*/stat` times are in USER_HZ, which the Linux ABI fixes at 100 per second.
const TICK: Duration = Duration::from_millis(10);

/// Cumulative counters at one instant.
#[derive(Clone, Copy, Debug, Default)]
pub struct Snapshot {
    own_cpu: Duration,
    children_cpu: Duration,
    server_cpu: Option<Duration>,
    wal_bytes: Option<i64>,
}

/// Per-row costs between two snapshots.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Profile {
    /// Client CPU per row, microseconds (user + system).
    pub client_cpu_us: f64,
    /// Server CPU per row, microseconds (all PostgreSQL processes), when the server is local.
    pub server_cpu_us: Option<f64>,
    /// WAL bytes per row.
    pub wal_bytes: Option<f64>,
}

/// Whose CPU is the client's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// This process (the stack side runs in it).
    Own,
    /// Children this process has reaped (`pgbench`).
    Children,
}

impl Snapshot {
    pub async fn take(pool: &PgPool, postmaster: Option<u32>) -> Snapshot {
        let (own_cpu, children_cpu) = stat(std::process::id())
            .map(|s| (s.cpu, s.children_cpu))
            .unwrap_or_default();
        let wal_bytes = sqlx::query_as::<_, (i64,)>(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint",
        )
        .fetch_one(pool)
        .await
        .ok()
        .map(|(b,)| b);
        Snapshot {
            own_cpu,
            children_cpu,
            server_cpu: postmaster.and_then(server_cpu),
            wal_bytes,
        }
    }

    /// What happened since `before`, divided over `rows`.
    pub fn since(&self, before: &Snapshot, client: Client, rows: u64) -> Profile {
        let n = rows.max(1) as f64;
        let us = |d: Duration| d.as_secs_f64() * 1e6 / n;
        let cpu = match client {
            Client::Own => self.own_cpu.saturating_sub(before.own_cpu),
            Client::Children => self.children_cpu.saturating_sub(before.children_cpu),
        };
        Profile {
            client_cpu_us: us(cpu),
            // A counter that went backwards (a process missed between two scans of /proc)
            // says nothing: unknown, not zero.
            server_cpu_us: self
                .server_cpu
                .zip(before.server_cpu)
                .and_then(|(a, b)| a.checked_sub(b))
                .map(us),
            wal_bytes: self
                .wal_bytes
                .zip(before.wal_bytes)
                .map(|(a, b)| (a - b).max(0) as f64 / n),
        }
    }
}

/// The postmaster of the server `pool` talks to, if it runs on this machine.
pub async fn postmaster(pool: &PgPool) -> Option<u32> {
    let (backend,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
        .ok()?;
    let ppid = stat(backend as u32)?.ppid;
    // A backend's parent is the postmaster, whose own parent is not a postgres process of the
    // same cluster; check the name so a remote server's pid that happens to exist here is not
    // mistaken for one.
    let comm = std::fs::read_to_string(format!("/proc/{ppid}/comm")).ok()?;
    (comm.trim() == "postgres" || comm.trim() == "postmaster").then_some(ppid)
}

/// All CPU the cluster has used: the postmaster itself, the children it has reaped, and the
/// live ones.
fn server_cpu(postmaster: u32) -> Option<Duration> {
    let pm = stat(postmaster)?;
    let mut total = pm.cpu + pm.children_cpu;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(s) = stat(pid).filter(|s| s.ppid == postmaster) {
            total += s.cpu;
        }
    }
    Some(total)
}

struct Stat {
    ppid: u32,
    cpu: Duration,
    children_cpu: Duration,
}

fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Fields after the command name (which may hold spaces and parentheses): state, ppid, …,
/// utime (14th field of the line), stime, cutime, cstime.
fn parse_stat(line: &str) -> Option<Stat> {
    let rest = &line[line.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    let ticks = |a: u64, b: u64| TICK * (a + b) as u32;
    Some(Stat {
        ppid: num(1)? as u32,
        cpu: ticks(num(11)?, num(12)?),
        children_cpu: ticks(num(13)?, num(14)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_stat_line_with_an_awkward_name() {
        let line = "4242 (post gres) (x)) S 17 4242 4242 0 -1 4194560 500 0 0 0 \
                    250 30 7 3 20 0 1 0 100 1000 200 18446744073709551615";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.ppid, 17);
        assert_eq!(s.cpu, Duration::from_millis(2_800));
        assert_eq!(s.children_cpu, Duration::from_millis(100));
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn this_process_has_a_stat() {
        let s = stat(std::process::id()).unwrap();
        assert!(s.ppid > 0);
    }

    #[test]
    fn per_row_differences() {
        let a = Snapshot {
            own_cpu: Duration::from_millis(100),
            children_cpu: Duration::from_millis(5),
            server_cpu: Some(Duration::from_millis(1_000)),
            wal_bytes: Some(1_000),
        };
        let b = Snapshot {
            own_cpu: Duration::from_millis(300),
            children_cpu: Duration::from_millis(405),
            server_cpu: Some(Duration::from_millis(2_000)),
            wal_bytes: Some(401_000),
        };
        let p = b.since(&a, Client::Own, 1_000);
        assert_eq!(p.client_cpu_us, 200.0);
        assert_eq!(p.server_cpu_us, Some(1_000.0));
        assert_eq!(p.wal_bytes, Some(400.0));
        assert_eq!(b.since(&a, Client::Children, 1_000).client_cpu_us, 400.0);
        let remote = Snapshot {
            server_cpu: None,
            ..b
        };
        assert_eq!(remote.since(&a, Client::Own, 1_000).server_cpu_us, None);
    }
}
