//! One delivery attempt: wait for a channel slot, record the attempt start under the lease,
//! check the local lease deadline, send the stored payload, record the outcome.
//!
//! [`decide`] is the pure outcome → state policy (retries, caps, flaws), tested by table. This
//! module must never re-render a payload and never send without a recorded, fenced start.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;

use super::Worker;
use crate::channels::{class, Channel, Outcome};
use crate::claim::{self, Claimed};
use crate::config::{Config, Flaw};
use crate::state::{self, Fence, Source, State, Transition, Updates};

/// The state an outcome leads to and the columns that go with it.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub to: State,
    pub set: Updates,
    pub detail: String,
}

/// What to do after attempt number `attempts` of `d` came to `outcome`. `unit` is a uniform
/// random draw for the backoff jitter.
pub fn decide(cfg: &Config, d: &Claimed, attempts: i32, outcome: &Outcome, unit: f64) -> Decision {
    let err = |c: &str, e: &str| Some((c.to_string(), e.to_string()));
    match outcome {
        Outcome::Accepted { provider_id, done } => Decision {
            to: if *done {
                State::Delivered
            } else {
                State::Submitted
            },
            set: Updates {
                provider_message_id: provider_id.clone(),
                poll_in: (d.channel == Channel::Sms).then_some(cfg.sms_poll_after),
                ..Updates::default()
            },
            detail: format!("attempt {attempts} accepted"),
        },
        Outcome::Permanent { error } if !cfg.flaws.has(Flaw::RetryPermanent) => Decision {
            to: State::PermanentFailure,
            set: Updates {
                error: err(class::PERMANENT, error),
                ..Updates::default()
            },
            detail: error.clone(),
        },
        Outcome::Unknown { error } if !cfg.flaws.has(Flaw::ResendUncertain) => Decision {
            to: State::Unknown,
            set: Updates {
                error: err(class::AMBIGUOUS, error),
                ..Updates::default()
            },
            detail: format!("outcome unknowable: {error}"),
        },
        _ => {
            let (cls, error, retry_after) = match outcome {
                Outcome::Retry {
                    class,
                    error,
                    retry_after,
                } => (*class, error.as_str(), *retry_after),
                // Only reached with the retry-permanent / resend-uncertain flaws.
                Outcome::Permanent { error } => (class::TRANSIENT, error.as_str(), None),
                Outcome::Unknown { error } => (class::AMBIGUOUS, error.as_str(), None),
                Outcome::Accepted { .. } => unreachable!("accepted is decided above"),
            };
            if cfg.flaws.has(Flaw::DropOnFailure) {
                // Flaw: a failed send is simply dropped.
                return Decision {
                    to: State::Failed,
                    set: Updates {
                        error: err(cls, error),
                        ..Updates::default()
                    },
                    detail: format!("dropped after attempt {attempts}: {error}"),
                };
            }
            let age = Utc::now()
                .signed_duration_since(d.created_at)
                .to_std()
                .unwrap_or_default();
            let storm = cfg.flaws.has(Flaw::RetryStorm);
            if !storm && (attempts >= cfg.max_attempts || age >= cfg.max_age) {
                return Decision {
                    to: State::Failed,
                    set: Updates {
                        error: err(class::EXHAUSTED, error),
                        ..Updates::default()
                    },
                    detail: format!("gave up after {attempts} attempts: {error}"),
                };
            }
            let gap = if storm {
                Duration::ZERO
            } else {
                cfg.backoff.delay(attempts, unit, retry_after)
            };
            Decision {
                to: State::Retryable,
                set: Updates {
                    retry_in: Some(gap),
                    error: err(cls, error),
                    ..Updates::default()
                },
                detail: format!(
                    "attempt {attempts} failed ({cls}), retry in {}ms: {error}",
                    gap.as_millis()
                ),
            }
        }
    }
}

/// Runs one claimed delivery to its recorded outcome (or gives it back).
pub(crate) async fn send_one(w: Arc<Worker>, d: Claimed, claimed_at: Instant) {
    if let Err(e) = attempt(&w, &d, claimed_at).await {
        // Typically the database went away mid-attempt. The row keeps our lease until it lapses
        // (it is no longer renewed), then the rescuer reconciles it like a crash.
        tracing::warn!(key = %d.key, error = %format!("{e:#}"), "attempt failed to complete");
    }
    if let Ok(mut held) = w.held.lock() {
        held.remove(&d.id);
    }
    if let Ok(mut renewed) = w.renewed_at.lock() {
        renewed.forget(d.id);
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
    if !zombie && Instant::now() + w.margin() >= w.local_deadline(d.id, claimed_at) {
        return give_back(w, d, "lease too close to expiry to start").await;
    }
    // Connect before the start is recorded: the uncertain window is the exchange alone.
    let ready = w.providers.ready(d).await;
    if !zombie && Instant::now() + w.margin() >= w.local_deadline(d.id, claimed_at) {
        return give_back(w, d, "lease too close to expiry to start").await;
    }
    let attempts = if zombie {
        // Flaw: send without proving the lease is still ours.
        d.attempts + 1
    } else {
        match claim::start_attempt(&w.pool, d, w.margin()).await? {
            Some(a) => a,
            None => {
                tracing::info!(key = %d.key, "lease lost before the attempt started; not sending");
                return Ok(());
            }
        }
    };
    if !zombie && Instant::now() + w.margin() >= w.local_deadline(d.id, claimed_at) {
        // The process stalled between the fence and here: undo the start and give the row
        // back in one transaction, do not send.
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
        return Ok(());
    }

    let outcome = match (reconcile_first(w, d).await, ready) {
        (Some(o), _) | (None, Err(o)) => o,
        (None, Ok(ready)) if w.cfg.flaws.has(Flaw::RerenderOnRetry) && d.attempts > 0 => {
            // Flaw: a retry renders the message again from live data instead of sending the
            // stored payload; simulated by what changed since (the attempt), so the bytes differ.
            let mut again = d.clone();
            again.payload.text = format!("{} [{}]", d.payload.text, attempts);
            w.providers.send(&again, ready).await
        }
        (None, Ok(ready)) => w.providers.send(d, ready).await,
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

/// The `whole-batch-replay` flaw: the batch is the unit of retry, so a partial failure puts every
/// delivery of the batch back to `pending`, finished ones included (bypassing the state machine
/// on purpose). Each delivery is replayed at most once, so a run still ends.
async fn replay_whole_batch(conn: &mut sqlx::PgConnection, d: &Claimed) -> anyhow::Result<()> {
    sqlx::query(
        "WITH old AS (SELECT r.id, r.state FROM deliveries r JOIN deliveries failed \
         ON failed.id = $1 AND r.batch_id = failed.batch_id AND r.id <> failed.id \
         WHERE r.state IN ('delivered', 'submitted') \
         AND NOT EXISTS (SELECT 1 FROM delivery_events e WHERE e.delivery_id = r.id \
                         AND e.detail = 'whole-batch-replay') FOR UPDATE OF r), \
         replayed AS (UPDATE deliveries r SET state = 'pending', next_attempt_at = now(), \
         lease_owner = NULL, lease_expires_at = NULL FROM old WHERE r.id = old.id \
         RETURNING r.id, old.state AS from_state), \
         ev AS (INSERT INTO delivery_events (delivery_id, from_state, to_state, source, detail) \
         SELECT id, from_state, 'pending', 'worker', 'whole-batch-replay' FROM replayed) \
         SELECT count(*) FROM replayed",
    )
    .bind(d.id)
    .execute(conn)
    .await
    .context("whole-batch-replay")?;
    Ok(())
}

/// SMS has no idempotency key: after an attempt that may have landed, look for it first and
/// adopt its sid instead of sending a second message.
async fn reconcile_first(w: &Worker, d: &Claimed) -> Option<Outcome> {
    if d.channel != Channel::Sms || d.last_error_class.as_deref() != Some(class::AMBIGUOUS) {
        return None;
    }
    if w.cfg.flaws.has(Flaw::ResendUncertain) {
        return None;
    }
    // Any message of this delivery was created after the delivery was (a minute of clock skew).
    let since = d.created_at - chrono::Duration::minutes(1);
    match w
        .providers
        .sms
        .find(&d.address, &d.payload.text, since)
        .await
    {
        Ok(Some(m)) => {
            tracing::info!(key = %d.key, sid = %m.sid, "adopting the message an earlier attempt created");
            Some(Outcome::Accepted {
                provider_id: Some(m.sid),
                done: false,
            })
        }
        Ok(None) => None,
        // Cannot tell: do not risk a duplicate, try again later.
        Err(e) => Some(Outcome::Retry {
            class: class::AMBIGUOUS,
            error: format!("lookup before resend failed: {e:#}"),
            retry_after: None,
        }),
    }
}

async fn give_back(w: &Worker, d: &Claimed, why: &str) -> anyhow::Result<()> {
    let mut conn = w.pool.acquire().await?;
    claim::release(&mut conn, d, Source::Worker, why).await?;
    Ok(())
}
