//! One delivery attempt: wait for a channel slot, record the attempt start under the lease,
//! check the local lease deadline, send the stored payload, record the outcome.
//!
//! [`decide`] is the pure outcome → state policy (retries, caps, flaws), tested by table. This
//! module must never re-render a payload and never send without a recorded, fenced start.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};

use super::Worker;
use crate::channels::{class, Channel, Outcome};
use crate::claim::{self, Claimed};
use crate::config::{Config, Flaw};
use crate::render::Payload;
use crate::state::{self, Fence, Source, State, Transition, Updates};

/// The state an outcome leads to and the columns that go with it.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub to: State,
    pub set: Updates,
    pub detail: String,
}

/// What to do after attempt number `attempts` of `d` came to `outcome`. `unit` is a uniform
/// random draw for the backoff jitter (and the first SMS poll's).
pub fn decide(cfg: &Config, d: &Claimed, attempts: i32, outcome: &Outcome, unit: f64) -> Decision {
    decide_at(cfg, d, attempts, outcome, unit, Utc::now())
}

/// [`decide`] with the clock passed in.
///
/// Exhaustion is never silent: a retry that would be attempt `max_attempts + 1`, or whose next
/// attempt (backoff, or the provider's longer `Retry-After`, which is never shortened) would
/// start at or past `created_at + max_age`, ends `failed` now, class `exhausted`, with the
/// provider's text of this attempt.
pub fn decide_at(
    cfg: &Config,
    d: &Claimed,
    attempts: i32,
    outcome: &Outcome,
    unit: f64,
    now: DateTime<Utc>,
) -> Decision {
    let err = |c: &str, e: &str| Some((c.to_string(), e.to_string()));
    let counted = Some(outcome.class());
    match outcome {
        Outcome::Accepted { provider_id, done } => Decision {
            to: if *done {
                State::Delivered
            } else {
                State::Submitted
            },
            set: Updates {
                provider_message_id: provider_id.clone(),
                poll_in: (d.channel == Channel::Sms).then(|| first_poll(cfg, unit)),
                outcome_class: counted,
                ..Updates::default()
            },
            detail: format!("attempt {attempts} accepted"),
        },
        Outcome::Permanent { error } if !cfg.flaws.has(Flaw::RetryPermanent) => Decision {
            to: State::PermanentFailure,
            set: Updates {
                error: err(class::PERMANENT, error),
                outcome_class: counted,
                ..Updates::default()
            },
            detail: error.clone(),
        },
        Outcome::Unknown { error } if !cfg.flaws.has(Flaw::ResendUncertain) => Decision {
            to: State::Unknown,
            set: Updates {
                error: err(class::AMBIGUOUS, error),
                outcome_class: counted,
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
                        outcome_class: counted,
                        ..Updates::default()
                    },
                    detail: format!("dropped after attempt {attempts}: {error}"),
                };
            }
            let storm = cfg.flaws.has(Flaw::RetryStorm);
            let mut backoff = cfg.backoff;
            if cfg.flaws.has(Flaw::NoBackoffCap) {
                // Flaw: the gap grows without the `TING_BACKOFF_MAX_MS` cap.
                backoff.max = Duration::from_secs(86_400);
            }
            let gap = if storm {
                Duration::ZERO
            } else {
                backoff.delay(attempts, unit, retry_after)
            };
            let gave_up = if storm {
                None
            } else if spent(cfg, attempts) {
                Some(format!(
                    "gave up after {attempts} attempts (max {})",
                    cfg.max_attempts
                ))
            } else if gap >= age_left(cfg, d, now) {
                Some(format!(
                    "gave up after {attempts} attempts: the next one (in {}ms) would be past \
                     the age cap of {}ms",
                    gap.as_millis(),
                    cfg.max_age.as_millis()
                ))
            } else {
                None
            };
            if let Some(why) = gave_up {
                return Decision {
                    to: State::Failed,
                    set: Updates {
                        error: err(class::EXHAUSTED, error),
                        outcome_class: counted,
                        ..Updates::default()
                    },
                    detail: format!("{why}: {error}"),
                };
            }
            Decision {
                to: State::Retryable,
                set: Updates {
                    retry_in: Some(gap),
                    error: err(cls, error),
                    outcome_class: counted,
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

/// Whether `attempts` made use up the limit of `TING_MAX_ATTEMPTS`.
fn spent(cfg: &Config, attempts: i32) -> bool {
    if cfg.flaws.has(Flaw::AttemptsOffByOne) {
        // Flaw: `>` where `>=` belongs, so one attempt more than the limit is made.
        return attempts > cfg.max_attempts;
    }
    attempts >= cfg.max_attempts
}

/// Time left before `d` reaches the age cap (`created_at + max_age`); zero once it has.
fn age_left(cfg: &Config, d: &Claimed, now: DateTime<Utc>) -> Duration {
    let age = now
        .signed_duration_since(d.created_at)
        .to_std()
        .unwrap_or_default();
    cfg.max_age.saturating_sub(age)
}

/// The first status poll of an SMS just accepted: `TING_SMS_POLL_AFTER_MS` × [0.5, 1.5), so the
/// rows of one batch do not all poll at the same instant.
pub fn first_poll(cfg: &Config, unit: f64) -> Duration {
    cfg.sms_poll_after
        .mul_f64(0.5 + unit.clamp(0.0, 1.0 - f64::EPSILON))
}

/// Why `d` must not be attempted again, checked before anything is sent: its attempts are spent
/// or it is past the age cap. `None`: go ahead.
pub fn exhausted_before_send(cfg: &Config, d: &Claimed, now: DateTime<Utc>) -> Option<String> {
    if cfg.flaws.has(Flaw::RetryStorm) {
        return None;
    }
    // The last allowed attempt of a LINE or SMS delivery, lost mid-way, is reconciled once more
    // (same retry key; lookup before any resend): it may have landed.
    let reconciling = d.attempts == cfg.max_attempts
        && d.channel != Channel::Email
        && d.last_error_class.as_deref() == Some(class::AMBIGUOUS);
    if spent(cfg, d.attempts) && !reconciling {
        return Some(format!(
            "not attempted again: {} attempts made (max {})",
            d.attempts, cfg.max_attempts
        ));
    }
    if age_left(cfg, d, now).is_zero() {
        return Some(format!(
            "not attempted again: older than the age cap of {}ms",
            cfg.max_age.as_millis()
        ));
    }
    None
}

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
    // Whether the local lease deadline is too close to act under the lease (never, with the flaw).
    let too_late = || {
        !zombie
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
    let outcome = match (reconciled, ready) {
        (Reconciled::Recorded, _) => return Ok(()),
        (Reconciled::Outcome(o), _) | (Reconciled::Send, Err(o)) => o,
        (Reconciled::Send, Ok(ready)) => match payload_to_send(&w.cfg, d, attempts) {
            Cow::Borrowed(_) => w.providers.send(d, ready).await,
            Cow::Owned(p) => {
                let mut again = d.clone();
                again.payload = p;
                w.providers.send(&again, ready).await
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

/// The payload attempt number `attempts` of `d` sends: the one stored at enqueue, always (its
/// SHA-256 is `d.payload_sha256`). Only the `rerender-on-retry` flaw returns anything else.
pub fn payload_to_send<'a>(cfg: &Config, d: &'a Claimed, attempts: i32) -> Cow<'a, Payload> {
    if cfg.flaws.has(Flaw::RerenderOnRetry) && attempts > 1 {
        // Flaw: a retry renders the message again from live data instead of sending the
        // stored payload; simulated by what changed since (the attempt), so the bytes differ.
        let mut again = d.payload.clone();
        again.text = format!("{} [{}]", d.payload.text, attempts);
        return Cow::Owned(again);
    }
    Cow::Borrowed(&d.payload)
}

/// How far before the uncertain attempt's recorded start an SMS lookup reaches: the provider's
/// clock (which stamps `date_created`) and the database's may disagree by this much.
pub const SMS_LOOKUP_SKEW: chrono::Duration = chrono::Duration::seconds(30);

/// Advisory lock class (two-key form, apart from the rescuer's one-key lock) that serialises
/// adoptions of one SMS sid, so two deliveries never both adopt it.
const ADOPT_LOCK: i32 = 0x736d73; // "sms"

/// What the look-before-resend step came to.
enum Reconciled {
    /// Nothing to reconcile, or nothing found: send.
    Send,
    /// An earlier attempt's message was adopted (or the row moved on meanwhile): done.
    Recorded,
    /// The attempt's outcome without a send (the lookup failed, or a twin's send is in flight:
    /// cannot tell, do not resend).
    Outcome(Outcome),
}

/// What one adoption attempt came to.
enum Adoption {
    /// Adopted (or the row had moved on meanwhile): `d` is done with.
    Recorded,
    /// Another delivery owns the sid: look at the next candidate.
    Owned,
    /// The sid is unowned, but a twin of `d` (another SMS delivery to the same number with the
    /// same text, id given) is in `sending` with no sid recorded: the message may be its
    /// attempt's, which its own outcome or status callback records without the adoption lock.
    /// Cannot tell yet.
    TwinInFlight(i64),
}

/// SMS has no idempotency key: after an attempt that may have landed, look for its message first
/// and adopt the sid instead of sending a second message. Candidates are messages to the same
/// number with the same body, from our number, created no earlier than the start of the first
/// uncertain attempt less [`SMS_LOOKUP_SKEW`], and not owned by another delivery. An unowned
/// candidate while a twin's attempt is in flight (see [`adopt`]) ends the attempt without a send
/// (`ambiguous`, retried later), as a failed lookup does.
async fn reconcile_first(w: &Worker, d: &Claimed) -> Reconciled {
    if d.channel != Channel::Sms || d.last_error_class.as_deref() != Some(class::AMBIGUOUS) {
        return Reconciled::Send;
    }
    if w.cfg.flaws.has(Flaw::ResendUncertain) {
        return Reconciled::Send;
    }
    let looked = async {
        let since = lookup_since(w, d).await? - SMS_LOOKUP_SKEW;
        let found = w
            .providers
            .sms
            .find(&d.address, &d.payload.text, since)
            .await?;
        for m in found {
            match adopt(w, d, &m.sid).await? {
                Adoption::Recorded => return anyhow::Ok(Reconciled::Recorded),
                Adoption::Owned => {}
                Adoption::TwinInFlight(twin) => {
                    return Ok(cannot_tell(format!(
                        "lookup before resend: {} may be delivery {twin}'s (same number and \
                         text, in flight, its sid not recorded yet); cannot tell yet",
                        m.sid
                    )))
                }
            }
        }
        Ok(Reconciled::Send)
    };
    looked
        .await
        .unwrap_or_else(|e| cannot_tell(format!("lookup before resend failed: {e:#}")))
}

/// Cannot tell whether an earlier attempt landed: do not risk a duplicate (nor take a twin's
/// message); the attempt ends `retryable` (`ambiguous`) and looks again later.
fn cannot_tell(error: String) -> Reconciled {
    Reconciled::Outcome(Outcome::Retry {
        class: class::AMBIGUOUS,
        error,
        retry_after: None,
    })
}

/// Start of the earliest attempt of `d` whose outcome is still unknown (recorded by the
/// transition that made it `ambiguous`); failing that, the previous attempt's start, or the
/// delivery's creation.
async fn lookup_since(w: &Worker, d: &Claimed) -> anyhow::Result<DateTime<Utc>> {
    let (since,): (Option<DateTime<Utc>>,) =
        sqlx::query_as("SELECT uncertain_since FROM deliveries WHERE id = $1")
            .bind(d.id)
            .fetch_one(&w.pool)
            .await
            .context("reading the uncertain attempt's start")?;
    Ok(since.or(d.attempt_started_at).unwrap_or(d.created_at))
}

/// Adopts `sid` for `d` unless another delivery owns it: under a per-sid advisory lock, so the
/// ownership check and the fenced `sending → submitted` are one step for every adopter.
///
/// The lock only orders adopters: a delivery's own send records its sid without it (the worker's
/// outcome, fenced on a started attempt; a status callback, on any `sending` row without a sid).
/// So `sid` is not adopted while a twin of `d` — another SMS delivery to the same number with the
/// same text (two recipients sharing a phone, a static text) — is in `sending` with no sid
/// recorded: its attempt may have created `sid` and would record it too, two rows owning one
/// message while `d`'s own was never sent. That ends `d`'s attempt without a send (cannot tell
/// yet); the twin leaves `sending` within its send (provider timeout) or, if its worker died,
/// one lease and a rescue, and the attempt and age caps bound the retries meanwhile. A twin
/// merely marked uncertain (`retryable`) does not hold `d` back: it can only get a sid through
/// this lock, and holding back for it would stall two uncertain twins on each other until both
/// ran out of attempts. Both checks are one statement (one snapshot): a twin that records `sid`
/// meanwhile is seen either in `sending` or as the owner, never neither.
async fn adopt(w: &Worker, d: &Claimed, sid: &str) -> anyhow::Result<Adoption> {
    let mut tx = w.pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
        .bind(ADOPT_LOCK)
        .bind(sid)
        .execute(&mut *tx)
        .await?;
    let (owned, twin): (bool, Option<i64>) = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM deliveries WHERE provider_message_id = $1 AND id <> $2), \
         (SELECT min(id) FROM deliveries WHERE state = 'sending' AND channel = 'sms' \
          AND provider_message_id IS NULL AND address = $3 AND payload->>'text' = $4 \
          AND id <> $2)",
    )
    .bind(sid)
    .bind(d.id)
    .bind(&d.address)
    .bind(&d.payload.text)
    .fetch_one(&mut *tx)
    .await?;
    if owned {
        tracing::info!(key = %d.key, sid, "lookup found a message another delivery owns; not adopting it");
        return Ok(Adoption::Owned);
    }
    if let Some(twin) = twin {
        tracing::info!(key = %d.key, sid, twin, "lookup found a message a twin in flight may have created; cannot tell yet");
        return Ok(Adoption::TwinInFlight(twin));
    }
    let t = Transition {
        delivery_id: d.id,
        from: &[State::Sending],
        to: State::Submitted,
        source: Source::Worker,
        detail: Some(format!("adopted {sid}, created by an earlier attempt")),
        fence: Fence::Lease {
            owner: d.lease_owner.clone(),
            token: d.lease_token,
        },
        set: Updates {
            provider_message_id: Some(sid.to_string()),
            poll_in: Some(first_poll(&w.cfg, rand::random())),
            outcome_class: Some(class::ACCEPTED),
            ..Updates::default()
        },
    };
    let recorded = state::transition(&mut tx, &t).await?.is_some();
    tx.commit().await?;
    tracing::info!(key = %d.key, sid, recorded, "adopted the message an earlier attempt created");
    Ok(Adoption::Recorded)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::Backoff;
    use crate::config::Flaws;

    fn cfg() -> Config {
        let mut cfg = Config::for_tests("postgres://unused");
        cfg.max_attempts = 3;
        cfg.max_age = Duration::from_secs(3600);
        cfg.sms_poll_after = Duration::from_millis(1000);
        cfg.backoff = Backoff {
            base: Duration::from_millis(100),
            factor: 2.0,
            max: Duration::from_millis(1000),
            jitter: 0.5,
        };
        cfg
    }

    fn claimed(channel: Channel, attempts: i32, created_at: DateTime<Utc>) -> Claimed {
        let payload = Payload {
            text: "hello".into(),
            ..Payload::default()
        };
        Claimed {
            id: 1,
            key: "b:r:x".into(),
            channel,
            address: "a".into(),
            payload_sha256: payload.sha256(),
            payload,
            correlation_id: "c".into(),
            attempts,
            lease_owner: "w".into(),
            lease_token: 1,
            created_at,
            last_error_class: None,
            attempt_started_at: None,
            from_state: State::Pending,
        }
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn accepted(done: bool) -> Outcome {
        Outcome::Accepted {
            provider_id: Some("p1".into()),
            done,
        }
    }
    fn retry(class: &'static str, retry_after: Option<Duration>) -> Outcome {
        Outcome::Retry {
            class,
            error: "503 busy".into(),
            retry_after,
        }
    }
    fn permanent() -> Outcome {
        Outcome::Permanent {
            error: "550 5.1.1 mailbox unknown".into(),
        }
    }
    fn unknown() -> Outcome {
        Outcome::Unknown {
            error: "connection lost after DATA".into(),
        }
    }

    /// Every outcome class × attempts below / at the cap × age below / near / past the cap.
    /// Expected: (state, retry gap, error class, counted class).
    #[test]
    fn decide_table() {
        let cfg = cfg();
        let now: DateTime<Utc> = "2026-11-30T12:00:00Z".parse().unwrap();
        let young = now - chrono::Duration::minutes(1);
        let old = now - chrono::Duration::hours(2);
        // 150 ms of age left: the first gap (100 ms) fits, the second (200 ms) does not.
        let near = now - chrono::Duration::milliseconds(3_600_000 - 150);
        type Want = (State, Option<Duration>, Option<&'static str>, &'static str);
        let retryable = |gap, cls| (State::Retryable, Some(gap), Some(cls), cls);
        let failed = |cls| (State::Failed, None, Some(class::EXHAUSTED), cls);
        let t = class::TRANSIENT;
        let a = class::AMBIGUOUS;
        let ra = |ms| Some(MS(ms));
        let cases: Vec<(&str, Outcome, i32, DateTime<Utc>, Want)> = vec![
            // Accepted: never depends on attempts or age.
            (
                "line ok",
                accepted(true),
                1,
                young,
                (State::Delivered, None, None, "accepted"),
            ),
            (
                "line ok at cap",
                accepted(true),
                3,
                old,
                (State::Delivered, None, None, "accepted"),
            ),
            (
                "sms ok",
                accepted(false),
                1,
                young,
                (State::Submitted, None, None, "accepted"),
            ),
            // Permanent and unknowable: same at any attempt or age.
            (
                "permanent",
                permanent(),
                1,
                young,
                (
                    State::PermanentFailure,
                    None,
                    Some("permanent"),
                    "permanent",
                ),
            ),
            (
                "permanent at cap",
                permanent(),
                3,
                old,
                (
                    State::PermanentFailure,
                    None,
                    Some("permanent"),
                    "permanent",
                ),
            ),
            (
                "unknown",
                unknown(),
                1,
                young,
                (State::Unknown, None, Some(a), a),
            ),
            (
                "unknown at cap",
                unknown(),
                3,
                old,
                (State::Unknown, None, Some(a), a),
            ),
            // Transient / ambiguous below both caps: backoff (unit 0.5 = no jitter).
            (
                "transient 1",
                retry(t, None),
                1,
                young,
                retryable(MS(100), t),
            ),
            (
                "transient 2",
                retry(t, None),
                2,
                young,
                retryable(MS(200), t),
            ),
            (
                "ambiguous 1",
                retry(a, None),
                1,
                young,
                retryable(MS(100), a),
            ),
            // At the attempt cap: failed, whatever the age.
            ("transient at cap", retry(t, None), 3, young, failed(t)),
            ("ambiguous at cap", retry(a, None), 3, young, failed(a)),
            ("transient past cap", retry(t, None), 4, young, failed(t)),
            // Past the age cap: failed, whatever the attempts.
            ("transient too old", retry(t, None), 1, old, failed(t)),
            ("ambiguous too old", retry(a, None), 1, old, failed(a)),
            ("too old at cap", retry(t, None), 3, old, failed(t)),
            // Near the age cap: a gap that still fits is kept, one that does not fails now.
            (
                "fits before the age cap",
                retry(t, None),
                1,
                near,
                retryable(MS(100), t),
            ),
            ("would pass the age cap", retry(t, None), 2, near, failed(t)),
            // Retry-After: a longer wait wins, a shorter one does not shorten the backoff...
            (
                "retry-after longer",
                retry(t, ra(600_000)),
                1,
                young,
                retryable(MS(600_000), t),
            ),
            (
                "retry-after shorter",
                retry(t, ra(10)),
                2,
                young,
                retryable(MS(200), t),
            ),
            // ...and one that would land past the age cap fails now instead of being cut short.
            (
                "retry-after past the age cap",
                retry(t, ra(3_600_000)),
                1,
                young,
                failed(t),
            ),
            (
                "retry-after near the age cap",
                retry(t, ra(200)),
                1,
                near,
                failed(t),
            ),
            ("retry-after at cap", retry(t, ra(50)), 3, young, failed(t)),
        ];
        for (name, outcome, attempts, created, want) in cases {
            let channel = match outcome {
                Outcome::Accepted { done: false, .. } => Channel::Sms,
                _ => Channel::Line,
            };
            let d = claimed(channel, attempts - 1, created);
            let got = decide_at(&cfg, &d, attempts, &outcome, 0.5, now);
            let got_want: Want = (
                got.to,
                got.set.retry_in,
                got.set.error.as_ref().map(|(c, _)| match c.as_str() {
                    "transient" => class::TRANSIENT,
                    "ambiguous" => class::AMBIGUOUS,
                    "permanent" => class::PERMANENT,
                    "exhausted" => class::EXHAUSTED,
                    other => panic!("{name}: class {other}"),
                }),
                got.set.outcome_class.unwrap_or("none"),
            );
            assert_eq!(got_want, want, "{name}: {got:?}");
            // The provider's own text is what `last_error` keeps, exhausted or not.
            if let Some((_, text)) = &got.set.error {
                let provider_text = match &outcome {
                    Outcome::Retry { error, .. }
                    | Outcome::Permanent { error }
                    | Outcome::Unknown { error } => error,
                    Outcome::Accepted { .. } => unreachable!(),
                };
                assert_eq!(text, provider_text, "{name}");
            }
            if got.to == State::Failed {
                assert!(
                    got.detail.starts_with("gave up after"),
                    "{name}: {}",
                    got.detail
                );
            }
        }
    }

    #[test]
    fn decide_with_flaws() {
        let now = Utc::now();
        let d = claimed(Channel::Line, 5, now - chrono::Duration::hours(2));
        let mut cfg = cfg();
        cfg.flaws = Flaws::default().with(Flaw::RetryStorm);
        let got = decide_at(&cfg, &d, 6, &retry(class::TRANSIENT, None), 0.5, now);
        assert_eq!(
            (got.to, got.set.retry_in),
            (State::Retryable, Some(Duration::ZERO))
        );
        assert_eq!(exhausted_before_send(&cfg, &d, now), None);
        cfg.flaws = Flaws::default().with(Flaw::DropOnFailure);
        let young = claimed(Channel::Line, 0, now);
        let got = decide_at(&cfg, &young, 1, &retry(class::TRANSIENT, None), 0.5, now);
        assert_eq!(got.to, State::Failed);
        cfg.flaws = Flaws::default().with(Flaw::RetryPermanent);
        let got = decide_at(&cfg, &young, 1, &permanent(), 0.5, now);
        assert_eq!(got.to, State::Retryable);
        assert_eq!(
            got.set.outcome_class,
            Some("permanent"),
            "counted as what it was"
        );
    }

    /// Checked before anything is sent: rows whose attempts or age are spent are not sent again.
    #[test]
    fn the_cap_and_limit_flaws() {
        let now = Utc::now();
        let young = claimed(Channel::Line, 0, now);
        let mut c = cfg();
        // Attempt 6 failed: 100 ms × 2^5 = 3.2 s, capped at 1 s (± 50% jitter: 0.5 at 0.5).
        let gap = |cfg: &Config| {
            decide_at(cfg, &young, 6, &retry(class::TRANSIENT, None), 0.5, now)
                .set
                .retry_in
        };
        c.max_attempts = 10;
        assert_eq!(gap(&c), Some(Duration::from_millis(1000)));
        c.flaws = Flaws::default().with(Flaw::NoBackoffCap);
        assert_eq!(gap(&c), Some(Duration::from_millis(3200)));

        // Limit 3: attempt 3 failing gives up; with the flaw it retries, and attempts once more.
        let mut c = cfg();
        let third =
            |cfg: &Config| decide_at(cfg, &young, 3, &retry(class::TRANSIENT, None), 0.5, now).to;
        assert_eq!(third(&c), State::Failed);
        let spent = claimed(Channel::Line, 3, now);
        assert!(exhausted_before_send(&c, &spent, now).is_some());
        c.flaws = Flaws::default().with(Flaw::AttemptsOffByOne);
        assert_eq!(third(&c), State::Retryable);
        assert_eq!(exhausted_before_send(&c, &spent, now), None);
    }

    #[test]
    fn exhausted_before_send_table() {
        let cfg = cfg();
        let now: DateTime<Utc> = "2026-11-30T12:00:00Z".parse().unwrap();
        let cases = [
            (0, chrono::Duration::zero(), false),
            (2, chrono::Duration::minutes(59), false),
            (3, chrono::Duration::minutes(1), true),
            (7, chrono::Duration::minutes(1), true),
            (0, chrono::Duration::minutes(60), true),
            (1, chrono::Duration::hours(5), true),
        ];
        for (attempts, age, stop) in cases {
            let d = claimed(Channel::Sms, attempts, now - age);
            let got = exhausted_before_send(&cfg, &d, now);
            assert_eq!(
                got.is_some(),
                stop,
                "{attempts} attempts, age {age}: {got:?}"
            );
        }
        // The last allowed attempt (3 here), lost mid-way, is reconciled once more on LINE and SMS
        // (same retry key; lookup first); e-mail is not; one past the cap never is.
        let young = now - chrono::Duration::minutes(1);
        for (channel, attempts, stop) in [
            (Channel::Line, 3, false),
            (Channel::Sms, 3, false),
            (Channel::Email, 3, true),
            (Channel::Sms, 4, true),
        ] {
            let mut d = claimed(channel, attempts, young);
            d.last_error_class = Some(class::AMBIGUOUS.to_string());
            let got = exhausted_before_send(&cfg, &d, now);
            assert_eq!(got.is_some(), stop, "{channel:?} {attempts}: {got:?}");
        }
    }

    #[test]
    fn the_first_sms_poll_is_jittered() {
        let cfg = cfg();
        // (unit, expected) around TING_SMS_POLL_AFTER_MS = 1000.
        for (unit, want) in [(0.0, 500), (0.25, 750), (0.5, 1000), (0.999, 1499)] {
            assert_eq!(first_poll(&cfg, unit).as_millis(), want, "{unit}");
        }
        assert!(first_poll(&cfg, 1.0) <= MS(1500));
        let now = Utc::now();
        let d = claimed(Channel::Sms, 0, now);
        let got = decide_at(&cfg, &d, 1, &accepted(false), 0.0, now);
        assert_eq!(got.set.poll_in, Some(MS(500)));
        let line = claimed(Channel::Line, 0, now);
        assert_eq!(
            decide_at(&cfg, &line, 1, &accepted(true), 0.0, now)
                .set
                .poll_in,
            None
        );
    }

    /// What a retry sends hashes to what was stored at enqueue; the `rerender-on-retry` flaw is
    /// what breaks that (so the check can fail).
    #[test]
    fn a_retry_sends_the_stored_payload() {
        let mut cfg = cfg();
        let d = claimed(Channel::Line, 1, Utc::now());
        for attempts in [1, 2, 5] {
            let p = payload_to_send(&cfg, &d, attempts);
            assert_eq!(p.sha256(), d.payload_sha256, "attempt {attempts}");
        }
        cfg.flaws = Flaws::default().with(Flaw::RerenderOnRetry);
        assert_eq!(payload_to_send(&cfg, &d, 1).sha256(), d.payload_sha256);
        assert_ne!(payload_to_send(&cfg, &d, 2).sha256(), d.payload_sha256);
    }
}
