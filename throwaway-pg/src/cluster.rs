//! [`Cluster`]: a private PostgreSQL server owned by this process, from `initdb` to `rm -rf`.
//!
//! The postmaster is a direct child. Cleanup happens on every exit path: `stop()` (fast
//! shutdown), `Drop` (immediate shutdown, synchronous, best effort), an error half-way through
//! `start()` (the half-built cluster is dropped), and death of this process by any signal,
//! SIGKILL included (the watchdog, `src/watchdog.rs`, does it). Owners that catch Ctrl-C/SIGTERM
//! call `stop()` or drop the cluster from their handler.
//!
//! This type must never leave a postmaster running or a directory behind unless asked to keep
//! it (`set_keep`).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::bins::{find_binaries, PgBinaries};
use crate::initdb;
use crate::postmaster::{self, NotReady};
use crate::runas::{make_private_dir, RunAs};
use crate::watchdog::Watchdog;
use crate::Error;

/// Server settings a caller may size; everything else is fixed for speed (see the crate docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterOptions {
    /// `max_connections`; size it for the worker count plus the harness's own sessions.
    pub max_connections: u32,
    /// `shared_buffers`, in PostgreSQL's syntax, e.g. `"128MB"`.
    pub shared_buffers: String,
    /// `synchronous_commit`; on by default because benchmarks rely on it.
    pub synchronous_commit: bool,
    /// Extra `-c key=value` settings, applied last (they override the ones above).
    pub extra: Vec<(String, String)>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            max_connections: 100,
            shared_buffers: "128MB".to_string(),
            synchronous_commit: true,
            extra: Vec::new(),
        }
    }
}

/// A running private PostgreSQL cluster: superuser `postgres`, trust authentication, listening
/// on `127.0.0.1:port()` and on a Unix socket in `data_dir()`.
#[derive(Debug)]
pub struct Cluster {
    bins: PgBinaries,
    opts: ClusterOptions,
    run_as: Option<RunAs>,
    dir: PathBuf,
    port: u16,
    postmaster: Option<Child>,
    watchdog: Option<Watchdog>,
    keep: bool,
    ready_in: Duration,
}

/// How many fresh ports to try when another process grabs ours between probe and bind.
const PORT_ATTEMPTS: usize = 5;

impl Cluster {
    /// Finds the binaries ([`find_binaries`]), then [`Cluster::start_with`].
    pub async fn start(opts: ClusterOptions) -> Result<Cluster, Error> {
        let bins = find_binaries()?;
        Cluster::start_with(bins, opts).await
    }

    /// `initdb` into a fresh directory under `/tmp`, start the postmaster on a free port and
    /// wait until it accepts connections.
    pub async fn start_with(bins: PgBinaries, opts: ClusterOptions) -> Result<Cluster, Error> {
        let began = Instant::now();
        let run_as = RunAs::detect()?;
        let dir = make_private_dir(run_as.as_ref())?;
        let watchdog = match Watchdog::spawn(&dir) {
            Ok(w) => w,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        // From here on, dropping `cluster` (an early return) cleans everything up.
        let mut cluster = Cluster {
            bins,
            opts,
            run_as,
            dir,
            port: 0,
            postmaster: None,
            watchdog: Some(watchdog),
            keep: false,
            ready_in: Duration::ZERO,
        };
        // A copied template is the prime suspect when a server exits at startup: try once
        // more with initdb, and withdraw the template only if that one starts.
        let mut use_template = true;
        let mut suspect = None;
        let init_in = loop {
            let init_began = Instant::now();
            let watchdog = cluster.watchdog.as_mut().expect("just set");
            let template = initdb::init_data_dir(
                &cluster.bins,
                &cluster.dir,
                cluster.run_as.as_ref(),
                use_template,
                |pid| watchdog.track(Some(pid)),
            )
            .await?;
            cluster.track(None);
            let init_in = init_began.elapsed();
            match (cluster.launch_on_a_free_port().await, template) {
                (Ok(()), _) => break init_in,
                (Err(Launch::Exited(e)), Some(template)) => {
                    tracing::warn!(error = %e, template = %template.display(), "a cluster copied from the template did not start; trying initdb");
                    initdb::empty_dir(&cluster.dir)?;
                    use_template = false;
                    suspect = Some(template);
                }
                (Err(e), _) => return Err(e.into_error()),
            }
        };
        if let Some(template) = suspect {
            tracing::warn!(template = %template.display(), "withdrawing a cluster template that does not start");
            initdb::withdraw(&template);
        }
        cluster.ready_in = began.elapsed();
        tracing::info!(
            port = cluster.port,
            dir = %cluster.dir.display(),
            ready_ms = cluster.ready_in.as_millis() as u64,
            init_ms = init_in.as_millis() as u64,
            "private PostgreSQL cluster ready"
        );
        Ok(cluster)
    }

    /// Picks a free port and launches there, trying again when another process takes the port
    /// between our probe and the postmaster's bind.
    async fn launch_on_a_free_port(&mut self) -> Result<(), Launch> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.port = postmaster::free_port().map_err(Launch::Failed)?;
            match self.launch().await {
                Ok(()) => return Ok(()),
                Err(Launch::PortInUse(_)) if attempt < PORT_ATTEMPTS => {
                    tracing::debug!(
                        port = self.port,
                        "port taken before postgres bound it; trying another"
                    );
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Spawns the postmaster on `self.port` and waits for readiness; on failure it is reaped
    /// and the error carries the log tail.
    async fn launch(&mut self) -> Result<(), Launch> {
        let (mut child, offset) = postmaster::spawn(
            &self.bins,
            &self.dir,
            self.port,
            self.run_as.as_ref(),
            &self.opts,
        )
        .map_err(Launch::Failed)?;
        self.track(Some(child.id()));
        let result = postmaster::wait_ready(
            &mut child,
            &self.dir,
            offset,
            self.port,
            postmaster::READY_TIMEOUT,
        )
        .await;
        let (reason, exited, port_in_use) = match result {
            Ok(()) => {
                self.postmaster = Some(child);
                return Ok(());
            }
            Err(NotReady::Exited {
                status,
                port_in_use,
            }) => (
                format!("postgres exited with {status} before accepting connections"),
                true,
                port_in_use,
            ),
            Err(NotReady::Timeout) => (
                format!(
                    "postgres did not accept connections on 127.0.0.1:{} within {:?}",
                    self.port,
                    postmaster::READY_TIMEOUT
                ),
                false,
                false,
            ),
            Err(NotReady::Io(e)) => (format!("waiting for postgres failed: {e}"), false, false),
        };
        postmaster::shutdown(&mut child, Signal::SIGQUIT, Duration::from_secs(5)).await;
        self.track(None);
        let err = Error::StartFailed {
            reason,
            log_tail: postmaster::tail(&postmaster::read_log(&self.dir, offset), 40),
        };
        Err(match (port_in_use, exited) {
            (true, _) => Launch::PortInUse(err),
            (false, true) => Launch::Exited(err),
            (false, false) => Launch::Failed(err),
        })
    }

    fn track(&mut self, pid: Option<u32>) {
        if let Some(w) = self.watchdog.as_mut() {
            w.track(pid);
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`, the maintenance database.
    pub fn admin_url(&self) -> String {
        self.url_for("postgres")
    }

    /// URL of database `db` on this cluster (the name is percent-encoded as needed).
    pub fn url_for(&self, db: &str) -> String {
        let mut url = url::Url::parse(&format!("postgres://postgres@127.0.0.1:{}/", self.port))
            .expect("static url is valid");
        url.path_segments_mut()
            .expect("postgres url has a path")
            .push(db);
        url.to_string()
    }

    /// The TCP port on 127.0.0.1 (kept across `restart()`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster directory: PGDATA, the Unix socket directory, and `postgres.log`.
    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the server log.
    pub fn log_path(&self) -> PathBuf {
        postmaster::log_path(&self.dir)
    }

    /// Pid of the running postmaster; `None` after a failed restart.
    pub fn postmaster_pid(&self) -> Option<u32> {
        self.postmaster.as_ref().map(|c| c.id())
    }

    /// Pid of the watchdog process that cleans up if this process dies.
    pub fn watchdog_pid(&self) -> Option<u32> {
        self.watchdog.as_ref().map(|w| w.pid())
    }

    /// How long `start` took, from nothing to accepting connections (initdb included).
    pub fn ready_in(&self) -> Duration {
        self.ready_in
    }

    /// Keep the directory when the cluster stops or this process dies (the server is still
    /// stopped). For `--keep`: the data can be inspected or the server started again by hand.
    pub fn set_keep(&mut self, keep: bool) {
        self.keep = keep;
        if keep {
            if let Some(w) = self.watchdog.as_mut() {
                w.keep();
            }
        }
    }

    /// Immediate-mode stop (SIGQUIT to the postmaster, as `pg_ctl -m immediate`: no checkpoint,
    /// crash recovery on the next start) and start again on the same port and directory,
    /// waiting until it accepts connections. Committed data survives.
    pub async fn restart(&mut self) -> Result<(), Error> {
        if let Some(mut child) = self.postmaster.take() {
            postmaster::shutdown(&mut child, Signal::SIGQUIT, Duration::from_secs(10)).await;
        }
        self.track(None);
        self.launch().await.map_err(Launch::into_error)
    }

    /// Fast shutdown (SIGINT, escalating to SIGQUIT then SIGKILL), then removes the directory
    /// unless kept.
    pub async fn stop(mut self) -> Result<(), Error> {
        if let Some(mut child) = self.postmaster.take() {
            postmaster::shutdown(&mut child, Signal::SIGINT, Duration::from_secs(10)).await;
        }
        self.track(None);
        self.finish()
    }

    /// Removes the directory (unless kept) and dismisses the watchdog. Idempotent.
    fn finish(&mut self) -> Result<(), Error> {
        let mut result = Ok(());
        if self.watchdog.is_some() && !self.keep {
            if let Err(source) = std::fs::remove_dir_all(&self.dir) {
                if source.kind() != std::io::ErrorKind::NotFound {
                    result = Err(Error::Cleanup {
                        dir: self.dir.clone(),
                        source,
                    });
                }
            }
        }
        drop(self.watchdog.take());
        result
    }
}

/// Why a launch failed, for the retry decisions of `start_with`.
enum Launch {
    /// Another process took the port: worth another port.
    PortInUse(Error),
    /// The server exited during startup: the data directory may be at fault.
    Exited(Error),
    /// Anything else (timeout, I/O).
    Failed(Error),
}

impl Launch {
    fn into_error(self) -> Error {
        match self {
            Launch::PortInUse(e) | Launch::Exited(e) | Launch::Failed(e) => e,
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut child) = self.postmaster.take() {
            // Immediate mode unless the data is kept: nobody will read it again.
            let first = if self.keep {
                Signal::SIGINT
            } else {
                Signal::SIGQUIT
            };
            postmaster::shutdown_blocking(&mut child, first, Duration::from_secs(10));
        }
        self.track(None);
        if let Err(e) = self.finish() {
            tracing::warn!(error = %e, "private PostgreSQL cluster cleanup failed");
        }
    }
}
