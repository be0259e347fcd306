//! The worker process: claim loop, sender pool, heartbeat, rescuer, graceful shutdown.
//!
//! Every task the worker starts lives in a `JoinSet` owned by [`run`], so dropping (or aborting)
//! the `run` future stops everything at once, as a SIGKILL would: nothing here relies on
//! cleanup code for correctness. When `shutdown` fires the loop stops claiming, unstarted
//! claims are released at once, in-flight sends finish, and `run` returns `Ok` within the grace
//! period. This module must never hold a database transaction across a provider call.

mod decide;
mod reconcile;
mod send;

pub use decide::{decide, first_poll, payload_to_send, Decision};

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
    /// Per held claim, when the last renewal that extended *its* lease started: its lease
    /// runs at least `lease` from then. Per claim, because a renewal never revives an expired
    /// lease: a worker-wide "last renewed" let a row whose lease had lapsed look alive.
    pub renewed_at: Mutex<Renewals>,
    /// Claims a live sender task is working on: the only leases the heartbeat renews.
    pub held: Mutex<std::collections::HashSet<ClaimId>>,
}

/// One claim of one row: (delivery id, lease token). A row rescued and claimed again by the
/// same worker is a new claim; the old task's bookkeeping never touches the new one's.
pub(crate) type ClaimId = (i64, i64);

impl Worker {
    /// The shared state of one worker process, nothing held yet.
    fn new(
        cfg: Arc<Config>,
        pool: PgPool,
        stopping: watch::Receiver<bool>,
    ) -> anyhow::Result<Worker> {
        Ok(Worker {
            providers: Providers::new(&cfg)?,
            slots: Arc::new(Semaphore::new(cfg.concurrency)),
            channel_slots: Channel::ALL
                .into_iter()
                .map(|c| (c, Arc::new(Semaphore::new(cfg.channel_limit(c)))))
                .collect(),
            stopping,
            renewed_at: Mutex::default(),
            held: Mutex::default(),
            pool,
            cfg,
        })
    }

    /// The local view of when `claim`, taken at `claimed_at`, expires.
    pub fn local_deadline(&self, claim: ClaimId, claimed_at: Instant) -> Instant {
        match self.renewed_at.lock() {
            Ok(r) => r.deadline(claim, claimed_at, self.cfg.lease),
            Err(_) => claimed_at + self.cfg.lease,
        }
    }

    /// Time that must be left on a lease to start a send.
    pub fn margin(&self) -> Duration {
        self.cfg.lease / 5
    }
}

/// When each held claim's lease was last extended: the start of the renewal that extended it.
/// A claim whose lease a renewal skipped (it had expired: the rescuer's now) keeps its older
/// time, so its local deadline passes and its sender does not send.
#[derive(Debug, Default)]
pub(crate) struct Renewals(HashMap<ClaimId, Instant>);

impl Renewals {
    /// When `claim`, taken at `claimed_at` (before the claim statement was sent), expires at the
    /// latest.
    pub fn deadline(&self, claim: ClaimId, claimed_at: Instant, lease: Duration) -> Instant {
        self.0
            .get(&claim)
            .map_or(claimed_at, |r| (*r).max(claimed_at))
            + lease
    }

    /// Records a renewal that started at `started` and extended the leases of `renewed`; forgets
    /// claims no longer `held`.
    pub fn record(
        &mut self,
        renewed: &[ClaimId],
        started: Instant,
        held: &std::collections::HashSet<ClaimId>,
    ) {
        self.0.retain(|c, _| held.contains(c));
        for c in renewed.iter().filter(|c| held.contains(c)) {
            self.0.insert(*c, started);
        }
    }

    pub fn forget(&mut self, claim: ClaimId) {
        self.0.remove(&claim);
    }
}

/// Runs a worker until `shutdown` fires and the drain is done.
///
/// `shutdown` is polled before anything else (the binaries' shutdown futures install their
/// SIGTERM handler on first poll), so a SIGTERM during start-up — connecting to the database,
/// registering — ends the worker with `Ok` at once. Once it fires, everything left (the drain,
/// the final bookkeeping) is bounded by `TING_SHUTDOWN_GRACE_MS` from that moment, whether or not
/// the database answers.
pub async fn run(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let mut shutdown = Box::pin(shutdown);
    if futures::poll!(&mut shutdown).is_ready() {
        return Ok(());
    }
    // From here on the signal is a flag any select can wait on, as often as it likes.
    let (term_tx, term) = watch::channel(false);
    let watcher = tokio::spawn(async move {
        shutdown.await;
        let _ = term_tx.send(true);
    });
    let _stop_watching = AbortOnDrop(watcher);
    let terminated = || {
        let mut term = term.clone();
        async move {
            let _ = term.wait_for(|t| *t).await;
        }
    };

    let cfg = Arc::new(cfg);
    let (stop_tx, stop_rx) = watch::channel(false);
    let started = tokio::select! {
        biased;
        _ = terminated() => None,
        w = start(cfg.clone(), stop_rx.clone()) => Some(w?),
    };
    let Some(w) = started else {
        tracing::info!(worker = %cfg.worker_id, "shutdown during start-up: nothing claimed, exiting");
        return Ok(());
    };
    let pool = w.pool.clone();

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
    let capacity = cfg.concurrency + cfg.claim_batch as usize;
    let stop_at = loop {
        while let Some(r) = senders.try_join_next() {
            log_join(r);
        }
        let room = capacity.saturating_sub(senders.len());
        let mut full = false;
        let mut stopped = None;
        if room > 0 {
            let n = room.min(cfg.claim_batch as usize) as i64;
            // Before the statement is sent: the database starts the lease no earlier, so the
            // local deadline can only err on the early side.
            let now = Instant::now();
            let claimed = claim_some(&w, n);
            tokio::pin!(claimed);
            let rows = tokio::select! {
                biased;
                r = &mut claimed => r,
                _ = terminated() => {
                    // Senders waiting for a slot give their rows back from this moment on.
                    stopped = Some(Instant::now());
                    let _ = stop_tx.send(true);
                    tracing::info!(worker = %cfg.worker_id, "SIGTERM during a claim: its rows go back");
                    // A claim already sent may have taken rows: wait for it a little (a quarter
                    // of the grace period), so they are given back at once, not left to expire.
                    tokio::time::timeout(cfg.shutdown_grace / 4, claimed)
                        .await
                        .unwrap_or_else(|_| Ok(Vec::new()))
                }
            };
            match rows {
                Ok(rows) if stopped.is_some() => {
                    // Claimed as the signal arrived: never started, so straight back.
                    for d in rows {
                        senders.spawn(send::give_back_unsent(
                            w.clone(),
                            d,
                            "released on shutdown before start",
                        ));
                    }
                }
                Ok(rows) => {
                    full = rows.len() as i64 == n;
                    for d in rows {
                        // A row rescued from under a task of ours that is still alive (stalled
                        // in a lookup, say) is not taken twice by one process: back it goes.
                        let busy = w
                            .held
                            .lock()
                            .map(|mut held| {
                                let busy = held.iter().any(|(id, _)| *id == d.id);
                                if !busy {
                                    held.insert((d.id, d.lease_token));
                                }
                                busy
                            })
                            .unwrap_or(false);
                        if busy {
                            senders.spawn(send::give_back_unsent(
                                w.clone(),
                                d,
                                "released: an older claim of ours is still at work",
                            ));
                        } else {
                            senders.spawn(send::send_one(w.clone(), d, now));
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "claim failed"),
            }
        }
        if let Some(at) = stopped {
            break at;
        }
        tokio::select! {
            biased;
            _ = terminated() => {
                let _ = stop_tx.send(true);
                break Instant::now();
            }
            Some(r) = senders.join_next(), if !senders.is_empty() && !full => log_join(r),
            _ = tokio::time::sleep(cfg.poll_interval), if !full => {}
            _ = std::future::ready(()), if full => {}
        }
    };

    tracing::info!(worker = %cfg.worker_id, in_flight = senders.len(), "shutdown: draining");
    if cfg.flaws.has(Flaw::AbortOnSigterm) {
        // Flaw: drop everything in flight, leaving claims to expire.
        senders.shutdown().await;
        background.shutdown().await;
        return Ok(());
    }
    let drain = async {
        while let Some(r) = senders.join_next().await {
            log_join(r);
        }
    };
    // Sends in flight get 80% of the grace period (counted from the signal); the bookkeeping
    // after them must be done by 90%, answered or not (the database may be unreachable).
    let grace = cfg.shutdown_grace;
    let drain_until = tokio::time::Instant::from_std(stop_at + grace.mul_f64(0.8));
    let done_by = tokio::time::Instant::from_std(stop_at + grace.mul_f64(0.9));
    if tokio::time::timeout_at(drain_until, drain).await.is_err() {
        tracing::warn!("sends still in flight at the end of the grace period; abandoning them");
        senders.shutdown().await;
    }
    background.shutdown().await;
    let stopped = sqlx::query("UPDATE workers SET stopped_at = now() WHERE id = $1")
        .bind(&cfg.worker_id)
        .execute(&pool);
    if tokio::time::timeout_at(done_by, stopped).await.is_err() {
        tracing::warn!("could not record the stop in time (database unreachable?)");
    }
    if tokio::time::timeout_at(done_by, pool.close())
        .await
        .is_err()
    {
        tracing::warn!("database connections not closed in time");
    }
    tracing::info!(worker = %cfg.worker_id, "worker stopped");
    Ok(())
}

/// Aborts a helper task when the owner goes away (also when `run` is itself aborted).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Start-up: connect, register, build the shared state (and the `restart-from-first` flaw).
async fn start(cfg: Arc<Config>, stopping: watch::Receiver<bool>) -> anyhow::Result<Arc<Worker>> {
    let max = (cfg.concurrency as u32).min(12) + 3;
    let pool = crate::worker_pool(&cfg.database_url, max, cfg.lease).await?;
    sqlx::query(
        "INSERT INTO workers (id, pid) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE \
         SET pid = $2, started_at = now(), heartbeat_at = now(), stopped_at = NULL",
    )
    .bind(&cfg.worker_id)
    .bind(std::process::id() as i32)
    .execute(&pool)
    .await
    .context("registering the worker")?;
    let w = Arc::new(Worker::new(cfg.clone(), pool.clone(), stopping)?);
    tracing::info!(worker = %cfg.worker_id, flaws = ?cfg.flaws, "worker started");
    if cfg.flaws.has(Flaw::RestartFromFirst) {
        restart_from_first(&pool).await?;
    }
    Ok(w)
}

/// Flaw: treat the batch as the unit of work: any unfinished batch starts again from its first
/// recipient, delivered ones included (bypassing the state machine on purpose). Its one statement
/// locks rows in table order while other workers renew and end theirs in another order, so
/// PostgreSQL may end it as a deadlock (40P01): it tries again, up to five times (a flaw that
/// crashed its worker instead would not show itself).
async fn restart_from_first(pool: &PgPool) -> anyhow::Result<()> {
    const TRIES: usize = 5;
    let mut tried = 1;
    loop {
        let r = sqlx::query(
            "UPDATE delivery_state s SET state = 'pending', next_attempt_at = now(), \
             lease_owner = NULL, lease_expires_at = NULL FROM delivery_items i \
             WHERE i.id = s.id AND i.batch_id IN (SELECT batch_id FROM deliveries \
             WHERE state IN ('pending', 'sending', 'retryable'))",
        )
        .execute(pool)
        .await;
        match r {
            Err(sqlx::Error::Database(e))
                if e.code().as_deref() == Some("40P01") && tried < TRIES =>
            {
                tracing::warn!(tried, "restart-from-first: deadlock; trying again");
                tried += 1;
            }
            r => return r.map(|_| ()).context("restart-from-first"),
        }
    }
}

async fn claim_some(w: &Worker, n: i64) -> anyhow::Result<Vec<claim::Claimed>> {
    let mut conn = w.pool.acquire().await.context("acquiring a connection")?;
    let rows = if w.cfg.flaws.has(Flaw::RacyClaim) {
        claim::claim_racy(&mut conn, &w.cfg.worker_id, n, w.cfg.lease).await
    } else if w.cfg.flaws.has(Flaw::FifoByBatch) {
        // Flaw: due order alone; a small order waits for every campaign enqueued before it.
        claim::claim_fifo(&mut conn, &w.cfg.worker_id, n, w.cfg.lease).await
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
            let held: Vec<ClaimId> = if w.cfg.flaws.has(Flaw::NoHeartbeat) {
                // Flaw: the worker is stamped alive but no lease is renewed, so a send that
                // outlasts one lease is rescued (and resent) while it is still in flight.
                Vec::new()
            } else {
                w.held
                    .lock()
                    .map(|h| h.iter().copied().collect())
                    .unwrap_or_default()
            };
            claim::renew(&mut conn, &w.cfg.worker_id, w.cfg.lease, &held).await
        };
        match renewed.await {
            Ok(ids) => {
                let held = w.held.lock().map(|h| h.clone()).unwrap_or_default();
                if let Ok(mut r) = w.renewed_at.lock() {
                    r.record(&ids, started, &held);
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
    let w = Arc::new(Worker::new(cfg.clone(), pool, stopping)?);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal that skipped a delivery (its lease had expired) must not move that delivery's
    /// deadline: the worker-wide "last renewed" this replaced let a sender whose start had waited
    /// out its lease behind a lock go ahead, and the e-mail went out twice (db-outage, seed 2).
    #[test]
    fn a_renewal_only_extends_the_leases_it_renewed() {
        let lease = Duration::from_secs(1);
        let t0 = Instant::now();
        let (c1, c2) = ((1, 1), (2, 1));
        let held: std::collections::HashSet<ClaimId> = [c1, c2].into_iter().collect();
        let mut r = Renewals::default();
        assert_eq!(
            r.deadline(c1, t0, lease),
            t0 + lease,
            "claimed, never renewed"
        );
        let later = t0 + Duration::from_millis(1_500);
        r.record(&[c2], later, &held);
        assert_eq!(
            r.deadline(c1, t0, lease),
            t0 + lease,
            "1 was skipped: lapsed"
        );
        assert_eq!(r.deadline(c2, t0, lease), later + lease);
        // A claim newer than the renewal counts from the claim.
        let fresh = later + Duration::from_millis(10);
        assert_eq!(r.deadline(c2, fresh, lease), fresh + lease);
        // Claims no longer held are forgotten.
        let only_1: std::collections::HashSet<ClaimId> = [c1].into_iter().collect();
        r.record(&[], later, &only_1);
        assert_eq!(r.deadline(c2, t0, lease), t0 + lease);
        r.record(&[c1], later, &only_1);
        r.forget(c1);
        assert_eq!(r.deadline(c1, t0, lease), t0 + lease);
    }

    /// Issue 14, item 1: row 1 claimed under token 1 by a task that stalls; the row is rescued and
    /// this worker claims it again under token 2. Keyed by delivery id, the old task's exit
    /// dropped the new claim's renewal, and the new claim's renewal moved the old task's deadline
    /// forward, so its last check could pass on a lease it had lost. Keyed by claim, neither.
    #[test]
    fn a_row_claimed_again_is_a_new_claim_for_renewals() {
        let lease = Duration::from_secs(1);
        let t0 = Instant::now();
        let (old, new) = ((1, 1), (1, 2));
        let both: std::collections::HashSet<ClaimId> = [old, new].into_iter().collect();
        let mut r = Renewals::default();
        let renewal = t0 + Duration::from_millis(2_000);
        r.record(&[new], renewal, &both);
        assert_eq!(
            r.deadline(old, t0, lease),
            t0 + lease,
            "the lost claim stays lost"
        );
        assert_eq!(r.deadline(new, t0, lease), renewal + lease);
        r.forget(old);
        assert_eq!(
            r.deadline(new, t0, lease),
            renewal + lease,
            "the old task's exit leaves the new claim's renewal alone"
        );
    }
}
