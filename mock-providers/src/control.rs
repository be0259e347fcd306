//! The control API every fake serves under `/_mock/` (and the SMTP fake on its own port):
//! read the ledger and stats while the servers keep serving, change a fault profile mid-run,
//! reset everything.
//!
//! `PUT /_mock/faults` is a shallow merge: each top-level field given replaces that field of the
//! provider's profile, fields not given keep their current value. The merged profile must pass
//! the same rules as a scenario's `[providers]` tables ([`crate::validate`]): 422 with the field's
//! `path` otherwise, 400 for what is not a profile at all. The control API must never
//! change what was already recorded; it only reads the ledger or clears it whole.
//!
//! `GET /_mock/ledger` and `GET /_mock/stats` copy the ledger's entry pointers under its lock and
//! filter, count and serialise outside it, so polling a big ledger never stalls the fakes.
//!
//! `POST /_mock/reset`, on any fake's port, resets **all three** providers: they share one ledger
//! and one hub. It forgets every entry, attempt number, stored idempotency key / message and rate
//! limiter state, and drops every delivery report still due; fault profiles are kept. Entry
//! numbers (`seq`) are not reused after a reset, so a reader polling `?since=N` carries on: its
//! next poll returns what was recorded after the reset.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::hub::Hub;
use crate::ledger::{EntryKind, LedgerEntry, Outcome, Provider};
use crate::validate;

#[derive(Clone)]
struct Ctl {
    hub: Arc<Hub>,
    provider: Provider,
}

/// The `/_mock/*` routes for the fake `provider` (whose profile `PUT /_mock/faults` changes).
pub fn router(hub: Arc<Hub>, provider: Provider) -> Router {
    Router::new()
        .route("/_mock/ledger", get(ledger))
        .route("/_mock/stats", get(stats))
        .route("/_mock/faults", get(get_faults).put(put_faults))
        .route("/_mock/reset", post(reset))
        .with_state(Ctl { hub, provider })
}

/// Serves the control API alone (the SMTP fake's control port).
pub async fn run(
    listener: tokio::net::TcpListener,
    hub: Arc<Hub>,
    provider: Provider,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let ledger = hub.ledger.clone();
    crate::http::serve(listener, router(hub, provider), ledger, shutdown).await
}

#[derive(Deserialize)]
struct LedgerQuery {
    provider: Option<Provider>,
    kind: Option<EntryKind>,
    /// Only entries with `seq >= since`.
    since: Option<u64>,
    /// `jsonl` (default) or `json` (one array); anything else is a 400, not the default.
    format: Option<LedgerFormat>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum LedgerFormat {
    Jsonl,
    Json,
}

async fn ledger(State(c): State<Ctl>, Query(q): Query<LedgerQuery>) -> Response {
    // Only the pointers are copied under the ledger lock; filtering and serialising happen here.
    let shared = c.hub.ledger.since_shared(q.since.unwrap_or(0));
    let entries: Vec<&LedgerEntry> = shared
        .iter()
        .map(|e| &**e)
        .filter(|e| q.provider.is_none_or(|p| p == e.provider))
        .filter(|e| q.kind.is_none_or(|k| k == e.kind))
        .collect();
    if q.format == Some(LedgerFormat::Json) {
        return Json(entries).into_response();
    }
    let mut out = Vec::with_capacity(entries.len() * 256);
    for e in &entries {
        serde_json::to_writer(&mut out, e).expect("ledger entries always serialize");
        out.push(b'\n');
    }
    ([("content-type", "application/x-ndjson")], out).into_response()
}

/// Counts by provider: sends by outcome, polls, and callbacks by what the stack answered.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    pub entries: usize,
    pub callbacks_pending: usize,
    pub providers: BTreeMap<String, ProviderStats>,
}

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProviderStats {
    /// Send attempts by outcome (`accepted`, `idempotent_repeat`, `transient`, …).
    pub sends: BTreeMap<String, u64>,
    /// Poll entries: one per read, and for a list read without `To` one more per failed
    /// message it listed.
    pub polls: u64,
    /// Callback tries by answer class (`2xx`, `4xx`, `5xx`, `no_answer`).
    pub callbacks: BTreeMap<String, u64>,
}

/// Computes [`Stats`] over `entries`.
pub fn stats_of<'a>(entries: impl IntoIterator<Item = &'a LedgerEntry>, pending: usize) -> Stats {
    let mut s = Stats {
        entries: 0,
        callbacks_pending: pending,
        providers: BTreeMap::new(),
    };
    for e in entries {
        s.entries += 1;
        let p = s
            .providers
            .entry(e.provider.as_str().to_string())
            .or_default();
        match e.kind {
            EntryKind::Send => *p.sends.entry(outcome_name(e.outcome).into()).or_default() += 1,
            EntryKind::Poll => p.polls += 1,
            EntryKind::Callback => {
                let class = match e.callback_response {
                    Some(c) => format!("{}xx", c / 100),
                    None => "no_answer".into(),
                };
                *p.callbacks.entry(class).or_default() += 1;
            }
        }
    }
    s
}

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Accepted => "accepted",
        Outcome::IdempotentRepeat => "idempotent_repeat",
        Outcome::Transient => "transient",
        Outcome::Permanent => "permanent",
        Outcome::ProtocolError => "protocol_error",
        Outcome::Info => "info",
    }
}

async fn stats(State(c): State<Ctl>) -> Json<Stats> {
    let shared = c.hub.ledger.snapshot_shared();
    let mut s = stats_of(shared.iter().map(|e| &**e), c.hub.pending_callbacks());
    // Protocol errors counted but not kept (`Ledger::protocol_errors`) still count here.
    for pe in c.hub.ledger.protocol_errors() {
        let p = s.providers.entry(pe.provider.as_str().into()).or_default();
        *p.sends.entry("protocol_error".into()).or_default() += pe.seen - pe.kept;
    }
    Json(s)
}

#[derive(Deserialize)]
struct FaultsQuery {
    /// Which provider's profile; defaults to the fake serving the request.
    provider: Option<Provider>,
}

async fn get_faults(State(c): State<Ctl>, Query(q): Query<FaultsQuery>) -> Response {
    let cfg = c.hub.config();
    match q.provider.unwrap_or(c.provider) {
        Provider::Line => Json(cfg.line).into_response(),
        Provider::Sms => Json(cfg.sms).into_response(),
        Provider::Smtp => Json(cfg.smtp).into_response(),
    }
}

async fn put_faults(
    State(c): State<Ctl>,
    Query(q): Query<FaultsQuery>,
    Json(patch): Json<Value>,
) -> Response {
    let hub = &c.hub;
    let result = match q.provider.unwrap_or(c.provider) {
        Provider::Line => checked(&*hub.line.get(), patch, validate::line).map(|n| {
            hub.line.set(n.clone());
            json!(n)
        }),
        Provider::Sms => checked(&*hub.sms.get(), patch, validate::sms).map(|n| {
            hub.sms.set(n.clone());
            json!(n)
        }),
        Provider::Smtp => checked(&hub.smtp_config(), patch, validate::smtp).map(|n| {
            *hub.smtp.write().unwrap_or_else(|p| p.into_inner()) = n.clone();
            json!(n)
        }),
    };
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Why a `PUT /_mock/faults` was refused; the profile in force is unchanged.
enum Refused {
    /// Not a profile at all (not an object, unknown field, wrong type): 400.
    Malformed(String),
    /// A profile that parses but cannot work (the rules a scenario's `[providers]` obey): 422,
    /// naming the field.
    Invalid(validate::Problem),
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Malformed(e) => {
                (StatusCode::BAD_REQUEST, Json(json!({ "error": e }))).into_response()
            }
            Refused::Invalid(p) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(json!({ "error": p.message, "path": p.path() })),
            )
                .into_response(),
        }
    }
}

/// `patch` merged into `current`, if the result passes `rules`.
fn checked<T: Serialize + DeserializeOwned>(
    current: &T,
    patch: Value,
    rules: fn(&T) -> Result<(), validate::Problem>,
) -> Result<T, Refused> {
    let next = merge(current, patch).map_err(Refused::Malformed)?;
    rules(&next).map_err(Refused::Invalid)?;
    Ok(next)
}

/// Replaces each top-level field of `current` given in `patch`.
pub fn merge<T: Serialize + DeserializeOwned>(current: &T, patch: Value) -> Result<T, String> {
    let Value::Object(patch) = patch else {
        return Err("the fault profile must be a JSON object".into());
    };
    let mut v = serde_json::to_value(current).map_err(|e| e.to_string())?;
    let obj = v.as_object_mut().ok_or("profile is not an object")?;
    for (k, val) in patch {
        obj.insert(k, val);
    }
    serde_json::from_value(v).map_err(|e| format!("invalid fault profile: {e}"))
}

async fn reset(State(c): State<Ctl>) -> StatusCode {
    c.hub.reset();
    StatusCode::NO_CONTENT
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LineConfig;

    #[test]
    fn merge_table() {
        let base = LineConfig::default();
        // (patch, Ok(rate_limit, channel_token) or Err)
        type Want = Result<(Option<f64>, &'static str), ()>;
        let cases: Vec<(Value, Want)> = vec![
            (json!({}), Ok((None, "ting-line-token"))),
            (
                json!({"rate_limit": 5.0}),
                Ok((Some(5.0), "ting-line-token")),
            ),
            (
                json!({"channel_token": "x", "bad_addresses": "10%"}),
                Ok((None, "x")),
            ),
            (json!({"no_such_field": 1}), Err(())),
            (json!({"bad_addresses": 2.0}), Err(())),
            (json!([1]), Err(())),
        ];
        for (patch, want) in cases {
            let got = merge(&base, patch.clone())
                .map(|c| (c.rate_limit, c.channel_token.clone()))
                .map_err(|_| ());
            let want = want.map(|(r, t)| (r, t.to_string()));
            assert_eq!(got, want, "patch {patch}");
        }
    }
}
