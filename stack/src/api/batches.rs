//! `POST /v1/batches`: parse and validate the whole batch, render every recipient's payload once,
//! and insert the batch and all its deliveries in one transaction with one multi-row INSERT.
//!
//! Nothing is written unless everything is valid; a repeated batch id answers 200 and creates
//! nothing. A batch of at most [`SMALL_BATCH`] recipients (a transactional order) is claimed
//! before larger ones (campaigns). This handler must never call a provider.

use std::collections::HashSet;

use axum::body::{to_bytes, Body};
use axum::extract::State as AxState;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{ApiError, AppState};
use crate::channels::Channel;
use crate::config::Flaw;
use crate::render::{self, Renderer, TemplateIn};

/// Batches of at most this many recipients are transactional orders: their deliveries get
/// priority 0 and are claimed before any campaign's (priority 1), so an order confirmation never
/// waits for a newsletter to drain (`claim::CLAIM_SQL`).
pub const SMALL_BATCH: usize = 100;

#[derive(Deserialize)]
struct BatchIn {
    batch_id: String,
    template: TemplateIn,
    channels: Vec<String>,
    recipients: Vec<RecipientIn>,
}

#[derive(Deserialize)]
struct RecipientIn {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    line_user_id: Option<String>,
    #[serde(default)]
    email: Option<String>,
    #[serde(default)]
    phone: Option<String>,
    #[serde(default)]
    vars: serde_json::Map<String, Value>,
}

/// The validated, rendered rows of one batch (column arrays for `UNNEST`).
#[derive(Default)]
struct Rows {
    key: Vec<String>,
    recipient: Vec<String>,
    channel: Vec<String>,
    address: Vec<String>,
    payload: Vec<Value>,
    sha: Vec<String>,
    correlation: Vec<String>,
}

pub(crate) async fn create(
    AxState(st): AxState<AppState>,
    body: Body,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let limit = st.cfg.max_body_bytes;
    let bytes = to_bytes(body, limit).await.map_err(|_| {
        ApiError::field(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body",
            format!("body exceeds {limit} bytes"),
        )
    })?;
    let batch: BatchIn = parse(&bytes)?;
    let rows = validate(&st, &batch)?;
    let n = rows.key.len() as i32;
    if st.cfg.flaws.has(Flaw::ApiLosesBatch) {
        // Flaw: answer first, write behind. A process that dies before the write (a kill, a
        // deploy's SIGTERM: the runtime drops the task) loses a batch it answered 202 for.
        let (st, id) = (st.clone(), batch.batch_id.clone());
        tokio::spawn(async move {
            tokio::time::sleep(WRITE_BEHIND).await;
            if let Err(e) = store(&st, &batch, rows).await {
                tracing::warn!(batch = %batch.batch_id, error = ?e, "write-behind failed");
            }
        });
        return Ok((
            StatusCode::ACCEPTED,
            Json(json!({"batch_id": id, "deliveries": n})),
        ));
    }
    store(&st, &batch, rows).await
}

/// How long the `api-loses-batch` flaw waits before it writes a batch it has answered for.
const WRITE_BEHIND: std::time::Duration = std::time::Duration::from_millis(1_000);

/// Inserts the batch and its deliveries in one transaction, or answers the repeat of one.
async fn store(
    st: &AppState,
    batch: &BatchIn,
    rows: Rows,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let n = rows.key.len() as i32;

    let mut tx = st.front.begin().await?;
    let inserted: Option<(String,)> = sqlx::query_as(
        "INSERT INTO batches (id, template_id, template_version, deliveries) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (id) DO NOTHING RETURNING id",
    )
    .bind(&batch.batch_id)
    .bind(&batch.template.id)
    .bind(batch.template.version)
    .bind(n)
    .fetch_optional(&mut *tx)
    .await?;
    if inserted.is_none() && st.cfg.flaws.has(Flaw::NonIdempotentBatch) {
        // Flaw: a repeated batch id inserts its deliveries again, under fresh keys.
        tx.rollback().await?;
        let mut tx = st.front.begin().await?;
        let (n_before,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM deliveries WHERE batch_id = $1")
                .bind(&batch.batch_id)
                .fetch_one(&mut *tx)
                .await?;
        let mut again = rows;
        for (k, key) in again.key.iter_mut().enumerate() {
            *key = format!("{key}#{n_before}");
            let ch = Channel::parse(&again.channel[k]).ok_or_else(|| {
                ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "unknown channel")
            })?;
            again.correlation[k] = render::correlation_id(key, ch);
        }
        insert_deliveries(&mut tx, batch, &again).await?;
        tx.commit().await?;
        return Ok((
            StatusCode::ACCEPTED,
            Json(json!({"batch_id": batch.batch_id, "deliveries": n})),
        ));
    }
    if inserted.is_none() {
        tx.rollback().await?;
        let (count,): (i32,) = sqlx::query_as("SELECT deliveries FROM batches WHERE id = $1")
            .bind(&batch.batch_id)
            .fetch_one(&st.front)
            .await?;
        if st.cfg.flaws.has(Flaw::WholeBatchReplay) {
            // Flaw: a repeated batch replays every delivery, delivered ones included.
            sqlx::query(
                "UPDATE delivery_state s SET state = 'pending', next_attempt_at = now(), \
                 lease_owner = NULL, lease_expires_at = NULL FROM delivery_items i \
                 WHERE i.id = s.id AND i.batch_id = $1",
            )
            .bind(&batch.batch_id)
            .execute(&st.front)
            .await?;
        }
        return Ok((
            StatusCode::OK,
            Json(json!({"batch_id": batch.batch_id, "deliveries": count})),
        ));
    }
    insert_deliveries(&mut tx, batch, &rows).await?;
    tx.commit().await?;
    tracing::info!(batch = %batch.batch_id, deliveries = n, "batch accepted");
    if st.cfg.flaws.has(Flaw::InlineSend) {
        // Flaw: send inside the request instead of leaving it to the workers, and answer only
        // when this order's sends are done. Workers polling the queue may claim some rows first;
        // the request waits for those too, as a handler awaiting its provider calls would, so its
        // latency is the provider's whoever wins the race.
        if let Err(e) = crate::worker::send_inline(st.cfg.clone(), st.front.clone()).await {
            tracing::warn!(error = %format!("{e:#}"), "inline send failed");
        }
        wait_for_sends(&st.front, &batch.batch_id).await;
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"batch_id": batch.batch_id, "deliveries": n})),
    ))
}

/// `inline-send` flaw: waits (at most a minute) until no delivery of `batch_id` is still waiting
/// for or in the middle of its first provider call.
async fn wait_for_sends(pool: &sqlx::PgPool, batch_id: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let open: Result<i64, _> = sqlx::query_scalar(
            "SELECT count(*) FROM deliveries WHERE batch_id = $1 AND state IN ('pending', 'sending')",
        )
        .bind(batch_id)
        .fetch_one(pool)
        .await;
        if !matches!(open, Ok(n) if n > 0) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Inserts a batch's deliveries in one statement (each an item and its state row, `pending`),
/// small batches with priority 0.
async fn insert_deliveries(
    tx: &mut sqlx::PgConnection,
    batch: &BatchIn,
    rows: &Rows,
) -> Result<(), sqlx::Error> {
    let priority: i16 = if batch.recipients.len() <= SMALL_BATCH {
        0
    } else {
        1
    };
    sqlx::query(
        "WITH items AS (INSERT INTO delivery_items (batch_id, template_version, key, recipient, \
         channel, address, payload, payload_sha256, correlation_id) \
         SELECT $1, $2, * FROM UNNEST($3::text[], $4::text[], $5::text[], $6::text[], \
         $7::jsonb[], $8::text[], $9::text[]) RETURNING id) \
         INSERT INTO delivery_state (id, priority) SELECT id, $10 FROM items",
    )
    .bind(&batch.batch_id)
    .bind(batch.template.version)
    .bind(&rows.key)
    .bind(&rows.recipient)
    .bind(&rows.channel)
    .bind(&rows.address)
    .bind(&rows.payload)
    .bind(&rows.sha)
    .bind(&rows.correlation)
    .bind(priority)
    .execute(tx)
    .await?;
    Ok(())
}

/// JSON → `BatchIn`, naming the offending field on error.
fn parse(bytes: &[u8]) -> Result<BatchIn, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.inner().to_string();
        // "missing field `x`" is reported at the parent's path.
        let field = match inner
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next())
        {
            Some(f) if path == "." => f.to_string(),
            Some(f) => format!("{path}.{f}"),
            None if path == "." => "body".to_string(),
            None => path,
        };
        ApiError::field(StatusCode::BAD_REQUEST, field, inner)
    })
}

fn validate(st: &AppState, b: &BatchIn) -> Result<Rows, ApiError> {
    if b.batch_id.trim().is_empty() || b.batch_id.len() > 200 {
        return Err(ApiError::invalid("batch_id", "must be 1 to 200 characters"));
    }
    key_part("batch_id", &b.batch_id)?;
    if b.template.id.trim().is_empty() {
        return Err(ApiError::invalid("template.id", "must not be empty"));
    }
    let mut channels = Vec::new();
    for (i, c) in b.channels.iter().enumerate() {
        let ch = Channel::parse(c).ok_or_else(|| {
            ApiError::invalid(format!("channels[{i}]"), format!("unknown channel {c:?}"))
        })?;
        if channels.contains(&ch) {
            return Err(ApiError::invalid(
                format!("channels[{i}]"),
                format!("duplicate channel {c:?}"),
            ));
        }
        channels.push(ch);
    }
    if channels.is_empty() {
        return Err(ApiError::invalid(
            "channels",
            "at least one channel is required",
        ));
    }
    if b.recipients.is_empty() {
        return Err(ApiError::invalid(
            "recipients",
            "at least one recipient is required",
        ));
    }
    if b.recipients.len() > st.cfg.max_recipients {
        return Err(ApiError::field(
            StatusCode::PAYLOAD_TOO_LARGE,
            "recipients",
            format!(
                "{} recipients; at most {} per batch",
                b.recipients.len(),
                st.cfg.max_recipients
            ),
        ));
    }
    let unescaped = st.cfg.flaws.has(Flaw::UnescapedTemplate);
    let renderer = Renderer::compile(&b.template, &channels, unescaped)
        .map_err(|e| ApiError::invalid(e.field, e.message))?
        .with_raw_subject(st.cfg.flaws.has(Flaw::SubjectHeaderInjection));

    let mut rows = Rows::default();
    let mut seen = HashSet::new();
    for (i, r) in b.recipients.iter().enumerate() {
        let at = |f: &str| format!("recipients[{i}].{f}");
        if r.id.trim().is_empty() {
            return Err(ApiError::invalid(at("id"), "must not be empty"));
        }
        key_part(&at("id"), &r.id)?;
        if !seen.insert(r.id.as_str()) {
            return Err(ApiError::invalid(
                at("id"),
                format!("duplicate recipient id {:?}", r.id),
            ));
        }
        let mut ctx = r.vars.clone();
        ctx.insert("id".into(), Value::String(r.id.clone()));
        ctx.insert(
            "name".into(),
            Value::String(r.name.clone().unwrap_or_default()),
        );
        let ctx = Value::Object(ctx);
        for &ch in &channels {
            let address = address(r, ch).map_err(|(f, e)| ApiError::invalid(at(f), e))?;
            let payload = renderer
                .render(ch, &ctx, &at("vars"))
                .map_err(|e| ApiError::invalid(e.field, e.message))?;
            let key = render::delivery_key(&b.batch_id, &r.id, ch);
            rows.sha.push(payload.sha256());
            rows.payload
                .push(serde_json::to_value(&payload).expect("payload serializes"));
            rows.correlation.push(render::correlation_id(&key, ch));
            rows.key.push(key);
            rows.recipient.push(r.id.clone());
            rows.channel.push(ch.as_str().to_string());
            rows.address.push(address);
        }
    }
    Ok(rows)
}

/// A batch or recipient id becomes part of the delivery key `batch:recipient:channel`, so it must
/// not contain the separator: `a:b` + `c` and `a` + `b:c` would be the same key.
fn key_part(field: &str, v: &str) -> Result<(), ApiError> {
    let sep = render::KEY_SEPARATOR;
    if v.contains(sep) {
        return Err(ApiError::invalid(
            field,
            format!("must not contain {sep:?} (the delivery key separator): {v:?}"),
        ));
    }
    Ok(())
}

/// The recipient's address for `ch`, or `(field, why)`.
fn address(r: &RecipientIn, ch: Channel) -> Result<String, (&'static str, String)> {
    let (field, v) = match ch {
        Channel::Line => ("line_user_id", &r.line_user_id),
        Channel::Email => ("email", &r.email),
        Channel::Sms => ("phone", &r.phone),
    };
    let v = v
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or((field, format!("required for channel {}", ch.as_str())))?;
    let ok = match ch {
        Channel::Line => v.len() <= 100 && v.chars().all(|c| c.is_ascii_alphanumeric()),
        Channel::Email => v.parse::<lettre::Address>().is_ok(),
        Channel::Sms => {
            let digits = v.strip_prefix('+').unwrap_or("");
            (8..=15).contains(&digits.len()) && digits.chars().all(|c| c.is_ascii_digit())
        }
    };
    if !ok {
        return Err((
            field,
            format!("{v:?} is not a valid {} address", ch.as_str()),
        ));
    }
    Ok(v.to_string())
}
