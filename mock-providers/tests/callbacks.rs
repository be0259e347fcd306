//! Delivery reports: SMS status callbacks and e-mail events, every variant at its configured
//! rate, signatures that verify (and forged ones that don't, or are missing), and retries on 5xx /
//! timeout.

mod common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use common::*;
use mock_providers::callbacks::plan::UNSIGNED_SHARE;
use mock_providers::config::{CallbackConfig, ProvidersConfig};
use mock_providers::ledger::{CallbackVariant, EntryKind, LedgerEntry, Outcome, Provider};
use mock_providers::signing::{verify_ting, verify_twilio};
use mock_providers::units::Ratio;

/// What the receiver does with the first try of each callback.
#[derive(Clone, Copy, PartialEq)]
enum First {
    Ok,
    Fail500,
    Hang,
}

#[derive(Clone, Debug)]
struct Got {
    token: String,
    params: HashMap<String, String>,
    json: serde_json::Value,
    /// A signature header was there (right or wrong).
    signed: bool,
    valid: bool,
}

#[derive(Clone)]
struct Receiver {
    url: String,
    auth_token: String,
    secret: String,
    first: First,
    got: Arc<Mutex<Vec<Got>>>,
    seen: Arc<Mutex<HashSet<String>>>,
}

async fn sms_cb(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let params: Vec<(String, String)> = serde_urlencoded::from_bytes(&body).unwrap();
    let sig = headers
        .get("x-twilio-signature")
        .map(|v| v.to_str().unwrap());
    let token = headers
        .get("i-twilio-idempotency-token")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let valid = sig
        .is_some_and(|sig| verify_twilio(&r.auth_token, &format!("{}/sms", r.url), &params, sig));
    record(
        &r,
        token,
        params.into_iter().collect(),
        serde_json::Value::Null,
        (sig.is_some(), valid),
    )
    .await
}

async fn email_cb(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let sig = headers.get("x-ting-signature").map(|v| v.to_str().unwrap());
    let valid = sig.is_some_and(|sig| verify_ting(&r.secret, &body, sig));
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let token = json["id"].as_str().unwrap().to_string();
    record(&r, token, HashMap::new(), json, (sig.is_some(), valid)).await
}

async fn record(
    r: &Receiver,
    token: String,
    params: HashMap<String, String>,
    json: serde_json::Value,
    (signed, valid): (bool, bool),
) -> StatusCode {
    let first_time = r.seen.lock().unwrap().insert(token.clone());
    if first_time && r.first == First::Hang {
        // Never answers: longer than any callback timeout.
        std::future::pending::<()>().await;
    }
    if first_time && r.first == First::Fail500 {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    r.got.lock().unwrap().push(Got {
        token,
        params,
        json,
        signed,
        valid,
    });
    if valid {
        StatusCode::OK
    } else {
        StatusCode::FORBIDDEN
    }
}

async fn receiver(first: First, cfg: &ProvidersConfig) -> Receiver {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let r = Receiver {
        url: format!("http://{addr}"),
        auth_token: cfg.sms.auth_token.clone(),
        secret: cfg.smtp.events_secret.clone(),
        first,
        got: Arc::default(),
        seen: Arc::default(),
    };
    let app = Router::new()
        .route("/sms", post(sms_cb))
        .route("/email", post(email_cb))
        .with_state(r.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    r
}

/// Every variant at `rate`. The receiver answers at once; the callback timeout is far above any
/// stall of this process, so no callback is retried (retries would add ledger entries; they are
/// covered by `retries_on_5xx_and_timeout`).
fn variants(rate: f64) -> CallbackConfig {
    CallbackConfig {
        enabled: true,
        timeout: ms(30_000),
        delay_min: ms(1),
        delay_max: ms(30),
        duplicate_rate: Ratio(rate),
        stale_rate: Ratio(rate),
        out_of_order_rate: Ratio(rate),
        forged_rate: Ratio(rate),
        unknown_id_rate: Ratio(rate),
        fail_rate: Ratio(rate),
        ..CallbackConfig::default()
    }
}

fn callbacks(entries: &[LedgerEntry]) -> Vec<&LedgerEntry> {
    entries
        .iter()
        .filter(|e| e.kind == EntryKind::Callback)
        .collect()
}

fn count(entries: &[&LedgerEntry], v: CallbackVariant) -> usize {
    entries
        .iter()
        .filter(|e| e.callback_variant == Some(v))
        .count()
}

async fn quiesce(w: &World) {
    tokio::time::timeout(Duration::from_secs(30), w.p.callbacks_quiesced())
        .await
        .expect("callbacks quiesce");
}

const N: u32 = 200;
const RATE: f64 = 0.25;

/// `n` is within ±50% (and ±8) of `rate × total`.
fn near(n: usize, rate: f64, total: usize, what: &str) {
    let want = rate * total as f64;
    let slack = (want * 0.5).max(8.0);
    assert!(
        (n as f64 - want).abs() <= slack,
        "{what}: {n}, expected about {want}"
    );
}

#[tokio::test]
async fn sms_status_callbacks_every_variant() {
    let mut cfg = ProvidersConfig::default();
    cfg.sms.callbacks = variants(RATE);
    let rx = receiver(First::Ok, &cfg).await;
    let w = world(5, cfg).await;
    let cb = format!("{}/sms", rx.url);
    let mut sids = HashSet::new();
    for i in 0..N {
        let r = w.sms_send(&phone(i), "hello", Some(&cb)).await;
        sids.insert(r.json["sid"].as_str().unwrap().to_string());
    }
    quiesce(&w).await;
    let entries = w.entries();
    let cbs = callbacks(&entries);
    let got = rx.got.lock().unwrap().clone();
    assert_eq!(
        cbs.len(),
        got.len(),
        "one ledger entry per callback received"
    );
    assert_eq!(count(&cbs, CallbackVariant::Genuine), 2 * N as usize);
    near(
        count(&cbs, CallbackVariant::Duplicate),
        RATE,
        2 * N as usize,
        "duplicates",
    );
    near(
        count(&cbs, CallbackVariant::Stale),
        RATE,
        N as usize,
        "stale",
    );
    assert_forgeries(&cbs, &got);
    near(
        count(&cbs, CallbackVariant::UnknownId),
        RATE,
        N as usize,
        "unknown id",
    );

    for e in &cbs {
        let forged = e.callback_variant.is_some_and(CallbackVariant::is_forged);
        assert_eq!(
            e.callback_response,
            Some(if forged { 403 } else { 200 }),
            "{e:?}"
        );
        let sid = e.message_id.as_deref().unwrap();
        let unknown = e.callback_variant == Some(CallbackVariant::UnknownId);
        assert_eq!(sids.contains(sid), !unknown, "{e:?}");
        if e.callback_variant == Some(CallbackVariant::Stale) {
            assert_eq!(e.callback_status.as_deref(), Some("sent"));
        }
    }
    // Duplicates repeat a genuine callback's token; everything else has a token of its own.
    let by_token: HashMap<&str, Vec<&Got>> = got.iter().fold(HashMap::new(), |mut m, g| {
        m.entry(g.token.as_str()).or_default().push(g);
        m
    });
    for (token, copies) in &by_token {
        assert!(copies.len() <= 2, "{token}");
        assert!(
            copies.iter().all(|c| c.params == copies[0].params),
            "duplicates are identical"
        );
    }
    assert_eq!(
        by_token.len(),
        got.len() - count(&cbs, CallbackVariant::Duplicate)
    );
    // Genuine final statuses: a share fails, with an ErrorCode; delivered ones have none.
    let finals: Vec<&Got> = got
        .iter()
        .filter(|g| {
            g.valid && g.params["MessageStatus"] != "sent" && sids.contains(&g.params["MessageSid"])
        })
        .collect();
    let failed = finals
        .iter()
        .filter(|g| g.params["MessageStatus"] != "delivered")
        .count();
    near(failed, RATE, finals.len(), "failures");
    for g in &finals {
        assert_eq!(
            g.params.contains_key("ErrorCode"),
            g.params["MessageStatus"] != "delivered"
        );
        for k in [
            "AccountSid",
            "To",
            "From",
            "SmsSid",
            "SmsStatus",
            "ApiVersion",
        ] {
            assert!(g.params.contains_key(k), "{k} missing");
        }
    }
    // A forged callback claims the opposite of the truth.
    for e in cbs
        .iter()
        .filter(|e| e.callback_variant.is_some_and(CallbackVariant::is_forged))
    {
        let truth = cbs
            .iter()
            .find(|g| {
                g.callback_variant == Some(CallbackVariant::Genuine)
                    && g.message_id == e.message_id
                    && g.callback_status.as_deref() != Some("sent")
            })
            .unwrap();
        assert_ne!(
            (e.callback_status.as_deref() == Some("delivered")),
            (truth.callback_status.as_deref() == Some("delivered"))
        );
    }
    assert_eq!(w.p.pending_callbacks(), 0);
}

#[tokio::test]
async fn no_callbacks_when_disabled_or_without_status_callback() {
    let mut cfg = ProvidersConfig::default();
    cfg.sms.callbacks = CallbackConfig {
        enabled: false,
        ..variants(1.0)
    };
    let rx = receiver(First::Ok, &cfg).await;
    let w = world(5, cfg.clone()).await;
    w.sms_send(&phone(1), "x", Some(&format!("{}/sms", rx.url)))
        .await;
    cfg.sms.callbacks.enabled = true;
    w.p.set_config(cfg);
    w.sms_send(&phone(2), "x", None).await;
    assert_eq!(w.p.pending_callbacks(), 0);
}

#[tokio::test]
async fn email_events_every_variant() {
    let mut cfg = ProvidersConfig::default();
    cfg.smtp.events = variants(RATE);
    let rx = receiver(First::Ok, &cfg).await;
    cfg.smtp.events.url = Some(format!("{}/email", rx.url));
    let w = world(6, cfg).await;
    let mut ids = HashSet::new();
    for i in 0..N {
        let mut e = LedgerEntry::draft(
            Provider::Smtp,
            EntryKind::Send,
            format!("r{i}@example.test"),
        );
        e.outcome = Outcome::Accepted;
        e.attempt = 1;
        e.message_id = Some(format!("m{i}@example.test"));
        ids.insert(e.message_id.clone().unwrap());
        w.p.hub().email_accepted(&e);
    }
    quiesce(&w).await;
    let entries = w.entries();
    let cbs = callbacks(&entries);
    let got = rx.got.lock().unwrap().clone();
    assert_eq!(cbs.len(), got.len());
    assert_eq!(count(&cbs, CallbackVariant::Genuine), N as usize);
    for (v, what) in [
        (CallbackVariant::Duplicate, "duplicates"),
        (CallbackVariant::Stale, "stale"),
        (CallbackVariant::UnknownId, "unknown id"),
    ] {
        near(count(&cbs, v), RATE, N as usize, what);
    }
    assert_forgeries(&cbs, &got);
    for g in &got {
        let j = &g.json;
        for k in [
            "id",
            "type",
            "message_id",
            "recipient",
            "timestamp",
            "reason",
        ] {
            assert!(j.get(k).is_some(), "{k} missing in {j}");
        }
        assert!(["delivered", "bounced"].contains(&j["type"].as_str().unwrap()));
        assert_eq!(j["reason"].is_string(), j["type"] == "bounced");
        chrono::DateTime::parse_from_rfc3339(j["timestamp"].as_str().unwrap()).unwrap();
    }
    for e in &cbs {
        let forged = e.callback_variant.is_some_and(CallbackVariant::is_forged);
        assert_eq!(e.callback_response, Some(if forged { 403 } else { 200 }));
        let unknown = e.callback_variant == Some(CallbackVariant::UnknownId);
        assert_eq!(ids.contains(e.message_id.as_deref().unwrap()), !unknown);
    }
    let bounced = got
        .iter()
        .filter(|g| {
            g.valid
                && g.json["type"] == "bounced"
                && ids.contains(g.json["message_id"].as_str().unwrap())
        })
        .count();
    let finals = got
        .iter()
        .filter(|g| g.valid && ids.contains(g.json["message_id"].as_str().unwrap()))
        .count();
    near(bounced, RATE, finals, "bounces");
}

/// Forged reports come at `RATE` per message, about `UNSIGNED_SHARE` of them with no signature
/// header at all and the rest signed with a wrong key; every other report carries a signature.
fn assert_forgeries(cbs: &[&LedgerEntry], got: &[Got]) {
    let wrong_key = count(cbs, CallbackVariant::ForgedSignature);
    let unsigned = count(cbs, CallbackVariant::Unsigned);
    near(wrong_key + unsigned, RATE, N as usize, "forged");
    near(
        unsigned,
        UNSIGNED_SHARE,
        wrong_key + unsigned,
        "unsigned forgeries",
    );
    let unsigned_tokens: HashSet<&str> = cbs
        .iter()
        .filter(|e| e.callback_variant == Some(CallbackVariant::Unsigned))
        .map(|e| e.idempotency_key.as_deref().unwrap())
        .collect();
    for g in got {
        assert_eq!(
            g.signed,
            !unsigned_tokens.contains(g.token.as_str()),
            "{g:?}"
        );
    }
}

#[tokio::test]
async fn retries_on_5xx_and_timeout() {
    // (receiver's first answer, response recorded for try 1)
    for (first, first_response) in [(First::Fail500, Some(500)), (First::Hang, None)] {
        let mut cfg = ProvidersConfig::default();
        // Long enough that a stalled second try is not cut short too (it would add a third);
        // the hanging receiver never answers, so its first try still times out.
        cfg.sms.callbacks = CallbackConfig {
            timeout: ms(2_000),
            ..variants(0.0)
        };
        let rx = receiver(first, &cfg).await;
        let w = world(7, cfg).await;
        w.sms_send(&phone(1), "x", Some(&format!("{}/sms", rx.url)))
            .await;
        quiesce(&w).await;
        let entries = w.entries();
        let cbs = callbacks(&entries);
        assert_eq!(cbs.len(), 4, "two callbacks, each tried twice");
        for status in ["sent", "delivered"] {
            let tries: Vec<(Option<u32>, Option<u16>)> = cbs
                .iter()
                .filter(|e| e.callback_status.as_deref() == Some(status))
                .map(|e| (e.callback_try, e.callback_response))
                .collect();
            assert_eq!(
                tries,
                [(Some(1), first_response), (Some(2), Some(200))],
                "{status}"
            );
        }
        assert_eq!(rx.got.lock().unwrap().len(), 2);
        for e in &cbs {
            // Every try says how late it began and how long the answer took: a timed-out try
            // took the whole timeout, an answered one less.
            let took = e.callback_took_ms.expect("took_ms on every try");
            assert!(e.callback_late_ms.is_some(), "late_ms on every try");
            if e.callback_response.is_none() {
                assert!(took >= 1_900, "a timeout is the whole 2 s: {took}");
            } else {
                assert!(took < 1_900, "answered: {took}");
            }
        }
    }
}

/// The reports go out from their own runtime: a harness that blocks its own runtime's threads
/// (a long serialisation, a busy check) does not make them late.
#[tokio::test(flavor = "current_thread")]
async fn a_blocked_harness_runtime_does_not_delay_the_reports() {
    let mut cfg = ProvidersConfig::default();
    cfg.sms.callbacks = CallbackConfig {
        delay_min: ms(100),
        delay_max: ms(100),
        ..variants(0.0)
    };
    let rx = receiver(First::Ok, &cfg).await;
    let w = world(9, cfg).await;
    w.sms_send(&phone(1), "x", Some(&format!("{}/sms", rx.url)))
        .await;
    // Block the only thread of the test's runtime for 1.5 s, across the reports' due time.
    std::thread::sleep(Duration::from_millis(1_500));
    quiesce(&w).await;
    let entries = w.entries();
    let cbs = callbacks(&entries);
    assert_eq!(cbs.len(), 2);
    for e in &cbs {
        assert_eq!(e.callback_response, Some(200));
        let late = e.callback_late_ms.unwrap_or(u64::MAX);
        assert!(
            late < 1_000,
            "report began {late} ms late behind the harness"
        );
    }
}

#[tokio::test]
async fn gives_up_after_max_retries_and_reset_cancels() {
    let mut cfg = ProvidersConfig::default();
    cfg.sms.callbacks = CallbackConfig {
        max_retries: 2,
        ..variants(0.0)
    };
    // A receiver that takes every connection and closes it unanswered: every try is a
    // connection error that uses up a retry. (A receiver that refuses connections is a stack
    // restarting its API and is waited for: `callback_e2e.rs`.)
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/sms", dead.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((conn, _)) = dead.accept().await {
            drop(conn);
        }
    });
    let w = world(8, cfg.clone()).await;
    assert_eq!(w.p.report_plan(), None, "nothing planned yet");
    w.sms_send(&phone(1), "x", Some(&url)).await;
    let planned = w.p.report_plan().expect("two reports planned");
    assert!(planned.longest <= Duration::from_millis(30), "{planned:?}");
    quiesce(&w).await;
    // The retries followed the receiver's answers, not the plan: the plan did not move.
    assert_eq!(w.p.report_plan(), Some(planned));
    assert!(planned.last_due <= std::time::Instant::now());
    let entries = w.entries();
    let cbs = callbacks(&entries);
    assert_eq!(
        cbs.len(),
        2 * 3,
        "1 try + 2 retries for each of two callbacks"
    );
    assert!(cbs
        .iter()
        .all(|e| e.callback_response.is_none() && e.error.is_some()));

    // Reset drops reports still due.
    let mut slow = cfg;
    slow.sms.callbacks.delay_min = ms(60_000);
    slow.sms.callbacks.delay_max = ms(60_000);
    w.p.set_config(slow);
    w.sms_send(&phone(2), "x", Some(&url)).await;
    assert_eq!(w.p.pending_callbacks(), 2);
    // Planned a minute on: until then the stack cannot have them.
    let plan = w.p.report_plan().expect("planned");
    assert!(plan.last_due >= std::time::Instant::now() + std::time::Duration::from_secs(59));
    assert_eq!(plan.longest, Duration::from_secs(60));
    w.p.hub().reset();
    quiesce(&w).await;
    assert!(w.p.ledger.is_empty());
}

/// A stack slower than the reports arrive is sent at most `MAX_IN_FLIGHT` at once per provider;
/// the others wait for a slot, and that wait is recorded apart from the dispatcher's lateness.
#[tokio::test]
async fn a_slow_stack_gets_a_bounded_number_of_reports_at_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    #[derive(Clone, Default)]
    struct Gauge {
        now: Arc<AtomicUsize>,
        max: Arc<AtomicUsize>,
    }
    async fn slow(State(g): State<Gauge>) -> StatusCode {
        let n = g.now.fetch_add(1, Ordering::SeqCst) + 1;
        g.max.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        g.now.fetch_sub(1, Ordering::SeqCst);
        StatusCode::OK
    }
    let gauge = Gauge::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/sms", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/sms", post(slow))
        .with_state(gauge.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut cfg = ProvidersConfig::default();
    cfg.sms.callbacks = variants(0.0);
    let w = world(11, cfg).await;
    for i in 0..50 {
        w.sms_send(&phone(i), "x", Some(&url)).await;
    }
    quiesce(&w).await;
    let entries = w.entries();
    let cbs = callbacks(&entries);
    assert_eq!(
        cbs.len(),
        100,
        "two reports per message, each answered once"
    );
    assert!(cbs.iter().all(|e| e.callback_response == Some(200)));
    let max = gauge.max.load(Ordering::SeqCst);
    assert!(
        max <= mock_providers::callbacks::MAX_IN_FLIGHT,
        "{max} reports in flight at once"
    );
    assert!(
        cbs.iter().any(|e| e.callback_queued_ms.unwrap_or(0) >= 50),
        "reports due while the stack was busy waited for a slot"
    );
}

/// A receiver that answers with a body that never ends is read no further than
/// `ANSWER_DRAIN` bytes (it used to be read whole, until the report's timeout, into memory), and
/// a redirect is its answer, recorded as such and not followed.
#[tokio::test]
async fn a_receivers_endless_answer_or_redirect_is_recorded_not_followed() {
    use axum::body::Body;
    use axum::response::Response;
    async fn endless() -> Response {
        let chunks = futures::stream::repeat_with(|| {
            Ok::<_, std::io::Error>(Bytes::from_static(&[b'x'; 16 * 1024]))
        });
        Response::new(Body::from_stream(chunks))
    }
    async fn moved() -> Response {
        Response::builder()
            .status(StatusCode::FOUND)
            .header("location", "/elsewhere")
            .body(Body::empty())
            .unwrap()
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/endless", post(endless))
        .route("/moved", post(moved))
        .route("/elsewhere", post(|| async { StatusCode::OK }));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut cfg = ProvidersConfig::default();
    cfg.sms.callbacks = variants(0.0);
    let w = world(12, cfg).await;
    w.sms_send(&phone(1), "x", Some(&format!("{base}/endless")))
        .await;
    w.sms_send(&phone(2), "x", Some(&format!("{base}/moved")))
        .await;
    quiesce(&w).await;
    let entries = w.entries();
    let cbs = callbacks(&entries);
    assert_eq!(cbs.len(), 4, "two reports per message, each tried once");
    for e in &cbs {
        let url = e.callback_url.as_deref().unwrap_or_default();
        let want = if url.ends_with("/endless") { 200 } else { 302 };
        assert_eq!(e.callback_response, Some(want), "{url}");
        assert!(e.callback_took_ms.unwrap_or(u64::MAX) < 10_000, "{e:?}");
    }
}
