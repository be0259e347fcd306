//! Looking before resending an SMS whose earlier attempt may have landed: find the message at
//! the provider and adopt its sid instead of sending a second one, under a per-sid lock so two
//! deliveries never own one message. SMS has no idempotency key; this is what stands in for it.

use anyhow::Context;
use chrono::{DateTime, Utc};

use super::decide::first_poll;
use super::Worker;
use crate::channels::{class, Channel, Outcome};
use crate::claim::Claimed;
use crate::config::Flaw;
use crate::state::{self, Fence, Source, State, Transition, Updates};

/// How far before the uncertain attempt's recorded start an SMS lookup reaches: the provider's
/// clock (which stamps `date_created`) and the database's may disagree by this much.
pub const SMS_LOOKUP_SKEW: chrono::Duration = chrono::Duration::seconds(30);

/// Advisory lock class (two-key form, apart from the rescuer's one-key lock) that serialises
/// adoptions of one SMS sid, so two deliveries never both adopt it.
const ADOPT_LOCK: i32 = 0x736d73; // "sms"

/// What the look-before-resend step came to.
pub(super) enum Reconciled {
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
pub(super) async fn reconcile_first(w: &Worker, d: &Claimed) -> Reconciled {
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
