//! Callback admission: at most [`CALLBACK_SLOTS`] provider callbacks are applied at once. A
//! callback that finds every slot taken waits at most [`CALLBACK_QUEUE_WAIT`] for one, then is
//! answered `503` with `Retry-After: 1`: providers retry a 5xx, and a flood of delivery reports
//! then waits at the providers instead of taking every connection and CPU of the API from the
//! orders being enqueued and the status reads. Batches never pass through here (they have a pool
//! of their own); a slot is held until the callback's work is done, even when the provider hung
//! up first.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Callbacks applied at once: below the callback pool's connections, so status, health and
/// metrics always find one.
pub(crate) const CALLBACK_SLOTS: usize = 16;

/// How long a callback waits for a slot before it is shed.
pub(crate) const CALLBACK_QUEUE_WAIT: Duration = Duration::from_secs(2);

/// The slots, shared by every callback route.
#[derive(Clone)]
pub(crate) struct Admission {
    slots: Arc<Semaphore>,
    wait: Duration,
}

impl Admission {
    pub fn new(slots: usize, wait: Duration) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(slots)),
            wait,
        }
    }

    /// A slot, or the `503` to answer instead.
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit, Response> {
        match tokio::time::timeout(self.wait, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => {
                tracing::debug!("callback shed: every slot busy");
                Err(busy())
            }
        }
    }
}

impl Default for Admission {
    fn default() -> Admission {
        Admission::new(CALLBACK_SLOTS, CALLBACK_QUEUE_WAIT)
    }
}

/// `503 Service Unavailable` with `Retry-After: 1`.
fn busy() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        axum::Json(serde_json::json!({"error": "busy: retry later", "field": null})),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_callback_past_the_slots_is_shed_with_retry_after_and_a_freed_slot_admits_again() {
        let a = Admission::new(2, Duration::from_millis(50));
        let one = a.admit().await.expect("first slot");
        let _two = a.admit().await.expect("second slot");
        let shed = a.admit().await.expect_err("no slot left");
        assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(shed.headers()[header::RETRY_AFTER], "1");
        drop(one);
        let _three = a.admit().await.expect("a slot was freed");
    }
}
