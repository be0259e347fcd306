//! `POST …/Messages.json`: auth → form → `on_request` hook (and the link fate it returns,
//! [`crate::link`]) → attempt number → outage (503 or no answer, [`crate::outage`]) → rate limit
//! → idempotency key (when on) → address syntax → seeded faults → latency → ledger →
//! `before_response` hook → answer (or a reset instead), then the status callbacks are scheduled.
//!
//! Every request is recorded, protocol errors included. A message is in the store only if the
//! ledger has it as accepted.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::Extension;
use bytes::Bytes;
use tokio::time::Instant;

use super::store::{Origin, Stored};
use super::{authorized, default_code, twilio_error, SmsState};
use crate::callbacks::plan;
use crate::config::HttpFault;
use crate::decide::{self, Verdict};
use crate::http::{detached, sha256_hex, ConnCut, Reply};
use crate::ledger::{EntryKind, LedgerEntry, Outcome, Provider};
use crate::link::{self, LinkFault, Next};
use crate::packed::{Phone, Sid};

pub(super) async fn create(
    State(st): State<SmsState>,
    Path(account): Path<String>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(conn): Extension<ConnCut>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    // A body past the server's limit is refused in Twilio's JSON shape, like every other error,
    // not with the HTTP stack's plain-text 413.
    let body = match body {
        Ok(b) => b,
        Err(rejection) => {
            let status = rejection.status().as_u16();
            let code = if status == 413 { 21617 } else { 21000 };
            let mut d = LedgerEntry::draft(Provider::Sms, EntryKind::Send, "");
            d.outcome = Outcome::ProtocolError;
            d.status = status.to_string();
            d.error = Some(code.to_string());
            d.peer = Some(peer);
            st.inner.hub.ledger.record(d);
            return twilio_error(status, code, "").into_response();
        }
    };
    let cfg = st.inner.hub.sms.get();
    // A held request must see its sender hang up, which only a detached task does.
    let inline = crate::http::no_latency(&cfg.latency)
        && cfg.outage.is_none()
        && !st.inner.hub.link_faults_armed();
    detached(inline, conn, handle(st, account, peer, headers, body)).await
}

/// A valid create request.
struct Form {
    to: String,
    from: Option<String>,
    messaging_service_sid: Option<String>,
    body: String,
    status_callback: Option<String>,
}

/// Twilio's "service unavailable" error code, answered during an outage.
const UNAVAILABLE_CODE: u32 = 20503;

/// Twilio refuses a body longer than this (error 21617), however it would be segmented.
pub const MAX_BODY_CHARS: usize = 1600;

/// Why a create request was refused: Twilio's error code, and the `To` and `Body` it had.
struct Refused {
    code: u32,
    to: Option<String>,
    body: Option<String>,
}

impl Refused {
    fn new(code: u32, to: Option<&String>) -> Refused {
        Refused {
            code,
            to: to.cloned(),
            body: None,
        }
    }
}

fn parse_form(raw: &[u8]) -> Result<Form, Refused> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_bytes(raw).map_err(|_| Refused::new(21000, None))?;
    let get = |k: &str| {
        pairs
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    let to = get("To").ok_or(Refused::new(21604, None))?;
    let from = get("From");
    let messaging_service_sid = get("MessagingServiceSid");
    if from.is_none() && messaging_service_sid.is_none() {
        return Err(Refused::new(21603, Some(&to)));
    }
    let body = get("Body").ok_or_else(|| Refused::new(21602, Some(&to)))?;
    if body.chars().count() > MAX_BODY_CHARS {
        // Kept: a stack that sends a message too long to be an SMS is judged by its length.
        return Err(Refused {
            body: Some(body),
            ..Refused::new(21617, Some(&to))
        });
    }
    let status_callback = get("StatusCallback");
    if status_callback.as_deref().is_some_and(|u| !callback_url(u)) {
        return Err(Refused::new(21609, Some(&to)));
    }
    Ok(Form {
        to,
        from,
        messaging_service_sid,
        body,
        status_callback,
    })
}

/// Twilio's longest `StatusCallback`.
const MAX_CALLBACK_URL: usize = 4000;

/// Whether `url` is a `StatusCallback` Twilio takes: a whole `http://` or `https://` URL with a
/// host, at most [`MAX_CALLBACK_URL`] characters (error 21609 otherwise). Reachability is not
/// judged: a stack under test listens on loopback.
fn callback_url(url: &str) -> bool {
    url.len() <= MAX_CALLBACK_URL && crate::validate::webhook_url(url)
}

/// A message the store took, and the delivery reports its plan has for it (scheduled once the
/// create is answered for).
struct Committed {
    msg: Arc<Stored>,
    reports: Vec<plan::Planned>,
}

enum Decision {
    Repeat(Arc<Stored>),
    RateLimited(std::time::Duration),
    BadAddress {
        code: u32,
        seeded: bool,
    },
    Fault {
        fault: HttpFault,
        permanent: bool,
        committed: Option<Committed>,
    },
    Accept(Committed),
}

async fn handle(
    st: SmsState,
    account: String,
    peer: SocketAddr,
    headers: HeaderMap,
    raw: Bytes,
) -> Reply {
    let hub = st.inner.hub.clone();
    let cfg = hub.sms.get();
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && cfg.idempotency);
    // `body`: the refused message's text when there was one (a body too long is judged by it).
    let protocol_error = |to: &str, status: u16, code: u32, body: Option<String>| {
        let mut d = LedgerEntry::draft(Provider::Sms, EntryKind::Send, to);
        d.outcome = Outcome::ProtocolError;
        d.status = status.to_string();
        d.error = Some(code.to_string());
        d.peer = Some(peer);
        d.idempotency_key = key.clone();
        d.body = body;
        hub.ledger.record(d);
        twilio_error(status, code, to)
    };
    if !authorized(&cfg, &account, &headers) {
        return protocol_error("", 401, 20003, None);
    }
    let form = match parse_form(&raw) {
        Ok(f) => f,
        Err(r) => return protocol_error(r.to.as_deref().unwrap_or(""), 400, r.code, r.body),
    };

    let received_ns = hub.ledger.now_ns();
    let fate = hub.ledger.on_request(Provider::Sms, peer).await;
    let next = link::before_serving_http(fate).await;
    let attempt = hub.ledger.next_attempt(Provider::Sms, &form.to);
    let mut d = LedgerEntry::draft(Provider::Sms, EntryKind::Send, form.to.clone());
    d.attempt = attempt;
    d.received_ns = received_ns;
    d.peer = Some(peer);
    d.idempotency_key = key.clone();
    d.payload_hash = Some(sha256_hex(form.body.as_bytes()));
    d.body = Some(form.body.clone());
    let reset = match next {
        Next::Serve { reset } => reset,
        Next::Skip(fault) => {
            link::mark_not_served(&mut d, fault);
            hub.ledger.record(d);
            let r = twilio_error(503, UNAVAILABLE_CODE, &form.to);
            return if fault == LinkFault::Refuse {
                r.cut()
            } else {
                r
            };
        }
    };
    if let Some(outage) = hub.sms.get().outage {
        let (status, hung_up) = crate::outage::answer(&hub, Provider::Sms, outage).await;
        d.outcome = Outcome::Transient;
        d.fault = Some(outage.mode.label().into());
        d.status = status;
        d.error = Some(UNAVAILABLE_CODE.to_string());
        d.client_hung_up = hung_up;
        if reset {
            link::mark_reset(&mut d);
        }
        hub.ledger.record(d);
        let r = twilio_error(503, UNAVAILABLE_CODE, &form.to);
        return if reset { r.cut() } else { r };
    }
    let decision = decide_create(&st, &cfg, &form, attempt, key.as_deref());
    let delay = decide::latency(hub.seed, Provider::Sms, &form.to, attempt, &cfg.latency);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }

    let (reply, committed) = match decision {
        Decision::Accept(c) => {
            d.outcome = Outcome::Accepted;
            d.status = "201".into();
            d.message_id = Some(c.msg.sid.to_string());
            (
                Reply::serialized(201, &c.msg.resource(Instant::now())),
                Some(c),
            )
        }
        Decision::Repeat(msg) => {
            d.outcome = Outcome::IdempotentRepeat;
            d.status = "201".into();
            d.message_id = Some(msg.sid.to_string());
            let r = Reply::serialized(201, &msg.resource(Instant::now()))
                .header("idempotent-replayed", "true");
            (r, None)
        }
        Decision::RateLimited(wait) => {
            let secs = decide::retry_after_secs(wait);
            d.outcome = Outcome::Transient;
            d.status = "429".into();
            d.fault = Some("rate_limit".into());
            d.error = Some("20429".into());
            d.retry_after_ms = Some(decide::retry_after_ms(secs));
            (
                twilio_error(429, 20429, &form.to).header("retry-after", secs.to_string()),
                None,
            )
        }
        Decision::BadAddress { code, seeded } => {
            d.outcome = Outcome::Permanent;
            d.status = "400".into();
            d.fault = seeded.then(|| "bad_address".into());
            d.error = Some(code.to_string());
            (twilio_error(400, code, &form.to), None)
        }
        Decision::Fault {
            fault,
            permanent,
            committed,
        } => {
            let code = fault.code.unwrap_or_else(|| default_code(fault.status));
            d.outcome = if committed.is_some() {
                Outcome::Accepted
            } else if permanent {
                Outcome::Permanent
            } else {
                Outcome::Transient
            };
            d.status = fault.status.to_string();
            d.message_id = committed.as_ref().map(|c| c.msg.sid.to_string());
            d.fault = Some(decide::label(&fault));
            d.error = Some(code.to_string());
            // The header is whole seconds; the ledger records what was sent.
            let secs = fault.retry_after.map(|r| decide::retry_after_secs(r.0));
            d.retry_after_ms = secs.map(decide::retry_after_ms);
            let mut r = twilio_error(fault.status, code, &form.to);
            if let Some(s) = secs {
                r = r.header("retry-after", s.to_string());
            }
            (r, committed)
        }
    };
    d.client_hung_up = crate::http::client_gone();
    if reset {
        link::mark_reset(&mut d);
    }
    let entry = hub.ledger.record(d);
    if let Some(c) = committed {
        hub.ledger.before_response(&entry).await;
        // One plan: the store keeps its timeline (what a poll sees), the dispatcher its reports.
        hub.callbacks.sms_accepted(&cfg, &c.msg, c.reports);
    }
    if reset {
        return reply.cut();
    }
    reply
}

/// Makes every stateful and seeded decision for one create; an accepted message is stored (and
/// its idempotency key taken) here, before the latency sleep.
fn decide_create(
    st: &SmsState,
    cfg: &crate::config::SmsConfig,
    form: &Form,
    attempt: u32,
    key: Option<&str>,
) -> Decision {
    let inner = &st.inner;
    let hub = &inner.hub;
    if let Some(rate) = cfg.rate_limit {
        if let Err(wait) = inner.limiter.try_take(rate) {
            return Decision::RateLimited(wait);
        }
    }
    if let Some(orig) = key.and_then(|k| inner.store.by_key(k)) {
        return Decision::Repeat(orig);
    }
    // An E.164 number (what `is_e164` accepts), packed as the store keeps it.
    let Some(to) = Phone::parse(&form.to) else {
        return Decision::BadAddress {
            code: 21211,
            seeded: false,
        };
    };
    let commit = || {
        let sid = Sid::random();
        let plan = plan::sms(
            hub.seed,
            &form.to,
            attempt,
            &sid.to_string(),
            &cfg.callbacks,
        );
        let store = &inner.store;
        let origin = Origin {
            account_sid: cfg.account_sid.as_str().into(),
            from: form.from.as_deref().map(Box::from),
            messaging_service_sid: form.messaging_service_sid.as_deref().map(Box::from),
        };
        let msg = Stored {
            sid,
            to,
            origin: store.origin(origin),
            status_callback: form.status_callback.as_deref().map(|u| store.callback(u)),
            body: form.body.as_str().into(),
            created: chrono::Utc::now(),
            attempt,
            created_at: Instant::now(),
            // The reports are scheduled apart, from the same plan, when the message is answered
            // for: a store of a hundred thousand messages keeps no report.
            timeline: plan.timeline,
        };
        let reports = plan.reports;
        store.insert(msg, key).map(|msg| Committed { msg, reports })
    };
    match decide::decide(
        hub.seed,
        Provider::Sms,
        &form.to,
        attempt,
        cfg.bad_addresses,
        &cfg.sticky,
        &cfg.permanent,
        &cfg.transient,
    ) {
        Verdict::BadAddress => {
            let unsubscribed =
                crate::faults::unit(hub.seed, Provider::Sms, &form.to, "bad-kind") < 0.5;
            Decision::BadAddress {
                code: if unsubscribed { 21610 } else { 21211 },
                seeded: true,
            }
        }
        Verdict::Fault { fault, permanent } if fault.after_commit => match commit() {
            Ok(c) => Decision::Fault {
                fault: fault.into_owned(),
                permanent,
                committed: Some(c),
            },
            Err(orig) => Decision::Repeat(orig),
        },
        Verdict::Fault { fault, permanent } => Decision::Fault {
            fault: fault.into_owned(),
            permanent,
            committed: None,
        },
        Verdict::Accept => match commit() {
            Ok(c) => Decision::Accept(c),
            Err(orig) => Decision::Repeat(orig),
        },
    }
}
