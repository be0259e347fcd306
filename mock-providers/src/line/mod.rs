//! The fake LINE Messaging API: `POST /v2/bot/message/push` with LINE's auth, validation errors,
//! `x-line-request-id`, `X-Line-Retry-Key` idempotency, rate-limit and monthly-quota 429s, plus
//! the control API under `/_mock/`.
//!
//! What this server answers 200 (or commits before a 5xx) is a delivery; it must never answer
//! before the ledger holds the send.

mod body;
mod push;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use base64::Engine;
use uuid::Uuid;

use crate::hub::Hub;
use crate::ledger::Provider;
use crate::ratelimit::RateLimiter;

pub use body::{is_user_id, MAX_MESSAGES, MAX_TEXT};

/// The header LINE puts on every response.
const REQUEST_ID: &str = "x-line-request-id";

/// One message LINE reports as sent, as numbers and bytes: the retry keys keep them for every
/// accepted push, and they are written out only in an answer.
#[derive(Clone, Debug)]
pub(crate) struct SentMessage {
    /// The message id (written in decimal, as a JSON string).
    pub id: u64,
    /// The bytes of the quote token ([`SentMessage::quote_token`]).
    pub token: [u8; 24],
}

impl SentMessage {
    /// The quote token as LINE writes it: URL-safe base64 without padding.
    pub fn quote_token(&self) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.token)
    }
}

/// A retry key whose request was accepted.
#[derive(Clone, Debug)]
pub(crate) struct AcceptedKey {
    /// The accepted request's `x-line-request-id` (written lowercase, hyphenated).
    pub request_id: Uuid,
    pub sent: Box<[SentMessage]>,
}

pub(crate) struct LineInner {
    pub hub: Arc<Hub>,
    /// Accepted retry keys, by the UUID each spells (a retry key is a canonical UUID, of either
    /// case: one UUID is one key).
    pub keys: Mutex<HashMap<Uuid, AcceptedKey>>,
    pub limiter: RateLimiter,
    pub next_id: AtomicU64,
}

/// The LINE fake's state. Cheap to clone.
#[derive(Clone)]
pub struct LineState {
    pub(crate) inner: Arc<LineInner>,
}

impl LineState {
    /// Creates the state and registers it with the hub's reset.
    pub fn new(hub: Arc<Hub>) -> LineState {
        let start = 600_000_000_000_000_000 + u64::from(rand::random::<u32>()) * 1_000_000;
        let inner = Arc::new(LineInner {
            hub: hub.clone(),
            keys: Mutex::new(HashMap::new()),
            limiter: RateLimiter::new(),
            next_id: AtomicU64::new(start),
        });
        let weak = Arc::downgrade(&inner);
        hub.on_reset(move || {
            if let Some(i) = weak.upgrade() {
                i.keys.lock().unwrap_or_else(|p| p.into_inner()).clear();
                i.limiter.reset();
            }
        });
        LineState { inner }
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.inner.hub
    }
}

/// The LINE fake's routes, control API included. Every response carries an
/// `x-line-request-id`, also the ones no handler wrote: 404 (unknown path), 405 (wrong method)
/// and 413 (body over the 2 MB limit).
pub fn router(state: LineState) -> Router {
    let control = crate::control::router(state.inner.hub.clone(), Provider::Line);
    Router::new()
        .route("/v2/bot/message/push", post(push::push))
        .with_state(state)
        .merge(control)
        .fallback(not_found)
        .layer(axum::middleware::map_response(with_request_id))
}

async fn not_found() -> (StatusCode, axum::Json<serde_json::Value>) {
    (
        StatusCode::NOT_FOUND,
        axum::Json(serde_json::json!({ "message": "Not found" })),
    )
}

/// Adds an `x-line-request-id` to a response that has none.
async fn with_request_id(mut resp: Response) -> Response {
    if !resp.headers().contains_key(REQUEST_ID) {
        if let Ok(v) = HeaderValue::from_str(&crate::http::fast_uuid()) {
            resp.headers_mut().insert(REQUEST_ID, v);
        }
    }
    resp
}

/// Serves the LINE fake on `listener` until `shutdown` resolves.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: LineState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let ledger = state.hub().ledger.clone();
    crate::http::serve(listener, router(state), ledger, shutdown).await
}
