//! The postmaster of a private cluster: spawning it, readiness and shutdown.
//!
//! Readiness is polled (a TCP connection attempt every 10 ms) against a deadline, never a fixed
//! sleep, and an early exit of the postmaster is noticed at once and reported with its log.
//! Shutdown always escalates (the requested signal, then SIGQUIT, then SIGKILL) and always reaps.
//!
//! This module must never signal a process it has already reaped (its pid may be reused).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{ConnectOptions, Connection};

use crate::bins::PgBinaries;
use crate::runas::RunAs;
use crate::{ClusterOptions, Error};

/// File name of the server log inside the cluster directory.
pub(crate) const LOG_FILE: &str = "postgres.log";
/// How long a start (or restart) may take before we give up: generous, because CI machines
/// are slow and busy; on an idle dev machine it is well under a second.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(10);

/// A command for a cluster binary: run as `run_as`, in `dir`, in its own process group (so a
/// Ctrl-C in the owner's terminal reaches the owner, which then stops us in order), with
/// English messages and no PG* variables that could redirect it.
pub(crate) fn command(program: &Path, dir: &Path, run_as: Option<&RunAs>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program);
    cmd.current_dir(dir)
        .env("LC_ALL", "C")
        .env_remove("PGDATA")
        .env_remove("PGPORT")
        .env_remove("PGHOST")
        .stdin(Stdio::null())
        .process_group(0);
    if let Some(user) = run_as {
        user.apply(&mut cmd);
    }
    cmd
}

/// Starts the postmaster on `port`, logging to `dir/postgres.log` (appended). Returns the child
/// and the log offset at which this start's messages begin.
pub(crate) fn spawn(
    bins: &PgBinaries,
    dir: &Path,
    port: u16,
    run_as: Option<&RunAs>,
    opts: &ClusterOptions,
) -> Result<(Child, u64), Error> {
    let log_path = dir.join(LOG_FILE);
    let log = File::options()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(Error::io(format!("open {}", log_path.display())))?;
    let offset = log.metadata().map(|m| m.len()).unwrap_or(0);
    let log_err = log
        .try_clone()
        .map_err(Error::io("duplicate the log file handle"))?;
    let mut cmd = command(&bins.postgres(), dir, run_as);
    cmd.arg("-D").arg(dir);
    for (key, value) in settings(dir, port, opts) {
        cmd.arg("-c").arg(format!("{key}={value}"));
    }
    cmd.stdout(log).stderr(log_err);
    let child = cmd
        .spawn()
        .map_err(Error::io(format!("spawn {}", bins.postgres().display())))?;
    Ok((child, offset))
}

/// The `-c` settings of the postmaster, in order; later ones win, so `opts.extra` comes last.
pub(crate) fn settings(dir: &Path, port: u16, opts: &ClusterOptions) -> Vec<(String, String)> {
    let on_off = |b: bool| if b { "on" } else { "off" }.to_string();
    let mut out: Vec<(String, String)> = [
        ("listen_addresses", "127.0.0.1".to_string()),
        ("port", port.to_string()),
        ("unix_socket_directories", dir.display().to_string()),
        ("max_connections", opts.max_connections.to_string()),
        ("shared_buffers", opts.shared_buffers.clone()),
        ("fsync", "off".to_string()),
        ("synchronous_commit", on_off(opts.synchronous_commit)),
        ("full_page_writes", "off".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    out.extend(opts.extra.iter().cloned());
    out
}

/// Why a postmaster did not become ready.
#[derive(Debug)]
pub(crate) enum NotReady {
    /// It exited; `port_in_use` when it could not bind its port (worth retrying another).
    Exited {
        status: ExitStatus,
        port_in_use: bool,
    },
    /// It was still not accepting connections at the deadline.
    Timeout,
    /// Waiting on it failed.
    Io(std::io::Error),
}

/// Polls until the postmaster accepts a connection on `port`, it exits, or `timeout` passes.
pub(crate) async fn wait_ready(
    child: &mut Child,
    dir: &Path,
    log_offset: u64,
    port: u16,
    timeout: Duration,
) -> Result<(), NotReady> {
    let deadline = Instant::now() + timeout;
    let options = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(port)
        .username("postgres")
        .database("postgres")
        .ssl_mode(PgSslMode::Disable)
        .disable_statement_logging();
    loop {
        if let Some(status) = child.try_wait().map_err(NotReady::Io)? {
            let log = read_log(dir, log_offset);
            let port_in_use = log.contains("could not create any TCP/IP sockets")
                || log.contains("Address already in use");
            return Err(NotReady::Exited {
                status,
                port_in_use,
            });
        }
        if let Ok(Ok(conn)) = tokio::time::timeout(Duration::from_secs(2), options.connect()).await
        {
            let _ = conn.close().await;
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(NotReady::Timeout);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Signals `child` unless it has already exited (and been reaped).
fn signal(child: &mut Child, sig: Signal) {
    if let Ok(None) = child.try_wait() {
        let _ = kill(Pid::from_raw(child.id() as i32), sig);
    }
}

/// The escalation ladder used by both shutdown flavours: (signal, how long to wait after it).
fn ladder(first: Signal, grace: Duration) -> [(Signal, Duration); 3] {
    [
        (first, grace),
        (Signal::SIGQUIT, Duration::from_secs(5)),
        (Signal::SIGKILL, Duration::from_secs(5)),
    ]
}

/// Stops and reaps `child`: `first` (SIGINT = fast shutdown, SIGQUIT = immediate), then
/// escalates. Returns how it exited, if it was seen to exit.
pub(crate) async fn shutdown(
    child: &mut Child,
    first: Signal,
    grace: Duration,
) -> Option<ExitStatus> {
    for (sig, wait) in ladder(first, grace) {
        signal(child, sig);
        let deadline = Instant::now() + wait;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Ok(None) => break,
                Err(_) => return None,
            }
        }
    }
    None
}

/// [`shutdown`] for `Drop`, where there may be no runtime to await on.
pub(crate) fn shutdown_blocking(
    child: &mut Child,
    first: Signal,
    grace: Duration,
) -> Option<ExitStatus> {
    for (sig, wait) in ladder(first, grace) {
        signal(child, sig);
        let deadline = Instant::now() + wait;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => break,
                Err(_) => return None,
            }
        }
    }
    None
}

/// A free loopback port outside the ephemeral range ([`crate::free_port`]). Another process may
/// still take it before postgres binds it; [`NotReady::Exited`] with `port_in_use` tells the
/// caller to try again.
pub(crate) fn free_port() -> Result<u16, Error> {
    crate::ports::free_port().map_err(Error::io("find a free loopback port"))
}

/// The server log written since `offset`, lossy.
pub(crate) fn read_log(dir: &Path, offset: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(log_path(dir)) {
        let mut bytes = Vec::new();
        if f.seek(SeekFrom::Start(offset)).is_ok() && f.read_to_end(&mut bytes).is_ok() {
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    text
}

pub(crate) fn log_path(dir: &Path) -> PathBuf {
    dir.join(LOG_FILE)
}

/// The last `lines` lines of `text`.
pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
