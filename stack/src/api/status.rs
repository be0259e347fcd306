//! Read-only views: `GET /v1/batches/{id}` (counts by channel × state),
//! `GET /v1/batches/{id}/deliveries` (per-recipient rows with their transitions, as the stack
//! contract spells them, whole or `?since=` a cursor it gave), `/healthz` and `/metrics`
//! (Prometheus text).
//!
//! This module must never write.

use std::collections::BTreeMap;
use std::fmt::Write;

use axum::extract::{Path, Query, State as AxState};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};

use super::{ApiError, AppState};
use crate::config::Flaw;

pub(crate) async fn healthz(AxState(st): AxState<AppState>) -> StatusCode {
    match sqlx::query("SELECT 1").execute(&st.pool).await {
        Ok(_) => StatusCode::OK,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

async fn batch_row(st: &AppState, id: &str) -> Result<(String, i32, i32, DateTime<Utc>), ApiError> {
    sqlx::query_as(
        "SELECT template_id, template_version, deliveries, created_at FROM batches WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&st.pool)
    .await?
    .ok_or_else(|| {
        ApiError::field(
            StatusCode::NOT_FOUND,
            "batch_id",
            format!("no batch {id:?}"),
        )
    })
}

pub(crate) async fn batch(
    AxState(st): AxState<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (template_id, version, n, created) = batch_row(&st, &id).await?;
    let counts: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT channel, state, count(*) FROM deliveries WHERE batch_id = $1 GROUP BY channel, state",
    )
    .bind(&id)
    .fetch_all(&st.pool)
    .await?;
    let mut by: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for (ch, state, c) in counts {
        by.entry(ch).or_default().insert(state, c);
    }
    Ok(Json(json!({
        "batch_id": id,
        "template": {"id": template_id, "version": version},
        "created_at": ts(created),
        "deliveries": n,
        "counts": by,
    })))
}

#[derive(sqlx::FromRow)]
struct DeliveryRow {
    id: i64,
    key: String,
    recipient: String,
    channel: String,
    address: String,
    state: String,
    attempts: i32,
    provider_message_id: Option<String>,
    payload_sha256: String,
    last_error: Option<String>,
    last_error_class: Option<String>,
}

#[derive(serde::Deserialize)]
pub(crate) struct Since {
    since: Option<String>,
}

/// A row changed by a transaction that began before a cursor but committed after it carries an
/// `updated_at` before the cursor: an incremental answer looks back this far to include it. Every
/// transaction here is one statement or a short handler, far shorter; should one ever outlast it,
/// the harness's periodic whole request still sees the row.
const SINCE_OVERLAP_S: f64 = 10.0;

pub(crate) async fn deliveries(
    AxState(st): AxState<AppState>,
    Path(id): Path<String>,
    Query(q): Query<Since>,
) -> Result<Json<Value>, ApiError> {
    let since = q
        .since
        .as_deref()
        .map(|s| {
            DateTime::parse_from_rfc3339(s)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|_| ApiError::invalid("since", "not a cursor this API gave"))
        })
        .transpose()?;
    batch_row(&st, &id).await?;
    // One snapshot for the rows, their events and the cursor.
    let mut tx = st.pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let (cursor,): (DateTime<Utc>,) = sqlx::query_as("SELECT now()").fetch_one(&mut *tx).await?;
    let rows: Vec<DeliveryRow> = sqlx::query_as(
        "SELECT id, key, recipient, channel, address, state, attempts, provider_message_id, \
         payload_sha256, last_error, last_error_class FROM deliveries WHERE batch_id = $1 \
         AND ($2::timestamptz IS NULL OR updated_at >= $2 - $3 * interval '1 second') \
         ORDER BY id",
    )
    .bind(&id)
    .bind(since)
    .bind(SINCE_OVERLAP_S)
    .fetch_all(&mut *tx)
    .await?;
    // The rows' transitions, by their ids: a restriction PostgreSQL pushes into each branch of
    // the `delivery_transitions` view (a join to the rows would scan every event instead).
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    type Ev = (i64, String, String, String, Option<String>, DateTime<Utc>);
    let events: Vec<Ev> = sqlx::query_as(
        "SELECT delivery_id, from_state, to_state, source, detail, at FROM delivery_transitions \
         WHERE delivery_id = ANY($1) ORDER BY delivery_id, event_id NULLS LAST, part",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let mut by_delivery: BTreeMap<i64, Vec<Value>> = BTreeMap::new();
    for (did, from, to, source, detail, at) in events {
        by_delivery.entry(did).or_default().push(json!({
            "from": from, "to": to, "source": source, "at": ts(at), "detail": detail,
        }));
    }
    let out: Vec<Value> = rows
        .into_iter()
        .map(|r| {
            json!({
                "key": r.key,
                "recipient": r.recipient,
                "channel": r.channel,
                "address": r.address,
                "state": r.state,
                "attempts": r.attempts,
                "provider_message_id": r
                    .provider_message_id
                    .filter(|_| !st.cfg.flaws.has(Flaw::StatusWithoutMessageId)),
                "payload_sha256": r.payload_sha256,
                "last_error": r.last_error,
                "last_error_class": r.last_error_class,
                "transitions": by_delivery.remove(&r.id).unwrap_or_default(),
            })
        })
        .collect();
    let cursor = cursor.to_rfc3339_opts(SecondsFormat::Micros, true);
    Ok(Json(
        json!({"batch_id": id, "deliveries": out, "cursor": cursor}),
    ))
}

fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

pub(crate) async fn metrics(AxState(st): AxState<AppState>) -> Result<impl IntoResponse, ApiError> {
    let mut out = String::new();
    let by_state: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT channel, state, count(*) FROM deliveries GROUP BY channel, state ORDER BY 1, 2",
    )
    .fetch_all(&st.pool)
    .await?;
    out.push_str(
        "# HELP ting_deliveries Deliveries by channel and state.\n# TYPE ting_deliveries gauge\n",
    );
    for (ch, s, n) in by_state {
        let _ = writeln!(out, "ting_deliveries{{channel=\"{ch}\",state=\"{s}\"}} {n}");
    }
    let (oldest,): (Option<f64>,) = sqlx::query_as(
        "SELECT EXTRACT(EPOCH FROM now() - min(next_attempt_at))::float8 FROM deliveries \
         WHERE state IN ('pending', 'retryable') AND next_attempt_at <= now()",
    )
    .fetch_one(&st.pool)
    .await?;
    out.push_str(
        "# HELP ting_oldest_ready_age_seconds Age of the oldest delivery due and unclaimed.\n",
    );
    let _ = writeln!(
        out,
        "# TYPE ting_oldest_ready_age_seconds gauge\nting_oldest_ready_age_seconds {}",
        oldest.unwrap_or(0.0)
    );
    let (expired,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM delivery_transitions \
         WHERE source = 'rescuer' AND from_state = 'sending'",
    )
    .fetch_one(&st.pool)
    .await?;
    out.push_str("# HELP ting_lease_expirations_total Leases recovered by the rescuer.\n");
    let _ = writeln!(
        out,
        "# TYPE ting_lease_expirations_total counter\nting_lease_expirations_total {expired}"
    );
    // Counted where each attempt's outcome was classified (worker, rescuer, callbacks): the
    // class rides on the one transition per attempt that leaves `sending`.
    let attempts: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT i.channel, t.outcome_class, count(*) FROM delivery_transitions t \
         JOIN delivery_items i ON i.id = t.delivery_id \
         WHERE t.outcome_class IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(&st.pool)
    .await?;
    out.push_str(
        "# HELP ting_attempts_total Provider attempts by channel and outcome class \
         (accepted, transient, ambiguous, permanent).\n",
    );
    out.push_str("# TYPE ting_attempts_total counter\n");
    for (ch, class, n) in attempts {
        let _ = writeln!(
            out,
            "ting_attempts_total{{channel=\"{ch}\",class=\"{class}\"}} {n}"
        );
    }
    let (sum, count, current): (Option<f64>, i64, Option<f64>) = sqlx::query_as(
        "SELECT (SELECT sum(EXTRACT(EPOCH FROM e.at - d.submitted_at))::float8 \
                 FROM delivery_transitions e JOIN deliveries d ON d.id = e.delivery_id \
                 WHERE e.from_state = 'submitted'), \
                (SELECT count(*) FROM delivery_transitions WHERE from_state = 'submitted'), \
                (SELECT max(EXTRACT(EPOCH FROM now() - submitted_at))::float8 FROM deliveries \
                 WHERE state = 'submitted')",
    )
    .fetch_one(&st.pool)
    .await?;
    out.push_str(
        "# HELP ting_submitted_seconds Time from provider acceptance to the final report.\n",
    );
    out.push_str("# TYPE ting_submitted_seconds summary\n");
    let _ = writeln!(
        out,
        "ting_submitted_seconds_sum {}\nting_submitted_seconds_count {count}",
        sum.unwrap_or(0.0)
    );
    let _ = writeln!(
        out,
        "# HELP ting_submitted_oldest_seconds Longest time a delivery now in submitted has waited.\n\
         # TYPE ting_submitted_oldest_seconds gauge\nting_submitted_oldest_seconds {}",
        current.unwrap_or(0.0)
    );
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out))
}
