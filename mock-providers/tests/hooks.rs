//! The `before_response` hook runs after the ledger commit and before the sender hears back.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use futures::future::BoxFuture;
use mock_providers::config::ProvidersConfig;
use mock_providers::ledger::{Hook, LedgerEntry, Outcome};
use tokio::sync::{mpsc, oneshot};

/// Tells the test when it is entered, then blocks until the test releases it.
struct Gate {
    entered: mpsc::UnboundedSender<LedgerEntry>,
    release: Mutex<Option<oneshot::Receiver<()>>>,
}

impl Hook for Gate {
    fn before_response<'a>(&'a self, entry: &'a LedgerEntry) -> BoxFuture<'a, ()> {
        let _ = self.entered.send(entry.clone());
        let rx = self.release.lock().unwrap().take();
        Box::pin(async move {
            if let Some(rx) = rx {
                let _ = rx.await;
            }
        })
    }
}

#[tokio::test]
async fn hook_blocks_the_response_until_it_returns() {
    for provider in ["line", "sms"] {
        let w = Arc::new(world(1, ProvidersConfig::default()).await);
        let (entered_tx, mut entered) = mpsc::unbounded_channel();
        let (release, release_rx) = oneshot::channel();
        w.p.ledger.add_hook(Arc::new(Gate {
            entered: entered_tx,
            release: Mutex::new(Some(release_rx)),
        }));
        let w2 = w.clone();
        let client = tokio::spawn(async move {
            match provider {
                "line" => w2.line_push(&uid(1), None, "hi").await.status,
                _ => w2.sms_send(&phone(1), "hi", None).await.status,
            }
        });
        let entry = tokio::time::timeout(std::time::Duration::from_secs(10), entered.recv())
            .await
            .expect("hook entered")
            .unwrap();
        assert_eq!(entry.outcome, Outcome::Accepted, "{provider}");
        assert_eq!(
            w.p.ledger.len(),
            1,
            "{provider}: committed before the hook ran"
        );
        tokio::task::yield_now().await;
        assert!(
            !client.is_finished(),
            "{provider}: the client got its answer before the hook returned"
        );
        release.send(()).unwrap();
        let status = client.await.unwrap();
        assert!(status == 200 || status == 201, "{provider}: {status}");
    }
}

/// The sender gives up after 500 ms (time enough to write its request, or nothing would be
/// recorded); the fake's 5 s latency outlasts that by seconds, so the ledger is still empty when
/// the test looks, even if the test process was descheduled for a while.
#[tokio::test]
async fn a_sender_that_hangs_up_during_latency_is_still_recorded() {
    let mut cfg = ProvidersConfig::default();
    cfg.line.latency = mock_providers::config::Latency::Fixed { value: ms(5_000) };
    let w = world(1, cfg).await;
    let r = w
        .http
        .post(format!("{}/v2/bot/message/push", w.p.line_base()))
        .bearer_auth(TOKEN)
        .timeout(std::time::Duration::from_millis(500))
        .body(
            serde_json::json!({"to": uid(2), "messages": [{"type": "text", "text": "hi"}]})
                .to_string(),
        )
        .send()
        .await;
    assert!(r.is_err(), "the client gave up before the answer");
    assert!(
        w.p.ledger.is_empty(),
        "nothing committed yet: the fake is still in its latency"
    );
    until(20, || w.p.ledger.len() == 1).await;
    assert_eq!(w.entries()[0].outcome, Outcome::Accepted);
}
