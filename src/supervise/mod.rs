//! The stack supervisor: starts the stack's processes, signals them, and records how they end.
//!
//! Invariant: only this module sends signals to stack processes. Every child runs in its own
//! process group (signals reach anything it forked), dies with the harness (parent-death signal,
//! see [`spawner`]), and writes stdout and stderr to its own log file.

mod spawner;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use mock_providers::ledger::Ledger;
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tokio::sync::watch;

use crate::check::ProcessRecord;

/// What to start.
#[derive(Debug, Clone)]
pub struct Spec {
    /// `migrate`, `api` or `worker`.
    pub role: String,
    pub slot: Option<u32>,
    pub worker_id: Option<String>,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
}

struct Proc {
    record: ProcessRecord,
    exited: watch::Receiver<bool>,
}

/// Starts, signals and reaps stack processes; every record is kept for the report.
#[derive(Clone)]
pub struct Supervisor {
    log_dir: PathBuf,
    clock: Ledger,
    procs: Arc<Mutex<Vec<Proc>>>,
}

impl Supervisor {
    /// `clock`: the ledger whose monotonic clock every record uses.
    pub fn new(log_dir: &Path, clock: Ledger) -> anyhow::Result<Supervisor> {
        std::fs::create_dir_all(log_dir)
            .with_context(|| format!("create {}", log_dir.display()))?;
        Ok(Supervisor {
            log_dir: log_dir.to_path_buf(),
            clock,
            procs: Arc::default(),
        })
    }

    /// Starts `spec` and returns its pid. A task reaps it and records its exit.
    pub async fn spawn(&self, spec: Spec) -> anyhow::Result<u32> {
        let name = match (&spec.slot, &spec.worker_id) {
            (_, Some(id)) => format!("{}-{id}", spec.role),
            (Some(s), None) => format!("{}-{s}", spec.role),
            _ => spec.role.clone(),
        };
        let log_path = self.log_dir.join(format!("{name}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let (program, args) = spec.argv.split_first().context("empty command")?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(false);
        if let Some(cwd) = &spec.cwd {
            cmd.current_dir(cwd);
        }
        let mut child = spawner::spawn(cmd)
            .await
            .with_context(|| format!("start {} ({})", spec.role, spec.argv.join(" ")))?;
        let pid = child.id().context("child has no pid")?;
        let (tx, rx) = watch::channel(false);
        let record = ProcessRecord {
            role: spec.role.clone(),
            slot: spec.slot,
            worker_id: spec.worker_id.clone(),
            pid,
            started_ns: self.clock.now_ns(),
            exited_ns: None,
            exit_code: None,
            signal: None,
            sigterm_ns: None,
            killed_after_grace: false,
            log: log_path.file_name().unwrap().to_string_lossy().into_owned(),
        };
        self.procs.lock().unwrap().push(Proc { record, exited: rx });
        let me = self.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let now = me.clock.now_ns();
            let mut procs = me.procs.lock().unwrap();
            if let Some(p) = procs
                .iter_mut()
                .find(|p| p.record.pid == pid && p.record.exited_ns.is_none())
            {
                p.record.exited_ns = Some(now);
                if let Ok(st) = status {
                    use std::os::unix::process::ExitStatusExt;
                    p.record.exit_code = st.code();
                    p.record.signal = st.signal();
                }
            }
            drop(procs);
            let _ = tx.send(true);
        });
        Ok(pid)
    }

    /// Sends `sig` to the process group of `pid` (the process and anything it forked).
    pub fn signal(&self, pid: u32, sig: Signal) -> anyhow::Result<()> {
        if sig == Signal::SIGTERM {
            let now = self.clock.now_ns();
            if let Some(p) = self
                .procs
                .lock()
                .unwrap()
                .iter_mut()
                .find(|p| p.record.pid == pid)
            {
                p.record.sigterm_ns.get_or_insert(now);
            }
        }
        match signal::killpg(Pid::from_raw(pid as i32), sig) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("send {sig} to {pid}")),
        }
    }

    /// Waits up to `timeout` for `pid` to exit; true when it did.
    pub async fn wait_exit(&self, pid: u32, timeout: Duration) -> bool {
        let rx = self
            .procs
            .lock()
            .unwrap()
            .iter()
            .find(|p| p.record.pid == pid)
            .map(|p| p.exited.clone());
        let Some(mut rx) = rx else { return true };
        let done = tokio::time::timeout(timeout, rx.wait_for(|done| *done))
            .await
            .is_ok();
        done
    }

    /// SIGTERM, then SIGKILL after `grace`; marks the record when the kill was needed.
    /// Returns true when it exited within the grace period.
    pub async fn terminate(&self, pid: u32, grace: Duration) -> bool {
        let _ = self.signal(pid, Signal::SIGTERM);
        if self.wait_exit(pid, grace).await {
            return true;
        }
        if let Some(p) = self
            .procs
            .lock()
            .unwrap()
            .iter_mut()
            .find(|p| p.record.pid == pid)
        {
            p.record.killed_after_grace = true;
        }
        let _ = self.signal(pid, Signal::SIGKILL);
        self.wait_exit(pid, Duration::from_secs(5)).await;
        false
    }

    pub fn is_alive(&self, pid: u32) -> bool {
        self.procs
            .lock()
            .unwrap()
            .iter()
            .any(|p| p.record.pid == pid && p.record.exited_ns.is_none())
    }

    /// Live processes of `role`, in start order: (slot, pid).
    pub fn alive(&self, role: &str) -> Vec<(Option<u32>, u32)> {
        self.procs
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.record.role == role && p.record.exited_ns.is_none())
            .map(|p| (p.record.slot, p.record.pid))
            .collect()
    }

    pub fn record(&self, pid: u32) -> Option<ProcessRecord> {
        self.procs
            .lock()
            .unwrap()
            .iter()
            .find(|p| p.record.pid == pid)
            .map(|p| p.record.clone())
    }

    pub fn records(&self) -> Vec<ProcessRecord> {
        self.procs
            .lock()
            .unwrap()
            .iter()
            .map(|p| p.record.clone())
            .collect()
    }

    /// Stops everything still running: SIGTERM to all, then SIGKILL after `grace`. Teardown
    /// SIGTERMs are not recorded as chaos (`sigterm_ns` stays as it was).
    pub async fn shutdown_all(&self, grace: Duration) {
        let live: Vec<u32> = self
            .procs
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.record.exited_ns.is_none())
            .map(|p| p.record.pid)
            .collect();
        for pid in &live {
            let _ = signal::killpg(Pid::from_raw(*pid as i32), Signal::SIGCONT);
            let _ = signal::killpg(Pid::from_raw(*pid as i32), Signal::SIGTERM);
        }
        for pid in &live {
            if !self.wait_exit(*pid, grace).await {
                let _ = signal::killpg(Pid::from_raw(*pid as i32), Signal::SIGKILL);
                self.wait_exit(*pid, Duration::from_secs(5)).await;
            }
        }
    }

    /// Kills everything at once (Ctrl-C path). Synchronous so it can run from any context.
    pub fn kill_all(&self) {
        for p in self
            .procs
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.record.exited_ns.is_none())
        {
            let _ = signal::killpg(Pid::from_raw(p.record.pid as i32), Signal::SIGKILL);
        }
    }
}
