//! The push handler: auth → retry-key syntax → body → `on_request` hook (and the link fate it
//! returns, [`crate::link`]) → attempt number → rate limit (or an outage: 503 or no answer,
//! [`crate::outage`]) → retry-key repeat → seeded faults → latency → ledger → `before_response`
//! hook → answer (or a reset instead).
//!
//! Every request is recorded, protocol errors included. An accepted send is committed to the
//! ledger before the hook runs and before a byte of the answer is written.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use axum::extract::{ConnectInfo, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use bytes::Bytes;
use serde_json::{json, Value};
use uuid::Uuid;

use super::{body, AcceptedKey, LineState, SentMessage};
use crate::decide::{self, Verdict};
use crate::http::{detached, sha256_hex, ConnCut, Reply};
use crate::ledger::{EntryKind, LedgerEntry, Outcome, Provider};
use crate::link::{self, LinkFault, Next};

const AUTH_FAILED: &str =
    "Authentication failed. Confirm that the access token in the authorization header is valid.";
const BAD_TO: &str = "The property, 'to', in the request body is invalid (line: -, column: -)";
const RATE_LIMITED: &str = "The API rate limit has been exceeded. Try again later.";
const MONTHLY_LIMIT: &str = "You have reached your monthly limit.";
const KEY_ACCEPTED: &str = "The retry key is already accepted";
const UNAVAILABLE: &str = "Service Unavailable";
const BAD_KEY: &str = "The value of the X-Line-Retry-Key header is invalid";
const TOO_LARGE: &str = "The request body is too large";

pub(super) async fn push(
    State(st): State<LineState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(conn): Extension<ConnCut>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    // A body past the server's limit is refused in LINE's JSON shape and recorded, like every
    // other refusal, not with the HTTP stack's plain-text 413 that never reaches the ledger.
    let body = match body {
        Ok(b) => b,
        Err(rejection) => {
            let status = rejection.status().as_u16();
            let mut d = LedgerEntry::draft(Provider::Line, EntryKind::Send, "");
            d.outcome = Outcome::ProtocolError;
            d.status = status.to_string();
            d.error = Some(TOO_LARGE.into());
            d.peer = Some(peer);
            st.inner.hub.ledger.record(d);
            return Reply::json(status, json!({ "message": TOO_LARGE })).into_response();
        }
    };
    let cfg = st.inner.hub.line.get();
    // A held request must see its sender hang up, which only a detached task does.
    let inline = crate::http::no_latency(&cfg.latency)
        && cfg.outage.is_none()
        && !st.inner.hub.link_faults_armed();
    detached(inline, conn, handle(st, peer, headers, body)).await
}

/// What the fake decided for a well-formed push.
enum Decision {
    Repeat(AcceptedKey),
    RateLimited(std::time::Duration),
    BadAddress {
        seeded: bool,
    },
    Fault {
        fault: crate::config::HttpFault,
        permanent: bool,
        sent: Vec<SentMessage>,
    },
    Accept(Vec<SentMessage>),
}

async fn handle(st: LineState, peer: SocketAddr, headers: HeaderMap, raw: Bytes) -> Reply {
    let hub = st.inner.hub.clone();
    let cfg = hub.line.get();
    let request_uuid = crate::http::random_uuid();
    let request_id = request_uuid.to_string();
    let reply = |status: u16, json: Value| {
        Reply::json(status, json).header("x-line-request-id", request_id.clone())
    };
    let protocol_error = |to: &str, status: u16, error: &str, key: Option<String>| {
        let mut d = LedgerEntry::draft(Provider::Line, EntryKind::Send, to);
        d.outcome = Outcome::ProtocolError;
        d.status = status.to_string();
        d.error = Some(error.to_string());
        d.peer = Some(peer);
        d.idempotency_key = key;
        hub.ledger.record(d);
    };

    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if token != Some(cfg.channel_token.as_str()) {
        protocol_error("", 401, AUTH_FAILED, None);
        return reply(401, json!({ "message": AUTH_FAILED }));
    }
    let retry_key = match headers.get("x-line-retry-key") {
        None => None,
        Some(v) => match v.to_str().ok().and_then(canonical_uuid) {
            Some(k) => Some(k),
            None => {
                let raw_key = String::from_utf8_lossy(v.as_bytes()).into_owned();
                protocol_error("", 400, BAD_KEY, Some(raw_key));
                return reply(400, json!({ "message": BAD_KEY }));
            }
        },
    };
    let push = match body::parse(&raw) {
        Ok(p) => p,
        Err(inv) => {
            let body = inv.body();
            protocol_error(
                inv.to.as_deref().unwrap_or(""),
                400,
                &body.to_string(),
                retry_key.map(|k| k.to_string()),
            );
            return reply(400, body);
        }
    };

    let received_ns = hub.ledger.now_ns();
    let fate = hub.ledger.on_request(Provider::Line, peer).await;
    let next = link::before_serving_http(fate).await;
    let attempt = hub.ledger.next_attempt(Provider::Line, &push.to);
    let mut d = LedgerEntry::draft(Provider::Line, EntryKind::Send, push.to.clone());
    d.attempt = attempt;
    d.received_ns = received_ns;
    d.peer = Some(peer);
    d.idempotency_key = retry_key.map(|k| k.to_string());
    d.payload_hash = Some(sha256_hex(push.messages_json().as_bytes()));
    d.body = Some(push.texts.join("\n"));
    let reset = match next {
        Next::Serve { reset } => reset,
        Next::Skip(fault) => {
            link::mark_not_served(&mut d, fault);
            hub.ledger.record(d);
            let r = reply(503, json!({ "message": UNAVAILABLE }));
            return if fault == LinkFault::Refuse {
                r.cut()
            } else {
                r
            };
        }
    };
    if let Some(outage) = hub.line.get().outage {
        let (status, hung_up) = crate::outage::answer(&hub, Provider::Line, outage).await;
        d.outcome = Outcome::Transient;
        d.fault = Some(outage.mode.label().into());
        d.status = status;
        d.error = Some(UNAVAILABLE.into());
        d.client_hung_up = hung_up;
        if reset {
            link::mark_reset(&mut d);
        }
        hub.ledger.record(d);
        let r = reply(503, json!({ "message": UNAVAILABLE }));
        return if reset { r.cut() } else { r };
    }
    let decision = decide_push(&st, &push, attempt, retry_key, request_uuid);
    let delay = decide::latency(hub.seed, Provider::Line, &push.to, attempt, &cfg.latency);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }

    let ids = |sent: &[SentMessage]| {
        sent.iter()
            .map(|m| m.id.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let (status, json, extra) = match decision {
        Decision::Accept(sent) => {
            d.outcome = Outcome::Accepted;
            d.message_id = Some(ids(&sent));
            (200, json!({ "sentMessages": sent_json(&sent) }), None)
        }
        Decision::Repeat(orig) => {
            d.outcome = Outcome::IdempotentRepeat;
            d.message_id = Some(ids(&orig.sent));
            d.error = Some(KEY_ACCEPTED.into());
            let body = json!({ "message": KEY_ACCEPTED, "sentMessages": sent_json(&orig.sent) });
            (
                409,
                body,
                Some(("x-line-accepted-request-id", orig.request_id.to_string())),
            )
        }
        Decision::RateLimited(wait) => {
            let secs = decide::retry_after_secs(wait);
            d.outcome = Outcome::Transient;
            d.fault = Some("rate_limit".into());
            d.error = Some(RATE_LIMITED.into());
            d.retry_after_ms = Some(decide::retry_after_ms(secs));
            (
                429,
                json!({ "message": RATE_LIMITED }),
                Some(("retry-after", secs.to_string())),
            )
        }
        Decision::BadAddress { seeded } => {
            d.outcome = Outcome::Permanent;
            d.fault = seeded.then(|| "bad_address".into());
            d.error = Some(BAD_TO.into());
            (400, json!({ "message": BAD_TO }), None)
        }
        Decision::Fault {
            fault,
            permanent,
            sent,
        } => {
            let message = fault_message(&fault);
            d.outcome = if fault.after_commit {
                d.message_id = Some(ids(&sent));
                Outcome::Accepted
            } else if permanent || fault.monthly_quota {
                Outcome::Permanent
            } else {
                Outcome::Transient
            };
            d.fault = Some(decide::label(&fault));
            d.error = Some(message.into());
            // The header is whole seconds; the ledger records what was sent.
            let secs = fault.retry_after.map(|r| decide::retry_after_secs(r.0));
            d.retry_after_ms = secs.map(decide::retry_after_ms);
            let extra = secs.map(|s| ("retry-after", s.to_string()));
            (fault.status, json!({ "message": message }), extra)
        }
    };
    d.status = status.to_string();
    d.client_hung_up = crate::http::client_gone();
    if reset {
        link::mark_reset(&mut d);
    }
    let entry = hub.ledger.record(d);
    if entry.outcome == Outcome::Accepted {
        hub.ledger.before_response(&entry).await;
    }
    let mut r = reply(status, json);
    if let Some((k, v)) = extra {
        r = r.header(k, v);
    }
    if reset {
        r = r.cut();
    }
    r
}

/// Makes every stateful and seeded decision for one push, atomically with respect to its retry
/// key: a key is marked accepted in the same critical section that decides to accept it.
fn decide_push(
    st: &LineState,
    push: &body::Push,
    attempt: u32,
    retry_key: Option<Uuid>,
    request_id: Uuid,
) -> Decision {
    let inner = &st.inner;
    let hub = &inner.hub;
    let cfg = hub.line.get();
    if let Some(rate) = cfg.rate_limit {
        if let Err(wait) = inner.limiter.try_take(rate) {
            return Decision::RateLimited(wait);
        }
    }
    let mut keys = inner.keys.lock().unwrap_or_else(|p| p.into_inner());
    let key = retry_key.filter(|_| cfg.idempotency);
    if let Some(orig) = key.and_then(|k| keys.get(&k)) {
        return Decision::Repeat(orig.clone());
    }
    if !body::is_user_id(&push.to) {
        return Decision::BadAddress { seeded: false };
    }
    let verdict = decide::decide(
        hub.seed,
        Provider::Line,
        &push.to,
        attempt,
        cfg.bad_addresses,
        &cfg.sticky,
        &cfg.permanent,
        &cfg.transient,
    );
    let commit = |keys: &mut std::collections::HashMap<Uuid, AcceptedKey>| {
        let sent = new_sent(st, push.messages.len());
        if let Some(k) = key {
            let sent = sent.clone().into_boxed_slice();
            keys.insert(k, AcceptedKey { request_id, sent });
        }
        sent
    };
    match verdict {
        Verdict::BadAddress => Decision::BadAddress { seeded: true },
        Verdict::Fault { fault, permanent } => Decision::Fault {
            sent: if fault.after_commit {
                commit(&mut keys)
            } else {
                Vec::new()
            },
            fault: fault.into_owned(),
            permanent,
        },
        Verdict::Accept => Decision::Accept(commit(&mut keys)),
    }
}

/// A retry key in the canonical 8-4-4-4-12 hyphenated form (hex digits of either case), as the
/// UUID it spells (whose text is the key lowercased); `None` for anything else, including the
/// braced, `urn:uuid:` and unhyphenated forms `Uuid::parse_str` would accept.
pub(crate) fn canonical_uuid(key: &str) -> Option<Uuid> {
    let b = key.as_bytes();
    let ok = b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        });
    if !ok {
        return None;
    }
    Uuid::try_parse(key).ok()
}

fn new_sent(st: &LineState, n: usize) -> Vec<SentMessage> {
    (0..n)
        .map(|_| SentMessage {
            id: st.inner.next_id.fetch_add(1, Ordering::Relaxed),
            token: rand::random(),
        })
        .collect()
}

fn sent_json(sent: &[SentMessage]) -> Vec<Value> {
    sent.iter()
        .map(|m| json!({ "id": m.id.to_string(), "quoteToken": m.quote_token() }))
        .collect()
}

/// LINE's message for an injected fault's status.
fn fault_message(fault: &crate::config::HttpFault) -> &'static str {
    match fault.status {
        429 if fault.monthly_quota => MONTHLY_LIMIT,
        429 => RATE_LIMITED,
        400 => BAD_TO,
        401 => AUTH_FAILED,
        403 => "The bot is not authorized to use this API.",
        404 => "Not found",
        500 => "An error occurred in the server",
        502..=504 => "The server is temporarily unavailable",
        _ => "Request failed",
    }
}

#[cfg(test)]
mod tests {
    use super::canonical_uuid;

    #[test]
    fn only_the_canonical_uuid_form_is_a_retry_key() {
        let cases = [
            ("123e4567-e89b-12d3-a456-426614174000", true),
            ("123E4567-E89B-12D3-A456-426614174000", true),
            ("{123e4567-e89b-12d3-a456-426614174000}", false),
            ("urn:uuid:123e4567-e89b-12d3-a456-426614174000", false),
            ("123e4567e89b12d3a456426614174000", false),
            ("123e4567-e89b-12d3-a456-42661417400g", false),
            ("123e4567-e89b-12d3-a456_426614174000", false),
            (" 123e4567-e89b-12d3-a456-426614174000", false),
            ("", false),
            ("not-a-uuid", false),
        ];
        for (key, ok) in cases {
            assert_eq!(canonical_uuid(key).is_some(), ok, "{key:?}");
        }
        // One key whatever the case, written back lowercased (what the ledger records).
        let upper = canonical_uuid("123E4567-E89B-12D3-A456-426614174000").unwrap();
        let lower = canonical_uuid("123e4567-e89b-12d3-a456-426614174000").unwrap();
        assert_eq!(upper, lower);
        assert_eq!(upper.to_string(), "123e4567-e89b-12d3-a456-426614174000");
        let mixed = "123e4567-E89B-12d3-A456-426614174000";
        assert_eq!(
            canonical_uuid(mixed).unwrap().to_string(),
            mixed.to_ascii_lowercase()
        );
    }
}
