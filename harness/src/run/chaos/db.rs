//! The database chaos actions and the observation that each took effect: `db_restart` (the
//! throwaway cluster restarted under a new postmaster and accepted connections again),
//! `db_terminate` (sessions of the stack's database terminated: counted, 0 is no target) and
//! `db_idle_tx` (an idle transaction holding at least one row lock).
//!
//! One database action at a time: each holds the database handle's lock while it acts (steps
//! whose triggers fire together would otherwise run into each other — a termination while the
//! cluster restarts fails to connect).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::Connection;

use super::{Chaos, OBSERVE_WITHIN};
use crate::check::EventKind;
use crate::report::chaos_steps::ChaosOutcome;
use crate::scenario::ChaosStep;

/// What the database actions need.
pub struct DbHandle {
    pub url: String,
    pub admin_url: String,
    pub database: Arc<tokio::sync::Mutex<Option<throwaway_pg::Database>>>,
}

/// Restarts the throwaway cluster; applied once a new postmaster accepts a connection.
pub(super) async fn restart(chaos: &Arc<Chaos>, i: usize, why: &str) {
    let w = &chaos.world;
    let mut guard = chaos.db.database.lock().await;
    w.event(EventKind::DbRestart, None, None, why);
    let Some(cluster) = guard.as_mut().and_then(|d| d.cluster_mut()) else {
        // `run` refuses db_restart with a server database before starting; kept for safety.
        let reason = "not a throwaway cluster (the run's database is on a server)";
        w.event(EventKind::DbRestartSkipped, None, None, reason);
        chaos.log(i).decide(ChaosOutcome::Skipped, reason);
        return;
    };
    chaos.log(i).owe();
    let before = cluster.postmaster_pid();
    if let Err(e) = cluster.restart().await {
        w.event(EventKind::DbRestartFailed, None, None, e.to_string());
        chaos
            .log(i)
            .observe(false, format!("the cluster did not restart: {e}"));
        return;
    }
    let after = cluster.postmaster_pid();
    drop(guard);
    w.event(EventKind::DbRestarted, None, after, "");
    let since = Instant::now();
    let seen = match accepts_connections(&chaos.db.url, OBSERVE_WITHIN).await {
        Ok(()) if after.is_some() && after != before => (
            true,
            format!(
                "postmaster pid {} → {}; accepted a connection {} ms later",
                pid_str(before),
                pid_str(after),
                since.elapsed().as_millis()
            ),
        ),
        Ok(()) => (
            false,
            format!(
                "the postmaster did not change (pid {} → {})",
                pid_str(before),
                pid_str(after)
            ),
        ),
        Err(e) => (
            false,
            format!(
                "restarted (postmaster pid {}) but accepted no connection within {}: {e}",
                pid_str(after),
                humantime::format_duration(OBSERVE_WITHIN)
            ),
        ),
    };
    chaos.log(i).observe(seen.0, seen.1);
}

/// Terminates every session of the stack's database; applied when at least one was.
pub(super) async fn terminate(chaos: &Arc<Chaos>, i: usize, why: &str) {
    let one_at_a_time = chaos.db.database.lock().await;
    let n = terminate_backends(&chaos.db.admin_url, &chaos.db.url).await;
    drop(one_at_a_time);
    // Only a termination that ended sessions is a `db_terminate` on the timeline: checkers take
    // that event as having cut every process off its database.
    let (kind, detail) = match &n {
        Ok(0) => (
            EventKind::DbTerminateNoTarget,
            "no session to terminate".to_string(),
        ),
        Ok(n) => (EventKind::DbTerminate, format!("terminated {n} sessions")),
        Err(e) => (EventKind::DbTerminateFailed, e.clone()),
    };
    chaos
        .world
        .event(kind, None, None, format!("{why}; {detail}"));
    let mut log = chaos.log(i);
    match n {
        Ok(0) => log.decide(
            ChaosOutcome::NoTarget,
            format!("{why}: no session of the stack's database was open"),
        ),
        Ok(n) => {
            log.owe();
            log.count(n as u64);
            log.observe(
                true,
                format!("terminated {n} sessions of the stack's database"),
            );
        }
        Err(e) => log.decide(ChaosOutcome::Failed, format!("{why}: {e}")),
    }
}

/// Holds an idle transaction with row locks for the step's `for`; applied when it locked a row.
pub(super) fn idle_tx(chaos: &Arc<Chaos>, i: usize, step: &ChaosStep, why: &str) {
    let hold = step.duration.unwrap_or_default();
    chaos.log(i).owe();
    let me = chaos.clone();
    let why = why.to_string();
    chaos.keep(tokio::spawn(async move {
        let _one_at_a_time = me.db.database.lock().await;
        me.world.event(
            EventKind::DbIdleTx,
            None,
            None,
            format!("{why}; holding for {}", humantime::format_duration(hold)),
        );
        let mut took_locks = false;
        let locked = |rows: usize, tables: usize| {
            took_locks = true;
            let mut log = me.log(i);
            if rows == 0 {
                log.decide(
                    ChaosOutcome::NoTarget,
                    format!("{why}: no row of the stack's {tables} tables to lock"),
                );
            } else {
                log.count(rows as u64);
                log.observe(
                    true,
                    format!(
                        "an idle transaction held {rows} row locks on {tables} tables for {}",
                        humantime::format_duration(hold)
                    ),
                );
            }
        };
        let detail = match idle_in_transaction(&me.db.url, hold, locked).await {
            Ok(d) => d,
            // Once the locks were held the step took effect; a session ended meanwhile (another
            // step terminated it) only shortens the hold.
            Err(e) if took_locks => e,
            Err(e) => {
                me.log(i)
                    .observe(false, format!("the idle transaction failed: {e}"));
                e
            }
        };
        me.world.event(EventKind::DbIdleTxEnd, None, None, detail);
    }));
}

fn pid_str(pid: Option<u32>) -> String {
    pid.map_or_else(|| "none".into(), |p| p.to_string())
}

/// Connects and runs `SELECT 1` until it works or `within` has passed.
async fn accepts_connections(url: &str, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        let tried = async {
            let mut c = sqlx::PgConnection::connect(url).await?;
            sqlx::query("SELECT 1").execute(&mut c).await?;
            c.close().await
        };
        match tried.await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e.to_string()),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// `pg_terminate_backend` of every session on the stack's database; how many were terminated.
async fn terminate_backends(admin_url: &str, db_url: &str) -> Result<i64, String> {
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
    sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(&db)
    .fetch_one(&mut conn)
    .await
    .map_err(|e| e.to_string())
}

/// Opens a transaction that locks a few rows of every table of the stack, tells `locked` how
/// many rows on how many tables, and sits idle in it for `hold`.
async fn idle_in_transaction(
    url: &str,
    hold: Duration,
    locked: impl FnOnce(usize, usize),
) -> Result<String, String> {
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
    let mut rows = 0;
    for t in &tables {
        let q = format!("SELECT 1 FROM {t} LIMIT 50 FOR UPDATE SKIP LOCKED");
        if let Ok(r) = sqlx::query(&q).fetch_all(&mut *tx).await {
            rows += r.len();
        }
    }
    locked(rows, tables.len());
    tokio::time::sleep(hold).await;
    tx.rollback().await.map_err(|e| e.to_string())?;
    Ok(format!("held {rows} row locks on {} tables", tables.len()))
}
