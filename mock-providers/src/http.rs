//! Small pieces the HTTP fakes share: the reply type their request tasks return, hashing, and
//! serving a router on a pre-bound listener with a shutdown future (and the ledger's connection
//! hooks before each connection's first byte).
//!
//! Nothing here knows a provider's contract; it must never build a provider's error body.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::{HeaderName, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::ledger::Ledger;

/// A response decided by a request task, turned into an axum response by the handler.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, String)>,
    /// The JSON body, serialised when the reply is made.
    pub body: Vec<u8>,
    /// Reset the connection instead of answering (a link fault, [`crate::link::LinkFate::Reset`]
    /// or `Refuse`): the sender reads none of this reply.
    pub cut: bool,
}

impl Reply {
    pub fn json(status: u16, json: serde_json::Value) -> Reply {
        Reply::serialized(status, &json)
    }

    /// A reply whose body is `value` as JSON, written straight from its `Serialize` (no
    /// intermediate `serde_json::Value`: the SMS resource is on every create's path).
    pub fn serialized(status: u16, value: &impl serde::Serialize) -> Reply {
        Reply {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            headers: Vec::new(),
            body: serde_json::to_vec(value).unwrap_or_default(),
            cut: false,
        }
    }

    /// This reply never sent: the connection is reset instead ([`Reply::cut`]).
    pub fn cut(mut self) -> Reply {
        self.cut = true;
        self
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers
            .push((HeaderName::from_static(name), value.into()));
        self
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let mut resp = (self.status, self.body).into_response();
        let h = resp.headers_mut();
        h.insert(
            "content-type",
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        for (k, v) in self.headers {
            if let Ok(v) = HeaderValue::from_str(&v) {
                h.insert(k, v);
            }
        }
        resp
    }
}

tokio::task_local! {
    /// Set when the client of the request a [`detached`] task serves has hung up.
    static CLIENT_GONE: Arc<AtomicBool>;
}

/// Whether the client of the request this task serves hung up before the answer was ready
/// (hyper dropped the handler future). `false` outside a [`detached`] task. Fakes read it just
/// before recording, so the ledger shows a sender that abandoned a request it had started.
pub fn client_gone() -> bool {
    CLIENT_GONE
        .try_with(|g| g.load(Ordering::SeqCst))
        .unwrap_or(false)
}

/// Marks the request abandoned when the handler future is dropped before its task finished.
struct HangUpWatch {
    flag: Arc<AtomicBool>,
    armed: bool,
}

impl Drop for HangUpWatch {
    fn drop(&mut self) {
        if self.armed {
            self.flag.store(true, Ordering::SeqCst);
        }
    }
}

/// The connection a request came on, as a handler sees it (an `axum::Extension`):
/// [`ConnCut::reset`] resets it (RST) instead of answering. Every connection [`serve`] serves
/// carries one.
#[derive(Clone, Default)]
pub struct ConnCut(Arc<tokio::sync::Notify>);

impl ConnCut {
    /// Resets the connection and never returns: the connection's task drops this request's
    /// handler with the connection.
    pub async fn reset(&self) -> Response {
        self.0.notify_one();
        std::future::pending().await
    }
}

/// Runs `task` on its own tokio task and waits for it, so that what a fake decided reaches the
/// ledger even if the client hangs up mid-request (hyper drops the handler future then, which
/// [`client_gone`] reports to the task). A reply that is [`Reply::cut`] resets `conn` instead.
///
/// With no latency to sleep (`inline`), the task has no await point between its decision and
/// its ledger commit, so it cannot be cut short there and runs inline, saving a task hop.
pub async fn detached(
    inline: bool,
    conn: ConnCut,
    task: impl Future<Output = Reply> + Send + 'static,
) -> Response {
    if inline {
        return answer(task.await, &conn).await;
    }
    let flag = Arc::new(AtomicBool::new(false));
    let mut watch = HangUpWatch {
        flag: flag.clone(),
        armed: true,
    };
    let joined = tokio::spawn(CLIENT_GONE.scope(flag, task)).await;
    watch.armed = false;
    match joined {
        Ok(r) => answer(r, &conn).await,
        Err(e) => {
            tracing::error!(error = %e, "request task failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

async fn answer(reply: Reply, conn: &ConnCut) -> Response {
    if reply.cut {
        return conn.reset().await;
    }
    reply.into_response()
}

/// Whether a latency profile never sleeps.
pub fn no_latency(l: &crate::config::Latency) -> bool {
    matches!(l, crate::config::Latency::Fixed { value } if value.0.is_zero())
}

/// A random UUID from the thread-local generator (no system call per request).
pub fn random_uuid() -> uuid::Uuid {
    uuid::Builder::from_random_bytes(rand::random()).into_uuid()
}

/// [`random_uuid`] as text (lowercase, hyphenated).
pub fn fast_uuid() -> String {
    random_uuid().to_string()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Serves `router` (HTTP/1.1) on `listener` until `shutdown` resolves, with each request's peer
/// address available as `ConnectInfo<SocketAddr>`.
///
/// Each accepted connection gets its own task, which first awaits the ledger's connection hooks
/// ([`Ledger::on_connect`], bounded) and only then reads the request: a slow hook delays that one
/// connection, never the accept loop. On shutdown the listener closes at once, idle connections
/// are closed, and requests in flight are answered before their connection closes (hyper's
/// graceful shutdown, as `axum::serve(..).with_graceful_shutdown` did). A client that hangs up
/// mid-request makes hyper drop the handler future, which [`detached`] reports as
/// [`client_gone`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    ledger: Ledger,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::accept::accept_until(
        listener,
        ledger,
        "http",
        shutdown,
        None,
        move |stream, peer, stop| connection(stream, peer, router.clone(), stop),
    )
    .await
}

/// One accepted connection (its hooks already run): HTTP/1.1 until the client closes or the
/// server stops.
async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    router: axum::Router,
    mut stop: watch::Receiver<bool>,
) {
    let app = TowerToHyperService::new(router);
    let cut = ConnCut::default();
    let handle = cut.clone();
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        req.extensions_mut().insert(handle.clone());
        hyper::service::Service::call(&app, req)
    });
    let mut conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    let stopping = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let served = tokio::select! {
        r = &mut conn => r,
        () = cut.0.notified() => {
            // Linger 0: closing the socket sends RST at once, dropping whatever was unsent.
            let parts = conn.into_parts();
            let _ = socket2::SockRef::from(parts.io.inner()).set_linger(Some(Duration::ZERO));
            return;
        }
        () = stopping => {
            std::pin::Pin::new(&mut conn).graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "http connection ended with an error");
    }
}
