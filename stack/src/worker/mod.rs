//! The worker process: claim loop, sender pool, heartbeat, rescuer, graceful shutdown.
//!
//! Every task the worker starts lives in a `JoinSet` owned by [`run`], so dropping (or aborting)
//! the `run` future stops everything at once, as a SIGKILL would: nothing here relies on
//! cleanup code for correctness. When `shutdown` fires the loop stops claiming, unstarted
//! claims are released at once, in-flight sends finish, and `run` returns `Ok` within the grace
//! period. This module must never hold a database transaction across a provider call.

mod send;

pub use send::{decide, Decision};

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::PgPool;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::channels::{Channel, Providers};
use crate::claim;
use crate::config::{Config, Flaw};

/// Shared by the claim loop and every sender task of one worker.
pub(crate) struct Worker {
    pub cfg: Arc<Config>,
    pub pool: PgPool,
    pub providers: Providers,
    pub stopping: watch::Receiver<bool>,
    /// Sends in flight per worker (`concurrency`) and per channel (`channel_concurrency`).
    pub slots: Arc<Semaphore>,
    pub channel_slots: HashMap<Channel, Arc<Semaphore>>,
    /// When the last successful lease renewal started; leases run at least `lease` from it.
    pub renewed_at: Mutex<Option<Instant>>,
    /// Deliveries a live sender task is working on: the only leases the heartbeat renews.
    pub held: Mutex<std::collections::HashSet<i64>>,
}

impl Worker {
    /// The local view of when a claim taken at `claimed_at` expires.
    pub fn local_deadline(&self, claimed_at: Instant) -> Instant {
        let renewed = self.renewed_at.lock().map(|g| *g).unwrap_or(None);
        renewed.map_or(claimed_at, |r| r.max(claimed_at)) + self.cfg.lease
    }

    /// Time that must be left on a lease to start a send.
    pub fn margin(&self) -> Duration {
        self.cfg.lease / 5
    }
}

/// Runs a worker until `shutdown` fires and the drain is done.
pub async fn run(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let cfg = Arc::new(cfg);
    let pool = crate::pool(&cfg.database_url, (cfg.concurrency as u32).min(12) + 3).await?;
    sqlx::query(
        "INSERT INTO workers (id, pid) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE \
         SET pid = $2, started_at = now(), heartbeat_at = now(), stopped_at = NULL",
    )
    .bind(&cfg.worker_id)
    .bind(std::process::id() as i32)
    .execute(&pool)
    .await
    .context("registering the worker")?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let w = Arc::new(Worker {
        providers: Providers::new(&cfg)?,
        slots: Arc::new(Semaphore::new(cfg.concurrency)),
        channel_slots: Channel::ALL
            .into_iter()
            .map(|c| (c, Arc::new(Semaphore::new(cfg.channel_concurrency))))
            .collect(),
        stopping: stop_rx.clone(),
        renewed_at: Mutex::new(None),
        held: Mutex::default(),
        pool: pool.clone(),
        cfg: cfg.clone(),
    });
    tracing::info!(worker = %cfg.worker_id, flaws = ?cfg.flaws, "worker started");
    if cfg.flaws.has(Flaw::RestartFromFirst) {
        // Flaw: treat the batch as the unit of work: any unfinished batch starts again from its
        // first recipient, delivered ones included (bypassing the state machine on purpose).
        sqlx::query(
            "UPDATE deliveries SET state = 'pending', next_attempt_at = now(), lease_owner = NULL, \
             lease_expires_at = NULL WHERE batch_id IN (SELECT batch_id FROM deliveries \
             WHERE state IN ('pending', 'sending', 'retryable'))",
        )
        .execute(&pool)
        .await
        .context("restart-from-first")?;
    }

    let mut background = JoinSet::new();
    background.spawn(heartbeat(w.clone()));
    if !cfg.flaws.has(Flaw::NoRescue) {
        background.spawn(crate::rescuer::run(
            cfg.clone(),
            pool.clone(),
            w.providers.sms.clone(),
            stop_rx,
        ));
    }

    let mut senders = JoinSet::new();
    tokio::pin!(shutdown);
    let capacity = cfg.concurrency + cfg.claim_batch as usize;
    loop {
        while let Some(r) = senders.try_join_next() {
            log_join(r);
        }
        let room = capacity.saturating_sub(senders.len());
        let mut full = false;
        if room > 0 {
            let n = room.min(cfg.claim_batch as usize) as i64;
            match claim_some(&w, n).await {
                Ok(rows) => {
                    full = rows.len() as i64 == n;
                    let now = Instant::now();
                    for d in rows {
                        if let Ok(mut held) = w.held.lock() {
                            held.insert(d.id);
                        }
                        senders.spawn(send::send_one(w.clone(), d, now));
                    }
                }
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "claim failed"),
            }
        }
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            Some(r) = senders.join_next(), if !senders.is_empty() && !full => log_join(r),
            _ = tokio::time::sleep(cfg.poll_interval), if !full => {}
            _ = std::future::ready(()), if full => {}
        }
    }

    tracing::info!(worker = %cfg.worker_id, in_flight = senders.len(), "shutdown: draining");
    if cfg.flaws.has(Flaw::AbortOnSigterm) {
        // Flaw: drop everything in flight, leaving claims to expire.
        senders.shutdown().await;
        background.shutdown().await;
        return Ok(());
    }
    let _ = stop_tx.send(true);
    let drain = async {
        while let Some(r) = senders.join_next().await {
            log_join(r);
        }
    };
    let budget = cfg.shutdown_grace.mul_f64(0.8);
    if tokio::time::timeout(budget, drain).await.is_err() {
        tracing::warn!("sends still in flight at the end of the grace period; abandoning them");
        senders.shutdown().await;
    }
    background.shutdown().await;
    let _ = sqlx::query("UPDATE workers SET stopped_at = now() WHERE id = $1")
        .bind(&cfg.worker_id)
        .execute(&pool)
        .await;
    pool.close().await;
    tracing::info!(worker = %cfg.worker_id, "worker stopped");
    Ok(())
}

async fn claim_some(w: &Worker, n: i64) -> anyhow::Result<Vec<claim::Claimed>> {
    let mut conn = w.pool.acquire().await.context("acquiring a connection")?;
    let rows = if w.cfg.flaws.has(Flaw::RacyClaim) {
        claim::claim_racy(&mut conn, &w.cfg.worker_id, n, w.cfg.lease).await
    } else {
        claim::claim(&mut conn, &w.cfg.worker_id, n, w.cfg.lease).await
    };
    rows.context("claiming")
}

async fn heartbeat(w: Arc<Worker>) {
    let mut tick = tokio::time::interval(w.cfg.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let started = Instant::now();
        let renewed = async {
            let mut conn = w.pool.acquire().await?;
            let held: Vec<i64> = w
                .held
                .lock()
                .map(|h| h.iter().copied().collect())
                .unwrap_or_default();
            claim::renew(&mut conn, &w.cfg.worker_id, w.cfg.lease, &held).await
        };
        match renewed.await {
            Ok(_) => {
                if let Ok(mut g) = w.renewed_at.lock() {
                    *g = Some(started);
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
    }
}

fn log_join(r: Result<(), tokio::task::JoinError>) {
    if let Err(e) = r {
        if e.is_panic() {
            tracing::error!(error = %e, "sender panicked");
        }
    }
}

/// The `inline-send` flaw: the API request itself sends everything that is ready before it
/// answers, so a slow provider makes enqueueing slow. Never used unless the flaw is on.
pub async fn send_inline(cfg: Arc<Config>, pool: PgPool) -> anyhow::Result<()> {
    let (_keep, stopping) = watch::channel(false);
    let w = Arc::new(Worker {
        providers: Providers::new(&cfg)?,
        slots: Arc::new(Semaphore::new(cfg.concurrency)),
        channel_slots: Channel::ALL
            .into_iter()
            .map(|c| (c, Arc::new(Semaphore::new(cfg.channel_concurrency))))
            .collect(),
        stopping,
        renewed_at: Mutex::new(None),
        held: Mutex::default(),
        pool,
        cfg: cfg.clone(),
    });
    loop {
        let rows = claim_some(&w, 50).await?;
        if rows.is_empty() {
            return Ok(());
        }
        // As a naive handler would: every provider call at once, and answer when all are done.
        let now = Instant::now();
        let mut sends = JoinSet::new();
        for d in rows {
            sends.spawn(send::send_one(w.clone(), d, now));
        }
        while let Some(r) = sends.join_next().await {
            log_join(r);
        }
    }
}
