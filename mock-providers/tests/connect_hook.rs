//! The `on_connect` hook: every fake calls it for every accepted connection, on that
//! connection's own task, before serving its first byte; a hook that never returns delays only
//! its own connection, and only by the ledger's connect-hook timeout. Also: the hand-written
//! HTTP accept loop still shuts down gracefully (requests in flight are answered, nothing new is
//! accepted).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use futures::future::BoxFuture;
use mock_providers::config::ProvidersConfig;
use mock_providers::ledger::{Hook, LedgerEntry, Outcome};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// Reports each connection's peer, then holds it until the test releases it.
struct Gate {
    entered: mpsc::UnboundedSender<SocketAddr>,
    release: Mutex<Option<oneshot::Receiver<()>>>,
}

impl Hook for Gate {
    fn on_connect<'a>(&'a self, peer: SocketAddr) -> BoxFuture<'a, ()> {
        let _ = self.entered.send(peer);
        let rx = self.release.lock().unwrap().take();
        Box::pin(async move {
            if let Some(rx) = rx {
                let _ = rx.await;
            }
        })
    }
}

/// Never returns for the first connection (the ledger's timeout drops it); lets the others by.
struct Stuck {
    calls: Arc<AtomicUsize>,
    /// Set when the first connection's hook future is dropped (the timeout fired).
    first_dropped: Arc<AtomicBool>,
}

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Hook for Stuck {
    fn on_connect<'a>(&'a self, _peer: SocketAddr) -> BoxFuture<'a, ()> {
        if self.calls.fetch_add(1, Ordering::SeqCst) > 0 {
            return Box::pin(async {});
        }
        let guard = SetOnDrop(self.first_dropped.clone());
        Box::pin(async move {
            let _guard = guard;
            futures::future::pending::<()>().await
        })
    }
}

fn http_get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: fake\r\nconnection: close\r\n\r\n").into_bytes()
}

/// The first line the server sends, read within 10 s.
async fn first_line(stream: &mut TcpStream) -> String {
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        BufReader::new(stream).read_line(&mut line),
    )
    .await
    .expect("an answer within 10 s")
    .expect("read the answer");
    line
}

#[tokio::test]
async fn every_fake_runs_the_hook_before_its_first_byte() {
    let w = world(1, ProvidersConfig::default()).await;
    // The hook is held while the test checks nothing is served: far longer than any stall of
    // this process, so the ledger's timeout never releases it first (the default 250 ms would).
    w.p.ledger.set_connect_hook_timeout(Duration::from_secs(30));
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let release = Arc::new(Mutex::new(None::<oneshot::Sender<()>>));
    let gate = Arc::new(Gate {
        entered: entered_tx,
        release: Mutex::new(None),
    });
    w.p.ledger.add_hook(gate.clone());
    // (server, what the client sends first, what the answer starts with)
    let cases: [(&str, SocketAddr, Vec<u8>, &str); 4] = [
        (
            "line",
            w.p.line_addr,
            http_get("/_mock/stats"),
            "HTTP/1.1 200",
        ),
        (
            "sms",
            w.p.sms_addr,
            http_get("/_mock/stats"),
            "HTTP/1.1 200",
        ),
        (
            "smtp control",
            w.p.smtp_control_addr,
            http_get("/_mock/stats"),
            "HTTP/1.1 200",
        ),
        ("smtp", w.p.smtp_addr, Vec::new(), "220 "),
    ];
    for (name, addr, request, answer) in cases {
        let (tx, rx) = oneshot::channel();
        *gate.release.lock().unwrap() = Some(rx);
        *release.lock().unwrap() = Some(tx);
        let mut client = TcpStream::connect(addr).await.unwrap();
        let peer = tokio::time::timeout(Duration::from_secs(10), entered.recv())
            .await
            .expect("hook entered")
            .unwrap();
        assert_eq!(
            peer,
            client.local_addr().unwrap(),
            "{name}: the client's address"
        );
        client.write_all(&request).await.unwrap();
        let mut byte = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(100), client.read(&mut byte)).await;
        assert!(early.is_err(), "{name}: served before the hook returned");
        release
            .lock()
            .unwrap()
            .take()
            .unwrap()
            .send(())
            .expect("the hook is still waiting for its release");
        let line = first_line(&mut client).await;
        assert!(line.starts_with(answer), "{name}: {line:?}");
    }
}

#[tokio::test]
async fn ledger_entries_carry_the_peer_the_hook_saw() {
    let w = world(1, ProvidersConfig::default()).await;
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    w.p.ledger.add_hook(Arc::new(Gate {
        entered: entered_tx,
        release: Mutex::new(None),
    }));
    let r = w.line_push(&uid(1), None, "hi").await;
    assert_eq!(r.status, 200);
    let peer = entered
        .try_recv()
        .expect("hook ran for the push's connection");
    let e = w.entries();
    assert_eq!(e[0].outcome, Outcome::Accepted);
    assert_eq!(e[0].peer, Some(peer));
}

#[tokio::test]
async fn a_hook_that_never_returns_delays_only_its_connection_and_only_by_the_timeout() {
    // Long enough that the second connection is served while the first one's hook still holds
    // it, even if this process is descheduled for a while; the test waits this long per case.
    let timeout = Duration::from_secs(3);
    for (name, smtp) in [("line", false), ("smtp", true)] {
        let w = world(1, ProvidersConfig::default()).await;
        w.p.ledger.set_connect_hook_timeout(timeout);
        let first_dropped = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicUsize::new(0));
        w.p.ledger.add_hook(Arc::new(Stuck {
            calls: calls.clone(),
            first_dropped: first_dropped.clone(),
        }));
        let (addr, request) = if smtp {
            (w.p.smtp_addr, Vec::new())
        } else {
            (w.p.line_addr, http_get("/_mock/stats"))
        };
        let t0 = Instant::now();
        let mut stuck = TcpStream::connect(addr).await.unwrap();
        stuck.write_all(&request).await.unwrap();
        let stuck_answer = tokio::spawn(async move { first_line(&mut stuck).await });
        // Wait until the stuck connection's hook is running, so the next connect comes after it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while calls.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "{name}: hook never called");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut other = TcpStream::connect(addr).await.unwrap();
        other.write_all(&request).await.unwrap();
        let line = first_line(&mut other).await;
        assert!(line.starts_with(if smtp { "220 " } else { "HTTP/1.1 200" }));
        assert!(
            !first_dropped.load(Ordering::SeqCst),
            "{name}: a second connection waited for the first one's hook"
        );
        let line = stuck_answer.await.unwrap();
        assert!(line.starts_with(if smtp { "220 " } else { "HTTP/1.1 200" }));
        assert!(first_dropped.load(Ordering::SeqCst), "{name}: timed out");
        assert!(
            t0.elapsed() >= timeout,
            "{name}: served after {:?}, before the hook's timeout",
            t0.elapsed()
        );
    }
}

/// Holds the first accepted send's response until the test releases it.
struct HoldResponse {
    entered: mpsc::UnboundedSender<()>,
    release: Mutex<Option<oneshot::Receiver<()>>>,
}

impl Hook for HoldResponse {
    fn before_response<'a>(&'a self, _entry: &'a LedgerEntry) -> BoxFuture<'a, ()> {
        let _ = self.entered.send(());
        let rx = self.release.lock().unwrap().take();
        Box::pin(async move {
            if let Some(rx) = rx {
                let _ = rx.await;
            }
        })
    }
}

#[tokio::test]
async fn http_shutdown_answers_requests_in_flight_and_accepts_nothing_new() {
    let World { p, http } = world(1, ProvidersConfig::default()).await;
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let (release, release_rx) = oneshot::channel();
    p.ledger.add_hook(Arc::new(HoldResponse {
        entered: entered_tx,
        release: Mutex::new(Some(release_rx)),
    }));
    let line = p.line_addr;
    let push = http
        .post(format!("{}/v2/bot/message/push", p.line_base()))
        .bearer_auth(TOKEN)
        .json(&json!({"to": uid(3), "messages": [{"type": "text", "text": "hi"}]}))
        .send();
    let in_flight = tokio::spawn(push);
    tokio::time::timeout(Duration::from_secs(10), entered.recv())
        .await
        .expect("the push reached its response")
        .unwrap();
    let stopped = tokio::spawn(p.shutdown());
    // The listener closes at once, while the request is still in flight.
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(line).await.is_ok() {
        assert!(Instant::now() < deadline, "the listener is still open");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!in_flight.is_finished(), "answered before the release");
    release.send(()).unwrap();
    let r = in_flight
        .await
        .unwrap()
        .expect("the request in flight is answered");
    assert_eq!(r.status(), 200);
    tokio::time::timeout(Duration::from_secs(10), stopped)
        .await
        .expect("shutdown returns once the request is answered")
        .unwrap();
}
