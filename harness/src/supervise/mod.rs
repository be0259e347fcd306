//! The stack supervisor: starts the stack's processes, signals them, and records how they end.
//!
//! Invariant: only this module sends signals to stack processes. Where processes run is a
//! [`Driver`]'s business ([`driver::Local`]: children of this process, each in its own process
//! group, dying with the harness); the records, and what counts as asked for or as a crash, are
//! the supervisor's. Every process writes stdout and stderr to its own log file.

pub mod driver;
mod spawner;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use mock_providers::ledger::Ledger;
use nix::sys::signal::Signal;
use tokio::sync::watch;

pub use driver::Driver;

use crate::check::{ProcessRecord, Role};

/// What to start.
#[derive(Debug, Clone)]
pub struct Spec {
    /// `migrate`, `api` or `worker`.
    pub role: Role,
    pub slot: Option<u32>,
    pub worker_id: Option<String>,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
}

struct Proc {
    record: ProcessRecord,
    exited: watch::Receiver<bool>,
    /// The harness sent it a signal that stops it (anything but SIGCONT): its exit is not a crash.
    asked: bool,
}

/// How much of a crashed process's log the record keeps: the last lines, at most this many bytes.
const LOG_TAIL_BYTES: u64 = 2_048;
const LOG_TAIL_LINES: usize = 20;

/// How often a running process's peak resident memory is read.
const RSS_EVERY: Duration = Duration::from_millis(500);

/// Starts, signals and reaps stack processes; every record is kept for the report.
#[derive(Clone)]
pub struct Supervisor {
    driver: Arc<dyn Driver>,
    log_dir: PathBuf,
    clock: Ledger,
    procs: Arc<Mutex<Vec<Proc>>>,
    /// Teardown began: every exit from now on was asked for.
    stopping: Arc<std::sync::atomic::AtomicBool>,
}

impl Supervisor {
    /// `clock`: the ledger whose monotonic clock every record uses. Processes run here
    /// ([`driver::Local`]).
    pub fn new(log_dir: &Path, clock: Ledger) -> anyhow::Result<Supervisor> {
        Supervisor::with_driver(Arc::new(driver::Local), log_dir, clock)
    }

    /// As [`Supervisor::new`], with processes run by `driver`.
    pub fn with_driver(
        driver: Arc<dyn Driver>,
        log_dir: &Path,
        clock: Ledger,
    ) -> anyhow::Result<Supervisor> {
        std::fs::create_dir_all(log_dir)
            .with_context(|| format!("create {}", log_dir.display()))?;
        Ok(Supervisor {
            driver,
            log_dir: log_dir.to_path_buf(),
            clock,
            procs: Arc::default(),
            stopping: Arc::default(),
        })
    }

    /// Starts `spec` and returns its pid. A task reaps it and records its exit.
    pub async fn spawn(&self, spec: Spec) -> anyhow::Result<u32> {
        let name = match (&spec.slot, &spec.worker_id) {
            (_, Some(id)) => format!("{}-{id}", spec.role),
            (Some(s), None) => format!("{}-{s}", spec.role),
            _ => spec.role.to_string(),
        };
        let log_path = self.log_dir.join(format!("{name}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let started = self.driver.start(&spec, log).await?;
        let (pid, ended) = (started.id, started.ended);
        let (tx, rx) = watch::channel(false);
        let record = ProcessRecord {
            role: spec.role,
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
            exited_unasked: false,
            log_tail: None,
            peak_rss_kib: None,
        };
        self.procs.lock().unwrap().push(Proc {
            record,
            exited: rx,
            asked: false,
        });
        let me = self.clone();
        tokio::spawn(async move {
            let mut ended = ended;
            let status = loop {
                me.note_rss(pid);
                tokio::select! {
                    status = &mut ended => break status,
                    () = tokio::time::sleep(RSS_EVERY) => {}
                }
            };
            let now = me.clock.now_ns();
            let unasked = !me.stopping.load(std::sync::atomic::Ordering::SeqCst);
            // Read outside the lock; kept only when the harness had not asked it to stop.
            let tail = unasked.then(|| log_tail(&log_path));
            let mut procs = me.procs.lock().unwrap();
            if let Some(p) = procs
                .iter_mut()
                .find(|p| p.record.pid == pid && p.record.exited_ns.is_none())
            {
                p.record.exited_ns = Some(now);
                p.record.exit_code = status.code;
                p.record.signal = status.signal;
                if unasked && !p.asked && p.record.role != Role::Migrate {
                    p.record.exited_unasked = true;
                    p.record.log_tail = tail;
                }
            }
            drop(procs);
            let _ = tx.send(true);
        });
        Ok(pid)
    }

    /// Sends `sig` to the process group of `pid` (the process and anything it forked). Any
    /// signal but SIGCONT marks the process as asked to stop: its exit is then not a crash.
    pub fn signal(&self, pid: u32, sig: Signal) -> anyhow::Result<()> {
        self.note_rss(pid);
        let now = self.clock.now_ns();
        if let Some(p) = self
            .procs
            .lock()
            .unwrap()
            .iter_mut()
            .find(|p| p.record.pid == pid)
        {
            p.asked |= sig != Signal::SIGCONT;
            if sig == Signal::SIGTERM {
                p.record.sigterm_ns.get_or_insert(now);
            }
        }
        self.driver.signal(pid, sig)
    }

    /// Reads `pid`'s peak resident memory into its record (a peak only grows, so the last
    /// reading before it ends is the closest to its whole life's).
    fn note_rss(&self, pid: u32) {
        let Some(kib) = self.driver.peak_rss_kib(pid) else {
            return;
        };
        let mut procs = self.procs.lock().unwrap();
        if let Some(p) = procs
            .iter_mut()
            .find(|p| p.record.pid == pid && p.record.exited_ns.is_none())
        {
            p.record.peak_rss_kib = p.record.peak_rss_kib.max(Some(kib));
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

    /// Polls `/proc/<pid>/stat` until the process's state letter satisfies `want` (`T` stopped,
    /// `R`/`S`/`D` running or sleeping), for up to `timeout`. Returns the last state seen (`None`
    /// when the process is gone) and whether it matched.
    pub async fn wait_state(
        &self,
        pid: u32,
        want: impl Fn(char) -> bool,
        timeout: Duration,
    ) -> (Option<char>, bool) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let state = self.driver.state(pid);
            if state.is_some_and(&want) {
                return (state, true);
            }
            if state.is_none_or(|s| s == 'Z' || s == 'X') || tokio::time::Instant::now() >= deadline
            {
                return (state, false);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    pub fn is_alive(&self, pid: u32) -> bool {
        self.procs
            .lock()
            .unwrap()
            .iter()
            .any(|p| p.record.pid == pid && p.record.exited_ns.is_none())
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
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let live: Vec<u32> = self
            .procs
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.record.exited_ns.is_none())
            .map(|p| p.record.pid)
            .collect();
        for pid in &live {
            let _ = self.driver.signal(*pid, Signal::SIGCONT);
            let _ = self.driver.signal(*pid, Signal::SIGTERM);
        }
        for pid in &live {
            if !self.wait_exit(*pid, grace).await {
                let _ = self.driver.signal(*pid, Signal::SIGKILL);
                self.wait_exit(*pid, Duration::from_secs(5)).await;
            }
        }
    }

    /// Kills everything at once (Ctrl-C path). Synchronous so it can run from any context.
    pub fn kill_all(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for p in self
            .procs
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.record.exited_ns.is_none())
        {
            let _ = self.driver.signal(p.record.pid, Signal::SIGKILL);
        }
    }
}

/// The last lines of the log at `path` (at most [`LOG_TAIL_LINES`] lines of the last
/// [`LOG_TAIL_BYTES`] bytes), lossily decoded.
fn log_tail(path: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)));
    let mut buf = Vec::new();
    let _ = f.take(LOG_TAIL_BYTES).read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use driver::{Ended, Started};
    use futures::future::BoxFuture;
    use std::collections::HashMap;
    use tokio::sync::oneshot;

    /// Processes that exist only in memory: a signal that stops one ends it at once.
    #[derive(Default)]
    struct InMemory {
        next: std::sync::atomic::AtomicU32,
        running: Mutex<HashMap<u32, oneshot::Sender<Ended>>>,
        signals: Mutex<Vec<(u32, Signal)>>,
    }

    impl Driver for InMemory {
        fn start(&self, _: &Spec, _: std::fs::File) -> BoxFuture<'static, anyhow::Result<Started>> {
            let id = 1_000 + self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (tx, rx) = oneshot::channel();
            self.running.lock().unwrap().insert(id, tx);
            Box::pin(async move {
                let ended = Box::pin(async move { rx.await.unwrap_or_default() });
                Ok(Started { id, ended })
            })
        }

        fn signal(&self, id: u32, sig: Signal) -> anyhow::Result<()> {
            self.signals.lock().unwrap().push((id, sig));
            if matches!(sig, Signal::SIGKILL | Signal::SIGTERM) {
                if let Some(tx) = self.running.lock().unwrap().remove(&id) {
                    let _ = tx.send(Ended {
                        code: None,
                        signal: Some(sig as i32),
                    });
                }
            }
            Ok(())
        }

        fn state(&self, id: u32) -> Option<char> {
            self.running
                .lock()
                .unwrap()
                .contains_key(&id)
                .then_some('S')
        }
    }

    /// The supervisor's records and rules go through the seam alone: a driver that forks nothing
    /// gets the same bookkeeping (started, signalled, ended by the signal asked for, not a crash).
    #[tokio::test]
    async fn a_driver_that_forks_nothing_gets_the_same_bookkeeping() {
        let dir = tempfile::tempdir().unwrap();
        let driver = Arc::new(InMemory::default());
        let sup = Supervisor::with_driver(driver.clone(), dir.path(), Ledger::new()).unwrap();
        let spec = Spec {
            role: Role::Worker,
            slot: Some(1),
            worker_id: Some("w1".into()),
            argv: vec!["nothing".into()],
            env: BTreeMap::new(),
            cwd: None,
        };
        let pid = sup.spawn(spec).await.unwrap();
        assert!(sup.is_alive(pid));
        let (state, running) = sup
            .wait_state(pid, |s| s == 'S', Duration::from_secs(1))
            .await;
        assert_eq!((state, running), (Some('S'), true));
        sup.signal(pid, Signal::SIGKILL).unwrap();
        assert!(sup.wait_exit(pid, Duration::from_secs(5)).await);
        let rec = sup.record(pid).unwrap();
        assert_eq!(rec.signal, Some(Signal::SIGKILL as i32));
        assert!(
            !rec.exited_unasked,
            "an exit the harness asked for is no crash"
        );
        assert_eq!(rec.log, "worker-w1.log");
        assert_eq!(*driver.signals.lock().unwrap(), [(pid, Signal::SIGKILL)]);
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.log");
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let tail = log_tail(&path);
        assert_eq!(tail.lines().count(), LOG_TAIL_LINES);
        assert!(tail.ends_with("line 100"), "{tail}");
        assert_eq!(log_tail(&dir.path().join("missing.log")), "");
    }
}
