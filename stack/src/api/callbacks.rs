//! Provider callbacks: SMS status callbacks (Twilio-signed, form-encoded) and e-mail delivery
//! events (HMAC-SHA256-signed JSON).
//!
//! A bad signature is 403 and changes nothing. A callback is deduplicated on its idempotency
//! token (in the same transaction as its effect) and applied through the compare-and-set
//! function, so duplicates, stale reports and reports after a terminal state are acknowledged
//! (200) and change nothing. E-mail events other than `delivered` and `bounced` are
//! informational and never move a delivery. Unknown ids are logged. This module must never write
//! a state directly (except under the `naive-callbacks` and `email-event-regression` flaws).

use axum::body::Bytes;
use axum::extract::{Query, State as AxState};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use super::{ApiError, AppState};
use crate::channels::{class, sms};
use crate::config::Flaw;
use crate::state::{self, Fence, Source, State, Transition, Updates};

#[derive(Deserialize)]
pub(crate) struct SmsQuery {
    d: Option<i64>,
}

pub(crate) async fn sms(
    st: AxState<AppState>,
    q: Query<SmsQuery>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let slot = match st.callbacks.admit().await {
        Ok(slot) => slot,
        Err(busy) => return busy,
    };
    to_completion(slot, apply_sms(st, q, uri, headers, body)).await
}

/// Runs a callback's work on its own task, so it finishes even when the provider stops waiting.
///
/// axum drops a handler's future when its client hangs up. A provider that gives up on a slow
/// answer (a busy database) and retries would otherwise cancel the work it asked for, often
/// after most of it was done, and the retry would start over: each retry adds load to the very
/// thing that is slow, until the provider gives up for good (seen in `restart-midway` on a loaded
/// machine: e-mail events timed out four times and 59 deliveries stayed `submitted`). Run to
/// completion, a retry finds its receipt and is answered at once. The task holds `slot` (its
/// admission, `shed.rs`) until the work is done.
async fn to_completion(
    slot: tokio::sync::OwnedSemaphorePermit,
    work: impl std::future::Future<Output = Result<StatusCode, ApiError>> + Send + 'static,
) -> Response {
    let work = async move {
        let done = work.await;
        drop(slot);
        done
    };
    tokio::spawn(work)
        .await
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "callback task failed");
            Err(ApiError::status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error",
            ))
        })
        .into_response()
}

async fn apply_sms(
    AxState(st): AxState<AppState>,
    Query(q): Query<SmsQuery>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let params: Vec<(String, String)> = serde_urlencoded::from_bytes(&body)
        .map_err(|e| ApiError::field(StatusCode::BAD_REQUEST, "body", e.to_string()))?;
    let got = headers
        .get("x-twilio-signature")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let pq = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/v1/callbacks/sms");
    let host = headers.get("host").and_then(|v| v.to_str().ok());
    let token = &st.cfg.sms_auth_token;
    let signed = [host, Some(st.cfg.api_addr.as_str())]
        .into_iter()
        .flatten()
        .any(|h| sms::verify_twilio(token, &format!("http://{h}{pq}"), &params, got));
    if !signed && !st.cfg.flaws.has(Flaw::TrustForgedCallbacks) {
        tracing::warn!(uri = %uri, "sms callback with a bad signature");
        return Err(ApiError::status(StatusCode::FORBIDDEN, "bad signature"));
    }
    let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let sid = param("MessageSid")
        .or_else(|| param("SmsSid"))
        .unwrap_or_default();
    let status = param("MessageStatus")
        .or_else(|| param("SmsStatus"))
        .unwrap_or_default();
    let report = sms::report(
        &status,
        param("ErrorCode"),
        param("ErrorMessage").as_deref(),
    );

    let mut tx = st.pool.begin().await?;
    if let Some(tok) = headers
        .get("i-twilio-idempotency-token")
        .and_then(|v| v.to_str().ok())
    {
        if !first_receipt(&mut tx, "sms", tok).await? {
            tracing::debug!(sid, tok, "duplicate sms callback");
            return Ok(StatusCode::OK);
        }
    }
    let row: Option<(i64,)> = sqlx::query_as(
        "SELECT id FROM deliveries WHERE provider_message_id = $1 AND channel = 'sms' \
         UNION ALL SELECT id FROM deliveries WHERE id = $2 AND channel = 'sms' \
         AND (provider_message_id IS NULL OR provider_message_id = $1) LIMIT 1",
    )
    .bind(&sid)
    .bind(q.d)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((id,)) = row else {
        tracing::warn!(sid, status, "sms callback for an unknown message");
        tx.commit().await?;
        return Ok(StatusCode::OK);
    };
    let (to, error) = match report {
        sms::Report::Delivered => (State::Delivered, None),
        sms::Report::Failed(e) => (
            State::PermanentFailure,
            Some((class::PERMANENT.to_string(), e)),
        ),
        sms::Report::Pending => (State::Submitted, None),
    };
    if st.cfg.flaws.has(Flaw::NaiveCallbacks) {
        // Flaw: believe every callback as it comes, even one that regresses a final state.
        let detail = format!("sms status {status} for {sid} (applied naively)");
        apply_naively(&mut tx, id, to, Some(&sid), detail).await?;
        tx.commit().await?;
        return Ok(StatusCode::OK);
    }
    // A final report also settles a row the horizon sweep left `unknown`.
    let from: &[State] = match to {
        State::Submitted => &[State::Sending],
        _ => &[State::Sending, State::Submitted, State::Unknown],
    };
    let t = Transition {
        delivery_id: id,
        from,
        to,
        source: Source::Callback,
        detail: Some(format!("sms status {status} for {sid}")),
        fence: Fence::None,
        set: Updates {
            provider_message_id: Some(sid.clone()).filter(|s| !s.is_empty()),
            outcome_class: Some(report_class(to)),
            error,
            poll_in: Some(crate::worker::first_poll(&st.cfg, rand::random())),
            ..Updates::default()
        },
    };
    if state::transition(&mut tx, &t).await?.is_none() {
        tracing::debug!(sid, status, "stale or duplicate sms callback ignored");
    }
    tx.commit().await?;
    Ok(StatusCode::OK)
}

#[derive(Deserialize)]
struct EmailEvent {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    message_id: String,
    #[serde(default)]
    reason: Option<String>,
}

pub(crate) async fn email(st: AxState<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let slot = match st.callbacks.admit().await {
        Ok(slot) => slot,
        Err(busy) => return busy,
    };
    to_completion(slot, apply_email(st, headers, body)).await
}

async fn apply_email(
    AxState(st): AxState<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let got = headers
        .get("x-ting-signature")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !verify_email(&st.cfg.smtp_events_secret, &body, got)
        && !st.cfg.flaws.has(Flaw::TrustForgedCallbacks)
    {
        tracing::warn!("e-mail event with a bad signature");
        return Err(ApiError::status(StatusCode::FORBIDDEN, "bad signature"));
    }
    let ev: EmailEvent = serde_json::from_slice(&body)
        .map_err(|e| ApiError::field(StatusCode::BAD_REQUEST, "body", e.to_string()))?;
    let mid = if ev.message_id.starts_with('<') {
        ev.message_id.clone()
    } else {
        format!("<{}>", ev.message_id)
    };
    let mut tx = st.pool.begin().await?;
    if !first_receipt(&mut tx, "email", &ev.id).await? {
        return Ok(StatusCode::OK);
    }
    let row: Option<(i64,)> =
        sqlx::query_as("SELECT id FROM deliveries WHERE correlation_id = $1 AND channel = 'email'")
            .bind(&mid)
            .fetch_optional(&mut *tx)
            .await?;
    let Some((id,)) = row else {
        tracing::warn!(message_id = %mid, "e-mail event for an unknown message");
        tx.commit().await?;
        return Ok(StatusCode::OK);
    };
    let Some(kind) = EmailEventKind::parse(&ev.kind) else {
        tracing::info!(kind = %ev.kind, "e-mail event type ignored");
        tx.commit().await?;
        return Ok(StatusCode::OK);
    };
    let detail = format!("e-mail event {} {}", ev.id, ev.kind);
    if st.cfg.flaws.has(Flaw::EmailEventRegression) {
        // Flaw: every event moves the row to the state it suggests, in arrival order, with no
        // regression guard: a `processed` or `deferred` arriving after `delivered` moves it back.
        if let Some(to) = kind.naive_state() {
            apply_naively(&mut tx, id, to, None, detail).await?;
        }
        tx.commit().await?;
        return Ok(StatusCode::OK);
    }
    let Some(to) = kind.final_state() else {
        tracing::debug!(event = %ev.id, kind = %ev.kind, "informational e-mail event");
        tx.commit().await?;
        return Ok(StatusCode::OK);
    };
    let error = (to == State::PermanentFailure).then(|| {
        (
            class::PERMANENT.to_string(),
            ev.reason.clone().unwrap_or_else(|| "bounced".into()),
        )
    });
    let t = Transition {
        delivery_id: id,
        from: &[State::Sending, State::Submitted, State::Unknown],
        to,
        source: Source::Callback,
        detail: Some(detail),
        fence: Fence::None,
        set: Updates {
            outcome_class: Some(report_class(to)),
            error,
            // The event names the message: a row its worker never finished (killed mid-send,
            // held `unknown`) learns its Message-ID here, so the status API can show it.
            provider_message_id: Some(mid.clone()),
            ..Updates::default()
        },
    };
    if state::transition(&mut tx, &t).await?.is_none() {
        tracing::debug!(event = %ev.id, "stale or duplicate e-mail event ignored");
    }
    tx.commit().await?;
    Ok(StatusCode::OK)
}

/// The e-mail event types (docs/stack-contract.md) and what each may do to a delivery
/// (stack/STATE_MACHINE.md, "E-mail delivery events").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EmailEventKind {
    Processed,
    Deferred,
    Delivered,
    Bounced,
    Complained,
}

impl EmailEventKind {
    fn parse(s: &str) -> Option<EmailEventKind> {
        Some(match s {
            "processed" => EmailEventKind::Processed,
            "deferred" => EmailEventKind::Deferred,
            "delivered" => EmailEventKind::Delivered,
            "bounced" => EmailEventKind::Bounced,
            "complained" => EmailEventKind::Complained,
            _ => return None,
        })
    }

    /// The final state the event establishes; `None` for the informational ones, which never
    /// move a delivery (`processed`, `deferred` say less than a state already reached;
    /// `complained` comes after `delivered` and does not undo it).
    fn final_state(self) -> Option<State> {
        match self {
            EmailEventKind::Delivered => Some(State::Delivered),
            EmailEventKind::Bounced => Some(State::PermanentFailure),
            _ => None,
        }
    }

    /// What the `email-event-regression` flaw believes each event means.
    fn naive_state(self) -> Option<State> {
        match self {
            EmailEventKind::Processed | EmailEventKind::Deferred => Some(State::Submitted),
            EmailEventKind::Complained => None,
            other => other.final_state(),
        }
    }
}

/// The `naive-callbacks` and `email-event-regression` flaws: write the state a callback
/// suggests whatever the row's state, bypassing the compare-and-set. The change is recorded like
/// any other, so the stack's own history shows what it believed.
async fn apply_naively(
    tx: &mut sqlx::PgConnection,
    id: i64,
    to: State,
    provider_message_id: Option<&str>,
    detail: String,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "WITH old AS (SELECT id, state FROM delivery_state WHERE id = $1 FOR UPDATE) \
         UPDATE delivery_state d SET state = $2, \
         provider_message_id = COALESCE($3, d.provider_message_id), head_from = old.state, \
         head_source = 'callback', head_detail = $4, head_outcome_class = NULL, \
         head_at = clock_timestamp(), \
         head_claimed_by = CASE WHEN old.state = 'sending' THEN d.lease_owner END \
         FROM old WHERE d.id = old.id",
    )
    .bind(id)
    .bind(to.as_str())
    .bind(provider_message_id)
    .bind(detail)
    .execute(tx)
    .await?;
    Ok(())
}

/// The attempt outcome a report implies when it overtakes the worker's own record (it is counted
/// only on an edge that leaves `sending`).
fn report_class(to: State) -> &'static str {
    match to {
        State::PermanentFailure => class::PERMANENT,
        _ => class::ACCEPTED,
    }
}

/// `X-Ting-Signature: sha256=<hex HMAC-SHA256(secret, raw body)>`, checked in constant time.
pub(crate) fn verify_email(secret: &str, body: &[u8], header: &str) -> bool {
    let Some(hex_sig) = header.strip_prefix("sha256=") else {
        return false;
    };
    let Ok(sig) = hex::decode(hex_sig.trim()) else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("hmac takes any key");
    mac.update(body);
    mac.verify_slice(&sig).is_ok()
}

/// Records a callback token; false if it was seen before.
async fn first_receipt(
    conn: &mut sqlx::PgConnection,
    provider: &str,
    token: &str,
) -> Result<bool, sqlx::Error> {
    let r = sqlx::query(
        "INSERT INTO callback_receipts (provider, token) VALUES ($1, $2) ON CONFLICT DO NOTHING",
    )
    .bind(provider)
    .bind(token)
    .execute(conn)
    .await?;
    Ok(r.rows_affected() == 1)
}
