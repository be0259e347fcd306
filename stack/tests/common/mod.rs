//! Test world for the stack's integration tests: a fresh migrated database per test, the API on
//! 127.0.0.1:0, and minimal fake LINE and SMS providers that keep a ledger of what they
//! committed and can be told to commit-then-hang (a provider call in flight that never answers).
//!
//! Never sleeps as synchronisation: [`wait_for`] polls a condition up to a deadline.

#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::sync::watch;

/// A fresh, migrated database. Keep the returned value alive for the test's duration.
pub async fn fresh_db() -> throwaway_pg::TestDb {
    let db = throwaway_pg::test_database()
        .await
        .expect("a test database");
    stack::migrate(&db.url).await.expect("migrations");
    db
}

pub async fn pool(url: &str) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(12)
        .connect(url)
        .await
        .expect("connect")
}

/// Polls `cond` until it holds or `within` passes (then panics with `what`).
pub async fn wait_for<F, Fut>(what: &str, within: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if cond().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A shutdown signal for `run(…, shutdown)`.
pub fn shutdown_pair() -> (
    watch::Sender<bool>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (tx, mut rx) = watch::channel(false);
    (tx, async move {
        let _ = rx.wait_for(|v| *v).await;
    })
}

/// Starts the API; returns its `host:port` and the stop switch.
pub async fn start_api(
    cfg: &stack::Config,
) -> (
    String,
    watch::Sender<bool>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut cfg = cfg.clone();
    cfg.api_addr = addr.clone();
    let (tx, stop) = shutdown_pair();
    let h = tokio::spawn(stack::api::run(cfg, listener, stop));
    (addr, tx, h)
}

#[derive(Clone, Debug)]
pub struct SmsMsg {
    pub sid: String,
    pub to: String,
    pub body: String,
    pub created: chrono::DateTime<chrono::Utc>,
}

/// The fake providers' ledger and switches.
#[derive(Default)]
pub struct Fake {
    /// LINE: commits per `to` address (a 409 for a known retry key is not a commit).
    pub line_commits: Mutex<HashMap<String, u32>>,
    line_keys: Mutex<HashMap<String, String>>,
    pub line_requests: AtomicUsize,
    /// The text of every LINE push received, accepted or not: `(to, text)`.
    pub line_texts: Mutex<Vec<(String, String)>>,
    /// While set, every LINE push is answered with this status (and Retry-After) and not
    /// committed.
    pub line_fail: Mutex<Option<(u16, Option<String>)>>,
    /// When true, the first push to each address is answered 429 (not committed).
    pub line_fail_first: AtomicBool,
    line_failed_once: Mutex<std::collections::HashSet<String>>,
    /// Largest page the SMS list answers (0: no limit).
    pub sms_page_size: AtomicUsize,
    pub sms: Mutex<Vec<SmsMsg>>,
    pub sms_lookups: AtomicUsize,
    /// Lookups (list requests) answered.
    pub sms_lookups_done: AtomicUsize,
    /// How long each list request takes to answer, in milliseconds.
    pub sms_list_delay_ms: std::sync::atomic::AtomicU64,
    /// Status fetches (`GET …/Messages/{sid}.json`) received; while `sms_fetch_hold` is true they
    /// wait before answering.
    pub sms_fetches: AtomicUsize,
    pub sms_fetch_hold: AtomicBool,
    /// While true, every send commits and then waits for `release`.
    pub hang: AtomicBool,
    pub hanging: AtomicUsize,
    release: Mutex<Option<watch::Sender<bool>>>,
    release_rx: Mutex<Option<watch::Receiver<bool>>>,
}

impl Fake {
    pub fn commits_per_address(&self) -> HashMap<String, u32> {
        let mut out = self.line_commits.lock().unwrap().clone();
        for m in self.sms.lock().unwrap().iter() {
            *out.entry(m.to.clone()).or_default() += 1;
        }
        out
    }

    /// A message the provider holds as if an earlier send had created it at `created`.
    pub fn inject_sms(
        &self,
        to: &str,
        body: &str,
        created: chrono::DateTime<chrono::Utc>,
    ) -> String {
        let mut all = self.sms.lock().unwrap();
        let sid = format!("SM{:032}", all.len() + 1);
        all.push(SmsMsg {
            sid: sid.clone(),
            to: to.into(),
            body: body.into(),
            created,
        });
        sid
    }

    /// Lets every hanging request answer.
    pub fn release_all(&self) {
        self.hang.store(false, Ordering::SeqCst);
        if let Some(tx) = self.release.lock().unwrap().as_ref() {
            let _ = tx.send(true);
        }
    }

    async fn maybe_hang(&self) {
        if !self.hang.load(Ordering::SeqCst) {
            return;
        }
        let rx = self.release_rx.lock().unwrap().clone();
        if let Some(mut rx) = rx {
            self.hanging.fetch_add(1, Ordering::SeqCst);
            let _ = rx.wait_for(|v| *v).await;
            self.hanging.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Starts fake LINE + SMS on one port; returns the ledger and the base URL.
pub async fn start_fakes() -> (Arc<Fake>, String) {
    let fake = Arc::new(Fake::default());
    let (tx, rx) = watch::channel(false);
    *fake.release.lock().unwrap() = Some(tx);
    *fake.release_rx.lock().unwrap() = Some(rx);
    let app = Router::new()
        .route("/v2/bot/message/push", post(line_push))
        .route(
            "/2010-04-01/Accounts/{acct}/Messages.json",
            post(sms_create).get(sms_list),
        )
        .route("/2010-04-01/Accounts/{acct}/Messages/{sid}", get(sms_fetch))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (fake, base)
}

async fn line_push(
    State(f): State<Arc<Fake>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, HeaderMap, Json<Value>) {
    f.line_requests.fetch_add(1, Ordering::SeqCst);
    let key = headers
        .get("x-line-retry-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let to = body["to"].as_str().unwrap_or("").to_string();
    let text = body["messages"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_string();
    f.line_texts.lock().unwrap().push((to.clone(), text));
    let fail = f.line_fail.lock().unwrap().clone();
    if let Some((status, retry_after)) = fail {
        let mut h = HeaderMap::new();
        if let Some(ra) = retry_after {
            h.insert("retry-after", ra.parse().unwrap());
        }
        let status = StatusCode::from_u16(status).unwrap();
        return (
            status,
            h,
            Json(json!({"message": format!("fake says {status}")})),
        );
    }
    if f.line_fail_first.load(Ordering::SeqCst)
        && f.line_failed_once.lock().unwrap().insert(to.clone())
    {
        let mut h = HeaderMap::new();
        h.insert("retry-after", "0".parse().unwrap());
        return (
            StatusCode::TOO_MANY_REQUESTS,
            h,
            Json(json!({"message": "Too many requests"})),
        );
    }
    {
        let mut keys = f.line_keys.lock().unwrap();
        if !key.is_empty() && keys.contains_key(&key) {
            let mut h = HeaderMap::new();
            h.insert("x-line-accepted-request-id", "req-1".parse().unwrap());
            return (
                StatusCode::CONFLICT,
                h,
                Json(json!({"message": "The retry key is already accepted"})),
            );
        }
        keys.insert(key.clone(), to.clone());
        *f.line_commits.lock().unwrap().entry(to).or_default() += 1;
    }
    f.maybe_hang().await;
    (
        StatusCode::OK,
        HeaderMap::new(),
        Json(json!({"sentMessages": [{"id": format!("L-{key}")}]})),
    )
}

async fn sms_create(
    State(f): State<Arc<Fake>>,
    Form(form): Form<HashMap<String, String>>,
) -> (StatusCode, Json<Value>) {
    let sid = {
        let mut all = f.sms.lock().unwrap();
        let sid = format!("SM{:032}", all.len() + 1);
        all.push(SmsMsg {
            sid: sid.clone(),
            to: form.get("To").cloned().unwrap_or_default(),
            body: form.get("Body").cloned().unwrap_or_default(),
            created: chrono::Utc::now(),
        });
        sid
    };
    f.maybe_hang().await;
    (
        StatusCode::CREATED,
        Json(json!({"sid": sid, "status": "queued"})),
    )
}

/// Counts a request as answered when the handler returns.
struct Done<'a>(&'a AtomicUsize);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Twilio's list: newest first, `PageSize` (capped by `sms_page_size`) and `Page`, with a
/// `next_page_uri` that keeps the filter (as Twilio's does).
async fn sms_list(
    State(f): State<Arc<Fake>>,
    Path(acct): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Json<Value> {
    f.sms_lookups.fetch_add(1, Ordering::SeqCst);
    let delay = f.sms_list_delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let _done = Done(&f.sms_lookups_done);
    let to = q.get("To").cloned().unwrap_or_default();
    let mut size: usize = q.get("PageSize").and_then(|v| v.parse().ok()).unwrap_or(50);
    let cap = f.sms_page_size.load(Ordering::SeqCst);
    if cap > 0 {
        size = size.min(cap);
    }
    let page: usize = q.get("Page").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut all: Vec<SmsMsg> = f
        .sms
        .lock()
        .unwrap()
        .iter()
        .filter(|m| m.to == to)
        .cloned()
        .collect();
    all.sort_by_key(|m| std::cmp::Reverse(m.created));
    let msgs: Vec<Value> = all
        .iter()
        .skip(page * size)
        .take(size)
        .map(|m| {
            json!({"sid": m.sid, "to": m.to, "body": m.body, "status": "sent",
                   "date_created": m.created.to_rfc2822()})
        })
        .collect();
    let next = ((page + 1) * size < all.len()).then(|| {
        format!(
            "/2010-04-01/Accounts/{acct}/Messages.json?To={}&PageSize={size}&Page={}",
            to.replace('+', "%2B"),
            page + 1
        )
    });
    Json(json!({ "messages": msgs, "next_page_uri": next, "page": page, "page_size": size }))
}

async fn sms_fetch(
    State(f): State<Arc<Fake>>,
    Path((_acct, sid)): Path<(String, String)>,
) -> (StatusCode, Json<Value>) {
    f.sms_fetches.fetch_add(1, Ordering::SeqCst);
    while f.sms_fetch_hold.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sid = sid.trim_end_matches(".json").to_string();
    let found = f.sms.lock().unwrap().iter().any(|m| m.sid == sid);
    if found {
        (
            StatusCode::OK,
            Json(json!({"sid": sid, "status": "delivered"})),
        )
    } else {
        (StatusCode::NOT_FOUND, Json(json!({"code": 20404})))
    }
}

/// A batch body with `n` recipients on `channels`.
pub fn batch_body(batch_id: &str, n: usize, channels: &[&str]) -> Value {
    let recipients: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "id": format!("r{i:06}"),
                "name": format!("Ana <b>&</b> {i}"),
                "line_user_id": format!("U{i:032x}"),
                "email": format!("r{i:06}@example.test"),
                "phone": format!("+1555{i:07}"),
                "vars": {"order_id": format!("A-{i}")}
            })
        })
        .collect();
    json!({
        "batch_id": batch_id,
        "template": {
            "id": "order-confirmation", "version": 1,
            "subject": "Order {{order_id}} received",
            "text": "Hi {{name}}, order {{order_id}}", "html": "<p>Hi {{name}}</p>",
            "line": "Hi {{name}} {{order_id}}", "sms": "Order {{order_id}} for {{name}}"
        },
        "channels": channels,
        "recipients": recipients,
    })
}

/// Counts of deliveries by state.
pub async fn states(pool: &PgPool) -> HashMap<String, i64> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM deliveries GROUP BY state")
            .fetch_all(pool)
            .await
            .unwrap();
    rows.into_iter().collect()
}

/// A minimal SMTP server: rejects RCPT for addresses containing `bad` (550 5.1.1), answers the
/// first DATA for addresses containing `flaky` with 451 (after reading it), accepts the rest.
#[derive(Default)]
pub struct SmtpFake {
    /// (recipient, raw DATA) of every DATA received, accepted or not.
    pub data: Mutex<Vec<(String, String)>>,
    /// Recipients whose DATA got a 250.
    pub accepted: Mutex<Vec<String>>,
    /// `hangup@` recipients whose first RCPT the fake answered by closing the connection.
    pub hung_up: Mutex<std::collections::HashSet<String>>,
}

pub async fn start_smtp() -> (Arc<SmtpFake>, String) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let fake = Arc::new(SmtpFake::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let f = fake.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let f = f.clone();
            tokio::spawn(async move {
                let (r, mut w) = sock.into_split();
                let mut r = BufReader::new(r);
                let _ = w.write_all(b"220 fake ESMTP\r\n").await;
                let mut rcpt = String::new();
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let cmd = line.trim_end().to_ascii_uppercase();
                    let reply: &[u8] = if cmd.starts_with("EHLO") {
                        b"250-fake\r\n250 8BITMIME\r\n"
                    } else if cmd.starts_with("RCPT TO") {
                        rcpt = line.trim_end().to_string();
                        // `hangup@`: the connection drops at RCPT the first time (nothing
                        // committed; a plain retry must follow).
                        if rcpt.contains("hangup") && f.hung_up.lock().unwrap().insert(rcpt.clone())
                        {
                            return;
                        }
                        if rcpt.contains("bad") {
                            b"550 5.1.1 mailbox unknown\r\n"
                        } else {
                            b"250 2.1.5 ok\r\n"
                        }
                    } else if cmd == "DATA" {
                        let _ = w.write_all(b"354 go ahead\r\n").await;
                        let mut data = String::new();
                        loop {
                            let mut l = String::new();
                            if r.read_line(&mut l).await.unwrap_or(0) == 0 {
                                return;
                            }
                            if l == ".\r\n" {
                                break;
                            }
                            data.push_str(&l);
                        }
                        let first_flaky = {
                            let mut all = f.data.lock().unwrap();
                            let seen = all.iter().any(|(to, _)| *to == rcpt);
                            all.push((rcpt.clone(), data));
                            rcpt.contains("flaky") && !seen
                        };
                        if first_flaky {
                            b"451 4.3.0 try again later\r\n"
                        } else {
                            f.accepted.lock().unwrap().push(rcpt.clone());
                            b"250 2.0.0 queued\r\n"
                        }
                    } else if cmd == "QUIT" {
                        let _ = w.write_all(b"221 bye\r\n").await;
                        return;
                    } else {
                        b"250 ok\r\n"
                    };
                    if w.write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (fake, addr)
}

/// A TCP proxy in front of `upstream` (`postgres://…@host:port/db`) that can be frozen: while
/// `frozen` is true nothing is forwarded either way (connections stay open, answers never come),
/// like a database behind a dead network. Returns the switch and the URL through the proxy.
pub async fn start_freezable_proxy(upstream: &str) -> (Arc<AtomicBool>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let at = upstream.find('@').unwrap() + 1;
    let end = at + upstream[at..].find('/').unwrap();
    let target = upstream[at..end].to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = listener.local_addr().unwrap().to_string();
    let url = format!("{}{local}{}", &upstream[..at], &upstream[end..]);
    let frozen = Arc::new(AtomicBool::new(false));
    let f = frozen.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                continue;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            for (mut r, mut w) in [
                (
                    Box::new(cr) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
                    Box::new(sw) as Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
                ),
                (Box::new(sr) as _, Box::new(cw) as _),
            ] {
                let f = f.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = match r.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        while f.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        if w.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        }
    });
    (frozen, url)
}

/// A TCP listener that accepts connections and never says a word (a database that hangs during
/// the handshake). Returns the `postgres://` URL and how many connections it has accepted.
pub async fn start_silent_db() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            held.push(sock);
        }
    });
    (format!("postgres://postgres@{addr}/ting"), accepted)
}

/// The `/metrics` text of the API at `addr`.
pub async fn metrics(addr: &str) -> String {
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the sample `name{labels}` (exactly as written, e.g.
/// `ting_attempts_total{channel="line",class="accepted"}`) in a Prometheus text, if present.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}
