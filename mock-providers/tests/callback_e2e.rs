//! Delivery reports end to end, seen by a receiver on the other side of real sockets: e-mail
//! events for messages sent over SMTP (by lettre), to the scenario's URL or the message's
//! `X-Events-Url`, with their HMAC checked independently; SMS status callbacks; both arriving
//! inside their configured delay range; and out-of-order status callbacks arriving out of order.
//!
//! Every wait is a condition polled against a deadline; timing bounds are measured around the
//! send against the seeded plan's delay for that report (lower bound from before the send, upper
//! bound from after it, plus a slack for scheduling). That the planned delays themselves fall
//! inside the configured range is checked without clocks (`planned_delays_fall_within_the_range`).

mod common;
mod smtp_support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use common::*;
use hmac::{Hmac, Mac};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use mock_providers::callbacks::plan;
use mock_providers::config::{CallbackConfig, ProvidersConfig};
use mock_providers::ledger::{CallbackVariant, EntryKind, Outcome, Provider};
use mock_providers::signing::verify_twilio;
use mock_providers::sms::store::service_number;
use sha2::Sha256;
use smtp_support::XEventsUrl;

/// Upper-bound slack for a callback's arrival after its planned delay: task wake-ups and a
/// loopback HTTP request on a busy 2-core machine, where the test process may be descheduled
/// for a second or more.
const SLACK: Duration = Duration::from_secs(3);

/// One request the receiver got.
#[derive(Clone, Debug)]
struct Hit {
    path: String,
    at: Instant,
    headers: HeaderMap,
    body: Bytes,
}

impl Hit {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    fn form(&self) -> HashMap<String, String> {
        serde_urlencoded::from_bytes::<Vec<(String, String)>>(&self.body)
            .unwrap()
            .into_iter()
            .collect()
    }

    fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} on {self:?}"))
            .to_str()
            .unwrap()
            .to_string()
    }
}

#[derive(Clone)]
struct Receiver {
    base: String,
    hits: Arc<Mutex<Vec<Hit>>>,
}

async fn hit(
    State(hits): State<Arc<Mutex<Vec<Hit>>>>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    hits.lock().unwrap().push(Hit {
        path: format!("/{path}"),
        at: Instant::now(),
        headers,
        body,
    });
    StatusCode::OK
}

async fn receiver() -> Receiver {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let hits: Arc<Mutex<Vec<Hit>>> = Arc::default();
    let app = Router::new()
        .route("/{*path}", post(hit))
        .with_state(hits.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Receiver {
        base: format!("http://{addr}"),
        hits,
    }
}

impl Receiver {
    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    /// Waits until `n` requests arrived, then a little longer to catch any extra one.
    async fn wait_for(&self, n: usize, secs: u64) -> Vec<Hit> {
        until(secs, || self.hits.lock().unwrap().len() >= n).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.hits()
    }
}

/// `sha256=` + hex HMAC-SHA256 of `body`, computed here without the crate's signer.
fn hmac_sha256(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

fn reports(min: u64, max: u64) -> CallbackConfig {
    CallbackConfig {
        enabled: true,
        delay_min: ms(min),
        delay_max: ms(max),
        ..CallbackConfig::default()
    }
}

fn smtp(w: &World) -> AsyncSmtpTransport<Tokio1Executor> {
    AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
        .port(w.p.smtp_addr.port())
        .build()
}

fn email(id: &str, to: &str, events_url: Option<&str>) -> Message {
    let mut b = Message::builder()
        .from("Shop <shop@x.test>".parse().unwrap())
        .to(to.parse().unwrap())
        .subject("Your order")
        .message_id(Some(format!("<{id}>")));
    if let Some(u) = events_url {
        b = b.header(XEventsUrl(u.to_string()));
    }
    b.body("Hi, your order shipped.".to_string()).unwrap()
}

/// Addresses whose first attempt the seeded event plan reports as `delivered` and as `bounced`.
fn delivered_and_bounced(seed: u64, cfg: &CallbackConfig) -> (String, String) {
    let status = |a: &str| plan::email(seed, a, 1, "<m>", cfg)[0].status;
    let addrs: Vec<String> = (0..100).map(|i| format!("ev{i}@x.test")).collect();
    let ok = addrs.iter().find(|a| status(a) == "delivered").unwrap();
    let bad = addrs.iter().find(|a| status(a) == "bounced").unwrap();
    (ok.clone(), bad.clone())
}

/// Sends `msg` over SMTP and returns (just before, just after).
async fn timed_send(t: &AsyncSmtpTransport<Tokio1Executor>, msg: Message) -> (Instant, Instant) {
    let before = Instant::now();
    t.send(msg).await.expect("accepted");
    (before, Instant::now())
}

/// The report arrived no earlier than its planned delay after the send began, and no later than
/// that delay (+ [`SLACK`]) after the send returned. `planned` is the seeded plan's delay, which
/// `planned_delays_fall_within_the_range` checks lies inside the configured range.
fn assert_within(
    what: &str,
    arrival: Instant,
    window: (Instant, Instant),
    planned: Duration,
    cfg: &CallbackConfig,
) {
    let (before, after) = window;
    let (min, max) = (cfg.delay_min.0, cfg.delay_max.0);
    assert!(
        (min..=max).contains(&planned),
        "{what}: planned delay {planned:?} outside [{min:?}, {max:?}]"
    );
    let early = arrival.duration_since(before);
    assert!(
        early >= planned,
        "{what}: arrived {early:?} after the send began, planned {planned:?}"
    );
    let late = arrival.saturating_duration_since(after);
    assert!(
        late <= planned + SLACK,
        "{what}: arrived {late:?} after the send returned, planned {planned:?} + {SLACK:?}"
    );
}

/// The delay the seeded plan gives the genuine e-mail event of `recipient`'s first attempt.
fn planned_email_delay(seed: u64, recipient: &str, cfg: &CallbackConfig) -> Duration {
    let plan = plan::email(seed, recipient, 1, "<m>", cfg);
    let genuine: Vec<_> = plan
        .iter()
        .filter(|p| p.variant == CallbackVariant::Genuine)
        .collect();
    assert_eq!(genuine.len(), 1, "{plan:?}");
    genuine[0].at
}

/// The delay the seeded plan gives the genuine SMS status callback `status` of `to`'s first
/// attempt.
fn planned_sms_delay(seed: u64, to: &str, status: &str, cfg: &CallbackConfig) -> Duration {
    let plan = plan::sms(seed, to, 1, "SMx", cfg);
    let found: Vec<_> = plan
        .reports
        .iter()
        .filter(|p| p.variant == CallbackVariant::Genuine && p.status == status)
        .collect();
    assert_eq!(found.len(), 1, "{to} {status}: {plan:?}");
    found[0].at
}

/// Pure: every genuine report the plans schedule, for the delay ranges these tests use, is due
/// inside `[delay_min, delay_max]` after acceptance, whatever the recipient and seed.
#[test]
fn planned_delays_fall_within_the_range() {
    for (min, max) in [(300, 700), (20, 3000), (1, 30)] {
        let cfg = CallbackConfig {
            fail_rate: mock_providers::units::Ratio(0.5),
            ..reports(min, max)
        };
        let range = ms(min).0..=ms(max).0;
        let mut spread = (Duration::MAX, Duration::ZERO);
        for seed in [21, 23, 24] {
            for i in 0..200 {
                let addr = format!("ev{i}@x.test");
                let at = planned_email_delay(seed, &addr, &cfg);
                assert!(range.contains(&at), "{addr}: {at:?} outside {range:?}");
                let to = phone(i);
                let p = plan::sms(seed, &to, 1, "SMx", &cfg);
                assert!(
                    p.timeline.sent_after() <= p.timeline.final_after(),
                    "{to}: {p:?}"
                );
                for at in [p.timeline.sent_after(), p.timeline.final_after()] {
                    assert!(range.contains(&at), "{to}: {at:?} outside {range:?}");
                    spread = (spread.0.min(at), spread.1.max(at));
                }
                for r in p
                    .reports
                    .iter()
                    .filter(|r| r.variant == CallbackVariant::Genuine)
                {
                    assert!(range.contains(&r.at), "{to}: {r:?} outside {range:?}");
                }
            }
        }
        // The delays are drawn across the range, not pinned to one end of it.
        let quarter = (*range.end() - *range.start()) / 4;
        assert!(
            spread.0 <= *range.start() + quarter && spread.1 >= *range.end() - quarter,
            "[{min}, {max}] ms: delays only span {spread:?}"
        );
    }
}

/// A message accepted over SMTP gets a signed `delivered` event at the scenario's URL, and one
/// whose seeded fate is a bounce gets a signed `bounced` event; both inside the delay range.
#[tokio::test]
async fn email_events_over_smtp_reach_the_scenario_url_signed_and_on_time() {
    let seed = 21;
    let rx = receiver().await;
    let mut cfg = ProvidersConfig::default();
    cfg.smtp.events = CallbackConfig {
        fail_rate: mock_providers::units::Ratio(0.5),
        url: Some(format!("{}/events", rx.base)),
        ..reports(300, 700)
    };
    let secret = cfg.smtp.events_secret.clone();
    let (ok, bounce) = delivered_and_bounced(seed, &cfg.smtp.events);
    let w = world(seed, cfg.clone()).await;
    let t = smtp(&w);
    let sent_ok = timed_send(&t, email("ok@shop.test", &ok, None)).await;
    let sent_bounce = timed_send(&t, email("bounce@shop.test", &bounce, None)).await;

    let hits = rx.wait_for(2, 10).await;
    assert_eq!(hits.len(), 2, "{hits:?}");
    let mut by_type = HashMap::new();
    for h in &hits {
        assert_eq!(h.path, "/events");
        assert_eq!(h.header("content-type"), "application/json");
        // The signature is HMAC-SHA256 over the exact body bytes.
        assert_eq!(h.header("x-ting-signature"), hmac_sha256(&secret, &h.body));
        let j = h.json();
        by_type.insert(j["type"].as_str().unwrap().to_string(), (j, h.at));
    }
    let (delivered, at) = &by_type["delivered"];
    assert_eq!(delivered["recipient"], ok.as_str());
    assert_eq!(delivered["message_id"], "ok@shop.test");
    let planned = planned_email_delay(seed, &ok, &cfg.smtp.events);
    assert_within("delivered", *at, sent_ok, planned, &cfg.smtp.events);
    let (bounced, at) = &by_type["bounced"];
    assert_eq!(bounced["recipient"], bounce.as_str());
    assert_eq!(bounced["message_id"], "bounce@shop.test");
    assert!(bounced["reason"].as_str().unwrap().starts_with("550"));
    let planned = planned_email_delay(seed, &bounce, &cfg.smtp.events);
    assert_within("bounced", *at, sent_bounce, planned, &cfg.smtp.events);

    // The ledger has both sends accepted and one answered event each.
    tokio::time::timeout(Duration::from_secs(10), w.p.callbacks_quiesced())
        .await
        .unwrap();
    let entries = w.entries();
    let sends = entries
        .iter()
        .filter(|e| e.provider == Provider::Smtp && e.kind == EntryKind::Send);
    assert!(sends.clone().all(|e| e.outcome == Outcome::Accepted));
    assert_eq!(sends.count(), 2);
    let events: Vec<_> = entries
        .iter()
        .filter(|e| e.kind == EntryKind::Callback)
        .map(|e| {
            (
                e.recipient.clone(),
                e.callback_status.clone(),
                e.callback_response,
            )
        })
        .collect();
    assert_eq!(events.len(), 2);
    assert!(events.contains(&(ok.clone(), Some("delivered".into()), Some(200))));
    assert!(events.contains(&(bounce.clone(), Some("bounced".into()), Some(200))));
    w.p.shutdown().await;
}

/// A message's `X-Events-Url` header wins over the scenario's URL; a message without it still
/// goes to the scenario's.
#[tokio::test]
async fn email_events_go_to_the_url_in_the_message_header() {
    let rx = receiver().await;
    let mut cfg = ProvidersConfig::default();
    cfg.smtp.events = CallbackConfig {
        url: Some(format!("{}/config-url", rx.base)),
        ..reports(1, 30)
    };
    let secret = cfg.smtp.events_secret.clone();
    let w = world(22, cfg).await;
    let t = smtp(&w);
    let header_url = format!("{}/from-header/tenant-7", rx.base);
    t.send(email("h@shop.test", "h@x.test", Some(&header_url)))
        .await
        .unwrap();
    t.send(email("n@shop.test", "n@x.test", None))
        .await
        .unwrap();
    let hits = rx.wait_for(2, 10).await;
    let mut got: Vec<(String, String)> = hits
        .iter()
        .map(|h| {
            assert_eq!(h.header("x-ting-signature"), hmac_sha256(&secret, &h.body));
            (
                h.path.clone(),
                h.json()["message_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("/config-url".to_string(), "n@shop.test".to_string()),
            (
                "/from-header/tenant-7".to_string(),
                "h@shop.test".to_string()
            ),
        ]
    );
    w.p.shutdown().await;
}

/// Both SMS status callbacks of each message arrive at their planned delay (inside
/// `[delay_min, delay_max]`, + slack) after the create, correctly signed; a Messaging Service send's callbacks carry the
/// service's number as `From`.
#[tokio::test]
async fn sms_status_callbacks_arrive_within_the_delay_range() {
    let rx = receiver().await;
    let mut cfg = ProvidersConfig::default();
    cfg.sms.callbacks = reports(300, 700);
    let token = cfg.sms.auth_token.clone();
    let seed = 23;
    let w = world(seed, cfg.clone()).await;
    let cb = format!("{}/sms", rx.base);
    let mut windows = HashMap::new();
    let mut froms = HashMap::new();
    for i in 0..4 {
        let to = phone(100 + i);
        let before = Instant::now();
        let r = if i == 3 {
            let form = [
                ("To", to.as_str()),
                ("MessagingServiceSid", "MG00000000000000000000000000000001"),
                ("Body", "hi"),
                ("StatusCallback", cb.as_str()),
            ];
            w.sms_raw(true, &form, None).await
        } else {
            w.sms_send(&to, "hi", Some(&cb)).await
        };
        assert_eq!(r.status, 201, "{:?}", r.json);
        let sid = r.json["sid"].as_str().unwrap().to_string();
        windows.insert(sid.clone(), (before, Instant::now()));
        let from = if i == 3 {
            service_number("MG00000000000000000000000000000001")
        } else {
            "+15550009999".into()
        };
        froms.insert(sid, from);
    }
    let hits = rx.wait_for(8, 10).await;
    assert_eq!(hits.len(), 8, "two callbacks per message");
    for h in &hits {
        let form = h.form();
        let sid = &form["MessageSid"];
        let params: Vec<(String, String)> = form.clone().into_iter().collect();
        assert!(
            verify_twilio(&token, &cb, &params, &h.header("x-twilio-signature")),
            "{form:?}"
        );
        assert_eq!(form["From"], froms[sid], "{form:?}");
        let status = &form["MessageStatus"];
        let planned = planned_sms_delay(seed, &form["To"], status, &cfg.sms.callbacks);
        assert_within(
            &format!("{sid} {status}"),
            h.at,
            windows[sid],
            planned,
            &cfg.sms.callbacks,
        );
    }
    w.p.shutdown().await;
}

/// With out-of-order on, the final status reaches the receiver before `sent`; with it off, after.
/// Recipients are picked whose two report times are at least [`APART`] apart, so arrival order
/// is the planned order and not a race, even if this process is descheduled for a second.
/// How far apart the two status callbacks of a recipient in the out-of-order test are planned.
const APART: Duration = Duration::from_millis(1500);

#[tokio::test]
async fn out_of_order_callbacks_arrive_out_of_order() {
    for out_of_order in [true, false] {
        let rx = receiver().await;
        let seed = 24;
        let mut cfg = ProvidersConfig::default();
        cfg.sms.callbacks = CallbackConfig {
            out_of_order_rate: mock_providers::units::Ratio(if out_of_order { 1.0 } else { 0.0 }),
            ..reports(20, 3000)
        };
        let apart: Vec<String> = (0..200)
            .map(phone)
            .filter(|to| {
                let p = plan::sms(seed, to, 1, "SMx", &cfg.sms.callbacks);
                p.timeline.final_after() - p.timeline.sent_after() >= APART
            })
            .take(4)
            .collect();
        assert_eq!(apart.len(), 4);
        let w = world(seed, cfg).await;
        let cb = format!("{}/sms", rx.base);
        for to in &apart {
            assert_eq!(w.sms_send(to, "x", Some(&cb)).await.status, 201);
        }
        let hits = rx.wait_for(8, 20).await;
        assert_eq!(hits.len(), 8);
        for to in &apart {
            // Arrival order at the receiver, for this recipient.
            let statuses: Vec<String> = hits
                .iter()
                .map(Hit::form)
                .filter(|f| &f["To"] == to)
                .map(|f| f["MessageStatus"].clone())
                .collect();
            let want = if out_of_order {
                ["delivered", "sent"]
            } else {
                ["sent", "delivered"]
            };
            assert_eq!(statuses, want, "{to}, out of order: {out_of_order}");
        }
        w.p.shutdown().await;
    }
}

/// A receiver that refuses connections (the stack's API restarting) is tried again every 250 ms
/// without using up the report's retries: with `max_retries = 1`, a report still arrives once the
/// receiver listens again 1.5 s later, and every refused try is in the ledger.
#[tokio::test]
async fn reports_to_a_receiver_that_is_down_wait_for_it_to_come_back() {
    // A port nobody listens on yet: bound, read, released.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = ProvidersConfig::default();
    cfg.sms.callbacks = CallbackConfig {
        max_retries: 1,
        ..reports(1, 10)
    };
    let w = world(24, cfg).await;
    let cb = format!("http://{addr}/sms");
    assert_eq!(w.sms_send(&phone(7), "hi", Some(&cb)).await.status, 201);
    let refused = || {
        w.entries()
            .iter()
            .filter(|e| e.kind == mock_providers::ledger::EntryKind::Callback)
            .filter(|e| e.callback_response.is_none())
            .count()
    };
    until(20, || refused() >= 3).await;
    // The receiver comes back on the same address.
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let hits: Arc<Mutex<Vec<Hit>>> = Arc::default();
    let app = Router::new()
        .route("/{*path}", post(hit))
        .with_state(hits.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    until(20, || !hits.lock().unwrap().is_empty()).await;
    assert!(refused() >= 3, "the refused tries are recorded");
}
