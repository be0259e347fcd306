//! The rescuer (in every worker) and the SMS status poller.
//!
//! Rescue: rows whose lease expired are recovered within one lease plus one rescuer interval.
//! Never-started claims go back to ready without counting an attempt; started-but-unconfirmed
//! attempts are reconciled per channel: LINE → resend with the same retry key (409 = it had
//! landed); SMS → back to ready marked ambiguous, so the next attempt (a worker's) lists the
//! provider's messages and adopts a sid before it would resend; e-mail → `unknown`, resolved by a
//! delivery event, or after the horizon by `TING_EMAIL_UNKNOWN_POLICY`. A row whose attempts are
//! spent (`TING_MAX_ATTEMPTS`) or that is past the age cap (`TING_MAX_AGE_MS`) is never handed
//! back for a resend: it ends `failed`, with what is known of its last attempt. One rescuer at a time runs the
//! database part, under a transaction-scoped advisory lock; every change is a fenced
//! compare-and-set, so even two rescuers could not both move a row.
//!
//! This module must never call a provider inside a transaction, and never send: it only moves
//! rows so that a worker does.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;

use crate::channels::{class, sms, Channel};
use crate::config::{Config, UnknownPolicy};
use crate::state::{self, Fence, Source, State, Transition, Updates};

/// Advisory lock key of the rescuer ("ting" in ASCII).
const RESCUE_LOCK: i64 = 0x7469_6e67;

/// What one rescue pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rescued {
    pub released: u64,
    pub resend: u64,
    pub unknown: u64,
    pub policy: u64,
    /// Started attempts lost mid-way on a row whose attempts or age were spent: `failed`.
    pub exhausted: u64,
    /// False when another rescuer held the lock.
    pub ran: bool,
}

/// Rescue and poll until `stopping` turns true.
pub async fn run(
    cfg: Arc<Config>,
    pool: PgPool,
    sms: sms::SmsClient,
    mut stopping: watch::Receiver<bool>,
) {
    let every = cfg.heartbeat.min(cfg.lease / 2);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = async { let _ = stopping.wait_for(|s| *s).await; } => return,
        }
        match rescue_once(&pool, &cfg).await {
            Ok(r) if r.released + r.resend + r.unknown + r.policy + r.exhausted > 0 => {
                tracing::info!(?r, "rescued")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "rescue failed"),
        }
        if let Err(e) = poll_sms_once(&pool, &cfg, &sms).await {
            tracing::warn!(error = %format!("{e:#}"), "sms poll failed");
        }
        match settle_unconfirmed_sms(&pool, &cfg).await {
            Ok(n) if n > 0 => {
                tracing::info!(n, "sms without a final status past the horizon: unknown")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "sms horizon sweep failed"),
        }
    }
}

#[derive(sqlx::FromRow)]
struct Expired {
    id: i64,
    channel: String,
    attempts: i32,
    lease_owner: Option<String>,
    lease_token: i64,
    started: bool,
    /// E-mail: the started attempt marked its body as going out (`claim::mark_body`).
    body_sent: bool,
    too_old: bool,
}

/// One rescue pass over expired leases and e-mails held past the horizon.
pub async fn rescue_once(pool: &PgPool, cfg: &Config) -> anyhow::Result<Rescued> {
    let mut out = Rescued::default();
    let mut tx = pool.begin().await?;
    let (locked,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_xact_lock($1)")
        .bind(RESCUE_LOCK)
        .fetch_one(&mut *tx)
        .await?;
    if !locked {
        return Ok(out);
    }
    out.ran = true;
    let expired: Vec<Expired> = sqlx::query_as(
        "SELECT id, channel, attempts, lease_owner, lease_token, \
         (attempt_started_at IS NOT NULL AND attempt_lease_token IS NOT DISTINCT FROM lease_token) \
         AS started, (body_lease_token IS NOT DISTINCT FROM lease_token) AS body_sent, \
         created_at + $1 * interval '1 millisecond' <= now() AS too_old \
         FROM deliveries WHERE state = 'sending' AND lease_expires_at < now() \
         ORDER BY lease_expires_at LIMIT 1000",
    )
    .bind(cfg.max_age.as_millis() as f64)
    .fetch_all(&mut *tx)
    .await?;
    for e in expired {
        let owner = e.lease_owner.clone().unwrap_or_default();
        let Some(channel) = Channel::parse(&e.channel) else {
            // Never guess a channel: a wrong guess would reconcile against the wrong provider.
            tracing::error!(id = e.id, channel = %e.channel, "expired row with an unknown channel; left for a human");
            continue;
        };
        // An e-mail whose attempt never reached its body committed nothing: released like an
        // unstarted claim, its attempt counted (the next claim ends it `failed` if no attempt or
        // age is left, before any send).
        let nothing_sent = !e.started || (channel == Channel::Email && !e.body_sent);
        let (to, set, detail) = if nothing_sent {
            let to = if e.attempts == 0 {
                State::Pending
            } else {
                State::Retryable
            };
            let set = Updates {
                retry_in: Some(Duration::ZERO),
                ..Updates::default()
            };
            let why = if e.started {
                "expired before the e-mail's body was sent"
            } else {
                "expired before the attempt started"
            };
            (to, set, format!("lease of {owner} {why}"))
        } else if channel != Channel::Email && (e.attempts > cfg.max_attempts || e.too_old) {
            // No resend past the caps. What the lost attempt did is not known; the row says so.
            // (The last allowed attempt, lost mid-way, still gets its reconciliation below: a
            // resend under the same LINE retry key, or an SMS lookup before any resend. It may have
            // landed, and failing it unseen would call a delivered message failed; if it never
            // reached the provider, the provider has seen fewer attempts than the cap allows.)
            let why = if e.attempts > cfg.max_attempts {
                format!("{} attempts made (max {})", e.attempts, cfg.max_attempts)
            } else {
                format!("older than the age cap of {}ms", cfg.max_age.as_millis())
            };
            let text = format!(
                "attempt {} lost mid-way (lease of {owner} expired), outcome unknown; not resent: {why}",
                e.attempts
            );
            let set = Updates {
                error: Some((class::EXHAUSTED.to_string(), text.clone())),
                outcome_class: Some(class::AMBIGUOUS),
                ..Updates::default()
            };
            (State::Failed, set, text)
        } else if channel == Channel::Email {
            let err = Some((
                class::AMBIGUOUS.to_string(),
                format!("lease of {owner} expired mid-attempt"),
            ));
            let set = Updates {
                error: err,
                outcome_class: Some(class::AMBIGUOUS),
                ..Updates::default()
            };
            (
                State::Unknown,
                set,
                format!("lease of {owner} expired mid-attempt; outcome unknown"),
            )
        } else {
            let how = match channel {
                Channel::Line => "resend with the same retry key",
                _ => "look up the provider's messages before any resend",
            };
            let set = Updates {
                retry_in: Some(Duration::ZERO),
                error: Some((
                    class::AMBIGUOUS.to_string(),
                    format!("lease of {owner} expired mid-attempt"),
                )),
                outcome_class: Some(class::AMBIGUOUS),
                ..Updates::default()
            };
            (
                State::Retryable,
                set,
                format!("lease of {owner} expired mid-attempt; {how}"),
            )
        };
        let t = Transition {
            delivery_id: e.id,
            from: &[State::Sending],
            to,
            source: Source::Rescuer,
            detail: Some(detail),
            // An unstarted claim is released only if it is still unstarted when the row lock is
            // taken: a start committing meanwhile means a send may be under way.
            fence: match (e.started, nothing_sent) {
                (false, _) => Fence::Unstarted {
                    owner,
                    token: e.lease_token,
                },
                (true, true) => Fence::BodyUnsent {
                    owner,
                    token: e.lease_token,
                },
                (true, false) => Fence::Lease {
                    owner,
                    token: e.lease_token,
                },
            },
            set,
        };
        // Counted only when applied: a fence may refuse (a start committed meanwhile).
        if state::transition(&mut tx, &t).await?.is_some() {
            match (e.started, t.to) {
                (false, _) => out.released += 1,
                (true, State::Unknown) => out.unknown += 1,
                (true, State::Failed) => out.exhausted += 1,
                (true, _) => out.resend += 1,
            }
        }
    }
    if cfg.email_unknown_policy == UnknownPolicy::Resend {
        // E-mail only: an SMS in `unknown` (no final status within the horizon) was accepted by
        // the provider; resending it would send it twice.
        let held: Vec<(i64, i32, bool)> = sqlx::query_as(
            "SELECT id, attempts, created_at + $2 * interval '1 millisecond' <= now() \
             FROM deliveries WHERE state = 'unknown' AND channel = 'email' \
             AND updated_at < now() - $1 * interval '1 millisecond' LIMIT 1000",
        )
        .bind(cfg.reconcile_horizon.as_millis() as f64)
        .bind(cfg.max_age.as_millis() as f64)
        .fetch_all(&mut *tx)
        .await?;
        for (id, attempts, too_old) in held {
            let (to, detail) = if attempts >= cfg.max_attempts {
                (
                    State::Failed,
                    "no delivery event within the horizon; attempts exhausted",
                )
            } else if too_old {
                (
                    State::Failed,
                    "no delivery event within the horizon; past the age cap",
                )
            } else {
                (
                    State::Retryable,
                    "no delivery event within the horizon; resend with the same Message-ID",
                )
            };
            let t = Transition {
                delivery_id: id,
                from: &[State::Unknown],
                to,
                source: Source::Rescuer,
                detail: Some(detail.into()),
                fence: Fence::None,
                set: Updates {
                    retry_in: Some(Duration::ZERO),
                    ..Updates::default()
                },
            };
            if state::transition(&mut tx, &t).await?.is_some() {
                out.policy += 1;
            }
        }
    }
    tx.commit().await?;
    Ok(out)
}

/// Polls SMS deliveries that stayed in `submitted` past `TING_SMS_POLL_AFTER_MS`, with jitter,
/// until the reconciliation horizon. Rows are taken with `SKIP LOCKED` so workers share the work.
pub async fn poll_sms_once(
    pool: &PgPool,
    cfg: &Config,
    client: &sms::SmsClient,
) -> anyhow::Result<usize> {
    let due: Vec<(i64, String)> = sqlx::query_as(
        "UPDATE delivery_state d SET next_poll_at = now() + $1 * (0.5 + random()) * interval '1 millisecond' \
         FROM (SELECT s.id FROM delivery_state s JOIN delivery_items i ON i.id = s.id \
               WHERE s.state = 'submitted' AND i.channel = 'sms' \
               AND s.next_poll_at <= now() AND s.provider_message_id IS NOT NULL \
               AND s.submitted_at > now() - $2 * interval '1 millisecond' \
               ORDER BY s.next_poll_at LIMIT 50 FOR UPDATE OF s SKIP LOCKED) due \
         WHERE d.id = due.id RETURNING d.id, d.provider_message_id",
    )
    .bind(cfg.sms_poll_after.as_millis() as f64)
    .bind(cfg.reconcile_horizon.as_millis() as f64)
    .fetch_all(pool)
    .await?;
    let n = due.len();
    for (id, sid) in due {
        let msg = match client.fetch(&sid).await {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(sid, error = %format!("{e:#}"), "poll failed");
                continue;
            }
        };
        let (to, error) = match msg.report() {
            sms::Report::Delivered => (State::Delivered, None),
            sms::Report::Failed(e) => (
                State::PermanentFailure,
                Some((class::PERMANENT.to_string(), e)),
            ),
            sms::Report::Pending => continue,
        };
        let t = Transition {
            delivery_id: id,
            // `unknown` too: the horizon may have settled the row while this poll was out.
            from: &[State::Submitted, State::Unknown],
            to,
            source: Source::Poll,
            detail: Some(format!("polled {sid}: {}", msg.status)),
            fence: Fence::None,
            set: Updates {
                error,
                ..Updates::default()
            },
        };
        let mut conn = pool.acquire().await?;
        state::transition(&mut conn, &t).await?;
    }
    Ok(n)
}

/// SMS rows still `submitted` once the reconciliation horizon (`TING_RECONCILE_HORIZON_MS`) has
/// passed since the provider accepted them, with no final status from callbacks or polls, become
/// `unknown` (by `poll`, with an event saying so): the message was accepted, whether it reached
/// the handset is not known, and it is never resent. A late callback can still resolve it.
/// Returns how many rows it moved.
pub async fn settle_unconfirmed_sms(pool: &PgPool, cfg: &Config) -> anyhow::Result<usize> {
    let due: Vec<(i64, Option<String>)> = sqlx::query_as(
        "SELECT id, provider_message_id FROM deliveries WHERE state = 'submitted' \
         AND channel = 'sms' AND submitted_at <= now() - $1 * interval '1 millisecond' \
         ORDER BY submitted_at LIMIT 100",
    )
    .bind(cfg.reconcile_horizon.as_millis() as f64)
    .fetch_all(pool)
    .await?;
    let mut moved = 0;
    for (id, sid) in due {
        let text = format!(
            "no final status for {} within the reconciliation horizon of {}ms after acceptance",
            sid.as_deref().unwrap_or("(no sid)"),
            cfg.reconcile_horizon.as_millis()
        );
        let t = Transition {
            delivery_id: id,
            from: &[State::Submitted],
            to: State::Unknown,
            source: Source::Poll,
            detail: Some(text.clone()),
            fence: Fence::None,
            set: Updates {
                error: Some((class::AMBIGUOUS.to_string(), text)),
                ..Updates::default()
            },
        };
        let mut conn = pool.acquire().await?;
        if state::transition(&mut conn, &t).await?.is_some() {
            moved += 1;
        }
    }
    Ok(moved)
}
