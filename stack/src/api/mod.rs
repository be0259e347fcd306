//! The API process: axum routes for batches, provider callbacks, status, health and metrics.
//!
//! `run` takes a pre-bound listener and a shutdown future (tests bind 127.0.0.1:0). The API
//! never calls a provider: it renders and enqueues, and applies callbacks through
//! [`crate::state::transition`]. Errors leave as JSON `{"error", "field"}` with a 4xx, or a 500
//! that names nothing internal.

mod batches;
mod callbacks;
mod shed;
mod status;

use std::future::Future;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use sqlx::PgPool;

use crate::config::Config;

#[derive(Clone)]
pub(crate) struct AppState {
    pub cfg: Arc<Config>,
    /// Callbacks, status and metrics.
    pub pool: PgPool,
    /// Taking batches, and nothing else: a storm of delivery reports must never make an order
    /// wait for a connection.
    pub front: PgPool,
    /// Callbacks applied at once; past them a callback is answered 503 (`shed.rs`).
    pub callbacks: shed::Admission,
}

/// Connections the API keeps for callbacks, status and metrics, and apart for taking batches:
/// together within the contract's budget of about 40 for the API.
const POOL: u32 = 24;
const FRONT_POOL: u32 = 6;

/// An error answer: status, message, and the request field it is about (if any).
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub error: String,
    pub field: Option<String>,
}

impl ApiError {
    pub fn field(
        status: StatusCode,
        field: impl Into<String>,
        error: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            error: error.into(),
            field: Some(field.into()),
        }
    }
    pub fn invalid(field: impl Into<String>, error: impl Into<String>) -> ApiError {
        ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, field, error)
    }
    pub fn status(status: StatusCode, error: impl Into<String>) -> ApiError {
        ApiError {
            status,
            error: error.into(),
            field: None,
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        tracing::error!(error = %e, "database error");
        ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "database error")
    }
}

impl From<crate::state::TransitionError> for ApiError {
    fn from(e: crate::state::TransitionError) -> ApiError {
        tracing::error!(error = %e, "transition error");
        ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"error": self.error, "field": self.field})),
        )
            .into_response()
    }
}

/// The routes, for tests that want to drive them without a socket.
pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(status::healthz))
        .route("/metrics", get(status::metrics))
        .route(
            "/v1/batches",
            post(batches::create).layer(DefaultBodyLimit::disable()),
        )
        .route("/v1/batches/{id}", get(status::batch))
        .route("/v1/batches/{id}/deliveries", get(status::deliveries))
        .route("/v1/callbacks/sms", post(callbacks::sms))
        .route("/v1/callbacks/email", post(callbacks::email))
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` fires.
pub async fn run(
    cfg: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let pool = crate::pool(&cfg.database_url, POOL).await?;
    let front = crate::pool(&cfg.database_url, FRONT_POOL).await?;
    let state = AppState {
        cfg: Arc::new(cfg),
        pool: pool.clone(),
        front: front.clone(),
        callbacks: shed::Admission::default(),
    };
    tracing::info!(addr = %listener.local_addr()?, "api listening");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await?;
    pool.close().await;
    front.close().await;
    Ok(())
}
