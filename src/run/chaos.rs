//! The chaos schedule: triggers (elapsed time, progress, the Nth accepted send) and actions
//! (signals to workers, restarts, database outages). Every action lands on the timeline with its
//! time and pid.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mock_providers::ledger::LedgerEntry;
use nix::sys::signal::Signal;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use sqlx::Connection;

use super::world::World;
use crate::scenario::{ChaosAction, ChaosStep, Target, Trigger};

/// What the database actions need.
pub struct DbHandle {
    pub url: String,
    pub admin_url: String,
    pub database: Arc<tokio::sync::Mutex<Option<throwaway_pg::Database>>>,
}

pub struct Chaos {
    world: Arc<World>,
    steps: Vec<ChaosStep>,
    fired: Vec<AtomicBool>,
    /// ledger seq of the triggering accept → step index (`on_accept`).
    armed: Mutex<HashMap<u64, usize>>,
    rng: Mutex<rand_chacha::ChaCha8Rng>,
    db: DbHandle,
    /// Deliveries the providers can accept (progress denominator).
    acceptable: u64,
    /// Trigger tasks (time, progress), aborted when the run settles.
    triggers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Tasks started by actions (stop-then-continue, delayed restarts, held transactions).
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Chaos {
    pub fn new(world: Arc<World>, db: DbHandle, acceptable: u64) -> Arc<Chaos> {
        let steps = world.scenario.chaos.clone();
        let seed = world.scenario.seed;
        Arc::new(Chaos {
            fired: steps.iter().map(|_| AtomicBool::new(false)).collect(),
            steps,
            world,
            armed: Mutex::default(),
            rng: Mutex::new(rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0xC4A0_5EED)),
            db,
            acceptable: acceptable.max(1),
            triggers: Mutex::default(),
            tasks: Mutex::default(),
        })
    }

    /// Called for the `n`th accepted send on `e.provider`: arms matching `on_accept` steps.
    pub fn note_accept(&self, e: &LedgerEntry, n: u64) {
        for (i, s) in self.steps.iter().enumerate() {
            if let Trigger::OnAccept { channel, nth } = s.trigger {
                if channel.provider() == e.provider && nth as u64 == n {
                    self.armed.lock().unwrap().insert(e.seq, i);
                }
            }
        }
    }

    /// Runs the armed step for this accepted send, before the provider answers the sender.
    pub async fn fire_on_accept(&self, e: &LedgerEntry) {
        let step = self.armed.lock().unwrap().remove(&e.seq);
        if let Some(i) = step {
            let sender = self.world.sender_of(e.seq, e.peer);
            let why = format!(
                "on_accept: {} #{} to {}",
                e.provider.as_str(),
                e.seq,
                e.recipient
            );
            self.execute(i, sender, &why).await;
        }
    }

    /// Starts the time and progress triggers; `load_start` is when enqueueing began.
    pub fn start(self: &Arc<Self>, load_start: Instant) {
        for (i, s) in self.steps.iter().enumerate() {
            let me = self.clone();
            let trigger = s.trigger.clone();
            let task = tokio::spawn(async move {
                match trigger {
                    Trigger::At(d) => {
                        tokio::time::sleep_until((load_start + d).into()).await;
                        me.execute(i, None, &format!("at {}", humantime::format_duration(d)))
                            .await;
                    }
                    Trigger::Progress(p) => {
                        let goal = (p * me.acceptable as f64).ceil() as u64;
                        loop {
                            let notified = me.world.progress.notified();
                            if me.world.accepted_total() >= goal {
                                break;
                            }
                            let _ =
                                tokio::time::timeout(Duration::from_millis(100), notified).await;
                        }
                        let why = format!("progress {:.0}% ({goal} accepted)", p * 100.0);
                        me.execute(i, None, &why).await;
                    }
                    Trigger::OnAccept { .. } => {}
                }
            });
            self.triggers.lock().unwrap().push(task);
        }
    }

    /// True while an action is still under way (a stopped worker not yet continued, a restart
    /// not yet done, a transaction still held): the run cannot be quiescent before it ends.
    pub fn busy(&self) -> bool {
        self.tasks.lock().unwrap().iter().any(|t| !t.is_finished())
    }

    /// Aborts triggers that have not fired and actions still running.
    pub fn stop(&self) {
        for t in self.triggers.lock().unwrap().drain(..) {
            t.abort();
        }
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    /// Steps that never fired (reported; a schedule that did not happen proves nothing).
    pub fn unfired(&self) -> Vec<usize> {
        (0..self.steps.len())
            .filter(|i| !self.fired[*i].load(Ordering::SeqCst))
            .collect()
    }

    fn targets(&self, target: &Target, sender: Option<u32>) -> Vec<(u32, u32)> {
        let live = self.world.live_workers();
        match target {
            Target::Worker(slot) => live.into_iter().filter(|(s, _)| s == slot).collect(),
            Target::All => live,
            Target::Busiest => self.world.busiest().into_iter().collect(),
            Target::Random => live
                .choose(&mut *self.rng.lock().unwrap())
                .copied()
                .into_iter()
                .collect(),
            Target::Sender => sender
                .and_then(|pid| self.world.slot_of(pid).map(|s| (s, pid)))
                .into_iter()
                .collect(),
        }
    }

    async fn execute(&self, i: usize, sender: Option<u32>, why: &str) {
        if self.fired[i].swap(true, Ordering::SeqCst) {
            return;
        }
        let step = self.steps[i].clone();
        let w = &self.world;
        match step.action {
            ChaosAction::DbRestart => {
                w.event("db_restart", None, None, why);
                let mut db = self.db.database.lock().await;
                match db.as_mut().and_then(|d| d.cluster_mut()) {
                    Some(c) => match c.restart().await {
                        Ok(()) => w.event("db_restarted", None, c.postmaster_pid(), ""),
                        Err(e) => w.event("db_restart_failed", None, None, e.to_string()),
                    },
                    None => w.event(
                        "db_restart_skipped",
                        None,
                        None,
                        "not a throwaway cluster (DATABASE_URL given)",
                    ),
                }
                return;
            }
            ChaosAction::DbTerminate => {
                let n = terminate_backends(&self.db.admin_url, &self.db.url).await;
                w.event(
                    "db_terminate",
                    None,
                    None,
                    format!("{why}; {}", n.unwrap_or_else(|e| e)),
                );
                return;
            }
            ChaosAction::DbIdleTx => {
                let url = self.db.url.clone();
                let hold = step.duration.unwrap_or_default();
                w.event(
                    "db_idle_tx",
                    None,
                    None,
                    format!("{why}; holding for {}", humantime::format_duration(hold)),
                );
                let world = w.clone();
                self.tasks.lock().unwrap().push(tokio::spawn(async move {
                    let detail = idle_in_transaction(&url, hold).await.unwrap_or_else(|e| e);
                    world.event("db_idle_tx_end", None, None, detail);
                }));
                return;
            }
            _ => {}
        }
        let targets = self.targets(&step.target, sender);
        if targets.is_empty() {
            w.event(
                "chaos_no_target",
                None,
                None,
                format!("{why}: no live worker matches {:?}", step.target),
            );
            return;
        }
        for (slot, pid) in targets {
            self.act_on_worker(&step, slot, pid, why).await;
        }
    }

    async fn act_on_worker(&self, step: &ChaosStep, slot: u32, pid: u32, why: &str) {
        let w = self.world.clone();
        let sup = w.supervisor.clone();
        let grace = w.scenario.stack.shutdown_grace;
        match step.action {
            ChaosAction::Sigkill => {
                let _ = sup.signal(pid, Signal::SIGKILL);
                w.event("sigkill", Some(slot), Some(pid), why);
                // Inside an on_accept window the provider must not answer before the sender is dead.
                sup.wait_exit(pid, Duration::from_secs(2)).await;
            }
            ChaosAction::Sigterm | ChaosAction::Restart => {
                w.event(
                    if step.action == ChaosAction::Restart {
                        "restart_begin"
                    } else {
                        "sigterm"
                    },
                    Some(slot),
                    Some(pid),
                    why,
                );
                let _ = sup.signal(pid, Signal::SIGTERM);
                let restart_now = step.action == ChaosAction::Restart;
                let restart_after = step.restart_after.or(restart_now.then_some(Duration::ZERO));
                let world = w.clone();
                self.tasks.lock().unwrap().push(tokio::spawn(async move {
                    if !world.supervisor.wait_exit(pid, grace).await {
                        world.event(
                            "grace_exceeded",
                            Some(slot),
                            Some(pid),
                            format!(
                                "still running {} after SIGTERM; SIGKILL",
                                humantime::format_duration(grace)
                            ),
                        );
                        world.supervisor.terminate(pid, Duration::ZERO).await;
                    } else {
                        let rec = world.supervisor.record(pid);
                        world.event(
                            "exit",
                            Some(slot),
                            Some(pid),
                            format!("{:?}", rec.map(|r| (r.exit_code, r.signal))),
                        );
                    }
                    if let Some(d) = restart_after {
                        tokio::time::sleep(d).await;
                        if let Err(e) = world.start_worker(slot).await {
                            world.event("restart_failed", Some(slot), None, e.to_string());
                        }
                    }
                }));
                return;
            }
            ChaosAction::Sigstop => {
                let _ = sup.signal(pid, Signal::SIGSTOP);
                w.event("sigstop", Some(slot), Some(pid), why);
                let d = step.duration.unwrap_or_default();
                let world = w.clone();
                self.tasks.lock().unwrap().push(tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    let _ = world.supervisor.signal(pid, Signal::SIGCONT);
                    world.event(
                        "sigcont",
                        Some(slot),
                        Some(pid),
                        format!("after {}", humantime::format_duration(d)),
                    );
                }));
                return;
            }
            _ => unreachable!("database actions return earlier"),
        }
        if let Some(d) = step.restart_after {
            let world = w.clone();
            self.tasks.lock().unwrap().push(tokio::spawn(async move {
                tokio::time::sleep(d).await;
                if let Err(e) = world.start_worker(slot).await {
                    world.event("restart_failed", Some(slot), None, e.to_string());
                }
            }));
        }
    }
}

/// `pg_terminate_backend` of every session on the stack's database.
async fn terminate_backends(admin_url: &str, db_url: &str) -> Result<String, String> {
    let db = db_url
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .split('?')
        .next()
        .unwrap_or_default()
        .to_string();
    let mut conn = sqlx::PgConnection::connect(admin_url)
        .await
        .map_err(|e| e.to_string())?;
    let n: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(&db)
    .fetch_one(&mut conn)
    .await
    .map_err(|e| e.to_string())?;
    Ok(format!("terminated {n} sessions"))
}

/// Opens a transaction that locks a few rows of every table of the stack, and sits idle in it.
async fn idle_in_transaction(url: &str, hold: Duration) -> Result<String, String> {
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT quote_ident(table_schema) || '.' || quote_ident(table_name) FROM information_schema.tables \
         WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')",
    )
    .fetch_all(&mut conn)
    .await
    .map_err(|e| e.to_string())?;
    let mut tx = conn.begin().await.map_err(|e| e.to_string())?;
    let mut locked = 0;
    for t in &tables {
        let q = format!("SELECT 1 FROM {t} LIMIT 50 FOR UPDATE SKIP LOCKED");
        if let Ok(rows) = sqlx::query(&q).fetch_all(&mut *tx).await {
            locked += rows.len();
        }
    }
    tokio::time::sleep(hold).await;
    tx.rollback().await.map_err(|e| e.to_string())?;
    Ok(format!(
        "held {locked} row locks on {} tables",
        tables.len()
    ))
}
