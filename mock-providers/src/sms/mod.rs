//! The fake SMS provider, a Twilio-compatible subset: create a message (form POST, HTTP Basic),
//! read one, list them filtered by `To` and `DateSent`, Twilio's error bodies, an optional
//! `Idempotency-Key`, and status callbacks through [`crate::callbacks`]; plus `/_mock/`.
//!
//! Twilio has no idempotency key on create, so by default neither does this fake: a resend is a
//! second delivery. It must never answer a create before the ledger holds it.
//!
//! Dates in Message resources are written as Twilio writes them, with a two-digit day
//! (`Wed, 01 May 2024 10:00:00 +0000`, [`store::twilio_date`]). A message sent through a
//! `MessagingServiceSid` starts `accepted` with `from: null`, as on Twilio; once sent, its
//! resource and its status callbacks carry `From` = the service's number
//! ([`store::service_number`], one fixed number per service SID).

mod create;
mod read;
pub mod store;

use std::future::Future;
use std::sync::Arc;

use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::Router;
use base64::Engine;
use serde_json::json;

use crate::config::SmsConfig;
use crate::http::Reply;
use crate::hub::Hub;
use crate::ledger::Provider;
use crate::ratelimit::RateLimiter;

pub(crate) struct SmsInner {
    pub hub: Arc<Hub>,
    pub store: store::Store,
    pub limiter: RateLimiter,
}

/// The SMS fake's state. Cheap to clone.
#[derive(Clone)]
pub struct SmsState {
    pub(crate) inner: Arc<SmsInner>,
}

impl SmsState {
    /// Creates the state and registers it with the hub's reset.
    pub fn new(hub: Arc<Hub>) -> SmsState {
        let inner = Arc::new(SmsInner {
            hub: hub.clone(),
            store: store::Store::default(),
            limiter: RateLimiter::new(),
        });
        let weak = Arc::downgrade(&inner);
        hub.on_reset(move || {
            if let Some(i) = weak.upgrade() {
                i.store.clear();
                i.limiter.reset();
            }
        });
        SmsState { inner }
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.inner.hub
    }
}

/// The SMS fake's routes, control API included.
pub fn router(state: SmsState) -> Router {
    let control = crate::control::router(state.inner.hub.clone(), Provider::Sms);
    Router::new()
        .route(
            "/2010-04-01/Accounts/{account}/Messages.json",
            post(create::create).get(read::list),
        )
        .route(
            "/2010-04-01/Accounts/{account}/Messages/{file}",
            get(read::fetch),
        )
        .with_state(state)
        .merge(control)
}

/// Serves the SMS fake on `listener` until `shutdown` resolves.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: SmsState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let ledger = state.inner.hub.ledger.clone();
    crate::http::serve(listener, router(state), ledger, shutdown).await
}

/// Twilio's message for an error code.
pub fn error_message(code: u32, to: &str) -> String {
    match code {
        20003 => "Authenticate".into(),
        20404 => "The requested resource was not found".into(),
        20429 => "Too Many Requests".into(),
        20500 => "Internal Server Error".into(),
        20503 => "Service Unavailable".into(),
        21211 => format!("The 'To' number {to} is not a valid phone number."),
        21602 => "Message body is required.".into(),
        21603 => "A 'From' phone number is required.".into(),
        21604 => "A 'To' phone number is required.".into(),
        21609 => "Invalid 'StatusCallback'".into(),
        21610 => "Attempt to send to unsubscribed recipient".into(),
        21617 => "The concatenated message body exceeds the 1600 character limit.".into(),
        21408 => format!("Permission to send an SMS has not been enabled for the region indicated by the 'To' number: {to}."),
        30003 => "Unreachable destination handset".into(),
        30008 => "Unknown error".into(),
        _ => "Error".into(),
    }
}

/// The Twilio error code an injected fault of HTTP `status` carries when the profile names none.
pub fn default_code(status: u16) -> u32 {
    match status {
        400 => 21211,
        401 => 20003,
        404 => 20404,
        429 => 20429,
        500 => 20500,
        503 => 20503,
        s => 20000 + u32::from(s),
    }
}

/// Twilio's error body and status.
pub(crate) fn twilio_error(status: u16, code: u32, to: &str) -> Reply {
    Reply::json(
        status,
        json!({
            "code": code,
            "message": error_message(code, to),
            "more_info": format!("https://www.twilio.com/docs/errors/{code}"),
            "status": status,
        }),
    )
}

/// Whether the request carries `AccountSid:AuthToken` as HTTP Basic and names that account.
pub(crate) fn authorized(cfg: &SmsConfig, account: &str, headers: &HeaderMap) -> bool {
    let Some(b64) = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
    else {
        return false;
    };
    let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) else {
        return false;
    };
    let want = format!("{}:{}", cfg.account_sid, cfg.auth_token);
    account == cfg.account_sid && raw == want.as_bytes()
}

/// Whether `to` is an E.164 number: `+`, then 2 to 15 digits, the first not 0.
pub fn is_e164(to: &str) -> bool {
    let Some(d) = to.strip_prefix('+') else {
        return false;
    };
    (2..=15).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()) && !d.starts_with('0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e164_table() {
        let cases = [
            ("+15550000001", true),
            ("+819012345678", true),
            ("15550000001", false),
            ("+0555", false),
            ("+1", false),
            ("+1555000000000000", false),
            ("+1555-000", false),
            ("", false),
        ];
        for (n, want) in cases {
            assert_eq!(is_e164(n), want, "{n}");
        }
    }
}
