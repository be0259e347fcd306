//! One delivery attempt: wait for a channel slot, record the attempt start under the lease,
//! check the local lease deadline, look before resending an uncertain SMS ([`super::reconcile`]),
//! send the stored payload, record the outcome [`super::decide`] chose. This module must never
//! re-render a payload and never send without a recorded, fenced start.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use chrono::Utc;

use super::decide::{decide, exhausted_before_send, payload_to_send};
use super::reconcile::{reconcile_first, Reconciled};
use super::Worker;
use crate::channels::class;
use crate::claim::{self, Claimed};
use crate::config::Flaw;
use crate::state::{self, Fence, Source, State, Transition, Updates};

/// Runs one claimed delivery to its recorded outcome (or gives it back).
pub(crate) async fn send_one(w: Arc<Worker>, d: Claimed, claimed_at: Instant) {
    if let Err(e) = attempt(&w, &d, claimed_at).await {
        // Typically the database went away mid-attempt. The row keeps our lease until it lapses
        // (it is no longer renewed), then the rescuer reconciles it like a crash.
        tracing::warn!(key = %d.key, error = %format!("{e:#}"), "attempt failed to complete");
    }
    if let Ok(mut held) = w.held.lock() {
        held.remove(&(d.id, d.lease_token));
    }
    if let Ok(mut renewed) = w.renewed_at.lock() {
        renewed.forget((d.id, d.lease_token));
    }
}

async fn attempt(w: &Worker, d: &Claimed, claimed_at: Instant) -> anyhow::Result<()> {
    let mut stopping = w.stopping.clone();
    // The channel's slot first, then the worker's: a send waiting for a busy channel never
    // holds one of the worker's slots.
    let slot = w.channel_slots[&d.channel].clone();
    let all = w.slots.clone();
    let slots = async move {
        let c = slot.acquire_owned().await?;
        let g = all.acquire_owned().await?;
        Ok::<_, tokio::sync::AcquireError>((c, g))
    };
    let permit = tokio::select! {
        p = slots => p.context("send slots closed")?,
        _ = async { let _ = stopping.wait_for(|s| *s).await; } => return give_back(w, d, "released on shutdown before start").await,
    };
    let stop_now = *w.stopping.borrow();
    if stop_now {
        return give_back(w, d, "released on shutdown before start").await;
    }
    let zombie = w.cfg.flaws.has(Flaw::ZombieSend);
    // Flaw `no-lease-deadline`: a database that stops answering is taken to mean the claim holds.
    let trusting = w.cfg.flaws.has(Flaw::NoLeaseDeadline);
    // Whether the local lease deadline is too close to act under the lease (never, with either
    // flaw).
    let too_late = || {
        !zombie
            && !trusting
            && Instant::now() + w.margin() >= w.local_deadline((d.id, d.lease_token), claimed_at)
    };
    if too_late() {
        return give_back(w, d, "lease too close to expiry to start").await;
    }
    if let Some(why) = exhausted_before_send(&w.cfg, d, Utc::now()) {
        drop(permit);
        return fail_unsent(w, d, &why).await;
    }
    // Connect before the start is recorded: the uncertain window is the exchange alone.
    let ready = w.providers.ready(d).await;
    if too_late() {
        return give_back(w, d, "lease too close to expiry to start").await;
    }
    if *w.stopping.borrow() {
        // SIGTERM arrived while connecting: the attempt has not started, so it is not in flight.
        return give_back(w, d, "released on shutdown before start").await;
    }
    let attempts = if zombie {
        // Flaw: send without proving the lease is still ours.
        d.attempts + 1
    } else if trusting {
        match trusted_start(w, d).await? {
            Some(a) => a,
            None => {
                tracing::info!(key = %d.key, "lease lost before the attempt started; not sending");
                return Ok(());
            }
        }
    } else {
        match claim::start_attempt(&w.pool, d, w.margin()).await? {
            Some(a) => a,
            None => {
                tracing::info!(key = %d.key, "lease lost before the attempt started; not sending");
                return Ok(());
            }
        }
    };
    let reconciled = reconcile_first(w, d).await;
    if matches!(reconciled, Reconciled::Send) && too_late() {
        // The last check before the request: the process stalled since the fence (a SIGSTOP, a
        // long pause), or during the lookup before an SMS resend (a provider round trip), and by
        // now another worker may have taken the row over, looked up, found nothing and sent.
        // Take the start back instead of sending.
        return abandon_start(w, d).await;
    }
    // E-mail: the durable mark that the body is going out (the uncertain window starts there).
    let before_body = async {
        if zombie {
            return true;
        }
        if trusting {
            let marked = tokio::time::timeout(w.margin(), claim::mark_body(&w.pool, d)).await;
            // Flaw: no answer from the database is taken as "still ours".
            return marked.map_or(true, |r| r.unwrap_or(true));
        }
        match claim::mark_body(&w.pool, d).await {
            Ok(ours) => ours,
            Err(e) => {
                tracing::warn!(key = %d.key, error = %e, "could not mark the e-mail body; not sending it");
                false
            }
        }
    };
    let outcome = match (reconciled, ready) {
        (Reconciled::Recorded, _) => return Ok(()),
        (Reconciled::Outcome(o), _) | (Reconciled::Send, Err(o)) => o,
        (Reconciled::Send, Ok(ready)) => match payload_to_send(&w.cfg, d, attempts) {
            Cow::Borrowed(_) => w.providers.send(d, ready, before_body).await,
            Cow::Owned(p) => {
                let mut again = d.clone();
                again.payload = p;
                w.providers.send(&again, ready, before_body).await
            }
        },
    };
    drop(permit);
    let decision = decide(&w.cfg, d, attempts, &outcome, rand::random());
    let t = Transition {
        delivery_id: d.id,
        from: &[State::Sending],
        to: decision.to,
        source: Source::Worker,
        detail: Some(decision.detail),
        fence: Fence::Lease {
            owner: d.lease_owner.clone(),
            token: d.lease_token,
        },
        set: decision.set,
    };
    let mut conn = w.pool.acquire().await?;
    let recorded = state::transition(&mut conn, &t).await?.is_some();
    if !recorded {
        tracing::info!(key = %d.key, to = %t.to, "outcome not recorded: the row moved on (callback or rescue)");
    }
    if recorded && t.to == State::Retryable && w.cfg.flaws.has(Flaw::WholeBatchReplay) {
        replay_whole_batch(&mut conn, d).await?;
    }
    Ok(())
}

/// The `no-lease-deadline` flaw: the fenced start, but a database that does not answer within
/// the margin, or whose connection broke (its link died), is taken to mean the claim still holds:
/// the row is sent anyway, and its local lease deadline is never looked at. The correct worker
/// waits for the fence and checks its deadline, so a cut-off worker sends nothing a rescuer may
/// send again.
async fn trusted_start(w: &Worker, d: &Claimed) -> anyhow::Result<Option<i32>> {
    let margin = w.margin();
    match tokio::time::timeout(margin, claim::start_attempt(&w.pool, d, margin)).await {
        Ok(Ok(a)) => Ok(a),
        Ok(Err(sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut)) | Err(_) => {
            tracing::warn!(key = %d.key, "database not answering; sending under the claim anyway");
            Ok(Some(d.attempts + 1))
        }
        Ok(Err(e)) => Err(e.into()),
    }
}

/// The `whole-batch-replay` flaw: the batch is the unit of retry, so a partial failure puts every
/// delivery of the batch back to `pending`, finished ones included (bypassing the state machine
/// on purpose). Each delivery is replayed at most once, so a run still ends.
async fn replay_whole_batch(conn: &mut sqlx::PgConnection, d: &Claimed) -> anyhow::Result<()> {
    sqlx::query(
        "WITH old AS (SELECT r.id, s.state FROM delivery_items r JOIN delivery_items failed \
         ON failed.id = $1 AND r.batch_id = failed.batch_id AND r.id <> failed.id \
         JOIN delivery_state s ON s.id = r.id \
         WHERE s.state IN ('delivered', 'submitted') \
         AND NOT EXISTS (SELECT 1 FROM delivery_transitions e WHERE e.delivery_id = r.id \
                         AND e.detail = 'whole-batch-replay') FOR UPDATE OF s) \
         UPDATE delivery_state r SET state = 'pending', next_attempt_at = now(), \
         lease_owner = NULL, lease_expires_at = NULL, head_from = old.state, \
         head_source = 'worker', head_detail = 'whole-batch-replay', head_outcome_class = NULL, \
         head_at = clock_timestamp(), head_claimed_by = NULL FROM old WHERE r.id = old.id",
    )
    .bind(d.id)
    .execute(conn)
    .await
    .context("whole-batch-replay")?;
    Ok(())
}

/// Ends a claimed row that must not be attempted again (`why`) as `failed`, without sending.
/// The provider's text of its last attempt stays in `last_error`.
async fn fail_unsent(w: &Worker, d: &Claimed, why: &str) -> anyhow::Result<()> {
    let mut conn = w.pool.acquire().await?;
    let (last,): (Option<String>,) =
        sqlx::query_as("SELECT last_error FROM deliveries WHERE id = $1")
            .bind(d.id)
            .fetch_one(&mut *conn)
            .await?;
    let t = Transition {
        delivery_id: d.id,
        from: &[State::Sending],
        to: State::Failed,
        source: Source::Worker,
        detail: Some(why.to_string()),
        fence: Fence::Lease {
            owner: d.lease_owner.clone(),
            token: d.lease_token,
        },
        set: Updates {
            error: Some((
                class::EXHAUSTED.to_string(),
                last.unwrap_or_else(|| why.to_string()),
            )),
            ..Updates::default()
        },
    };
    if state::transition(&mut conn, &t).await?.is_some() {
        tracing::info!(key = %d.key, why, "failed without sending");
    }
    Ok(())
}

/// Takes back a recorded start whose send was never made and gives the row back, in one
/// transaction (so no rescuer reads it as started-but-unconfirmed in between).
async fn abandon_start(w: &Worker, d: &Claimed) -> anyhow::Result<()> {
    let mut tx = w.pool.begin().await?;
    claim::undo_start(&mut *tx, d).await?;
    claim::release(
        &mut tx,
        d,
        Source::Worker,
        "lease deadline passed before send",
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Gives back a claimed row no sender will touch (claimed as SIGTERM arrived, or again while an
/// older task of this worker still works on it), as its own task.
pub(crate) async fn give_back_unsent(w: Arc<Worker>, d: Claimed, why: &'static str) {
    if let Err(e) = give_back(&w, &d, why).await {
        // The lease lapses on its own and the rescuer takes the row then.
        tracing::warn!(key = %d.key, error = %format!("{e:#}"), "could not give a row back");
    }
}

async fn give_back(w: &Worker, d: &Claimed, why: &str) -> anyhow::Result<()> {
    let mut conn = w.pool.acquire().await?;
    claim::release(&mut conn, d, Source::Worker, why).await?;
    Ok(())
}
