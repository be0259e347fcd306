//! A provider-wide outage, set through `PUT /_mock/faults` as the harness's `provider_outage`
//! step sets it: `unavailable` answers every send 503 (recorded `outage_503`, transient); `hang`
//! reads the request and never answers, and the entry records that its sender hung up
//! (`outage_hang`, `client_hung_up`, status `no_answer`). Clearing it serves normally again; a
//! request already held stays unanswered (a black-holed connection). The SMTP fake decides at
//! each RCPT: `421` and the connection closed (`outage_421`), or the RCPT never answered.

mod common;

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use common::*;
use mock_providers::config::ProvidersConfig;
use mock_providers::ledger::{Outcome, Provider};
use mock_providers::outage::{Outage, OutageMode};
use serde_json::json;

/// Long enough for every hold of a test to count.
const HELD: Duration = Duration::from_secs(60);

async fn put_outage(w: &World, provider: &str, outage: serde_json::Value) -> u16 {
    w.http
        .put(format!(
            "{}/_mock/faults?provider={provider}",
            w.p.line_base()
        ))
        .json(&json!({ "outage": outage }))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn unavailable_answers_503_and_clears() {
    let w = world(1, ProvidersConfig::default()).await;
    assert_eq!(
        put_outage(&w, "line", json!({"mode": "unavailable"})).await,
        200
    );
    assert_eq!(
        put_outage(&w, "sms", json!({"mode": "unavailable"})).await,
        200
    );
    assert_eq!(w.line_push(&uid(1), None, "hi").await.status, 503);
    assert_eq!(w.sms_send(&phone(1), "hi", None).await.status, 503);
    for e in w.entries() {
        assert_eq!(e.outcome, Outcome::Transient, "{e:?}");
        assert_eq!(e.fault.as_deref(), Some("outage_503"), "{e:?}");
        assert_eq!(e.status, "503");
        assert_eq!(e.attempt, 1);
        assert!(!e.client_hung_up);
    }
    // A typo in the mode is refused and the outage stays as it was.
    assert_eq!(put_outage(&w, "line", json!({"mode": "hung"})).await, 400);
    assert_eq!(put_outage(&w, "line", json!(null)).await, 200);
    assert_eq!(put_outage(&w, "sms", json!(null)).await, 200);
    assert_eq!(w.line_push(&uid(1), None, "hi").await.status, 200);
    assert_eq!(w.sms_send(&phone(1), "hi", None).await.status, 201);
    let last = w.entries();
    assert!(last[2..]
        .iter()
        .all(|e| e.outcome == Outcome::Accepted && e.attempt == 2));
}

#[tokio::test]
async fn hang_never_answers_and_records_the_hang_up() {
    let w = world(2, ProvidersConfig::default()).await;
    w.p.set_outage(
        Provider::Sms,
        Some(Outage {
            mode: OutageMode::Hang,
        }),
    )
    .unwrap();
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let sid = &w.p.config().sms.account_sid;
    let send = || {
        impatient
            .post(format!(
                "{}/2010-04-01/Accounts/{sid}/Messages.json",
                w.p.sms_base()
            ))
            .basic_auth(sid, Some("ting-sms-auth-token"))
            .form(&[
                ("To", phone(1).as_str()),
                ("From", "+15550001000"),
                ("Body", "hi"),
            ])
            .send()
    };
    // While the request is held the ledger counts it (the harness's wait reads that as a stack
    // waiting on a provider, not a stall); its sender's timeout ends it.
    let (held, ()) = tokio::join!(send(), until(20, || w.p.ledger.held_requests(HELD) == 1));
    assert!(held.unwrap_err().is_timeout());
    until(20, || !w.entries().is_empty()).await;
    assert_eq!(w.p.ledger.held_requests(HELD), 0);
    let e = &w.entries()[0];
    assert_eq!(e.fault.as_deref(), Some("outage_hang"), "{e:?}");
    assert_eq!(
        (e.outcome, e.status.as_str()),
        (Outcome::Transient, "no_answer")
    );
    assert!(e.client_hung_up, "{e:?}");
    // Healing serves the next request.
    w.p.set_outage(Provider::Sms, None).unwrap();
    assert_eq!(send().await.unwrap().status().as_u16(), 201);
}

/// An SMTP client reading one reply line per command, up to `RCPT`: returns the RCPT's reply
/// line, or `None` when none came within `wait`; then the connection is dropped.
async fn smtp_up_to_rcpt(w: &World, to: &str, wait: Duration) -> Option<String> {
    let addr = w.p.server_addrs()[2];
    let (r, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
    let mut r = BufReader::new(r);
    let mut read = String::new();
    r.read_line(&mut read).await.unwrap();
    assert!(read.starts_with("220"), "{read}");
    for cmd in ["HELO me\r\n", "MAIL FROM:<shop@example.com>\r\n"] {
        wr.write_all(cmd.as_bytes()).await.unwrap();
        read.clear();
        r.read_line(&mut read).await.unwrap();
        assert!(read.starts_with("250"), "{cmd}: {read}");
    }
    wr.write_all(format!("RCPT TO:<{to}>\r\n").as_bytes())
        .await
        .unwrap();
    read.clear();
    match tokio::time::timeout(wait, r.read_line(&mut read)).await {
        Ok(_) => Some(read),
        Err(_) => None,
    }
}

#[tokio::test]
async fn smtp_unavailable_answers_421_at_rcpt_and_closes() {
    let w = world(3, ProvidersConfig::default()).await;
    assert_eq!(
        put_outage(&w, "smtp", json!({"mode": "unavailable"})).await,
        200
    );
    let reply = smtp_up_to_rcpt(&w, "a@example.com", Duration::from_secs(5)).await;
    assert!(
        reply.as_deref().unwrap_or("").starts_with("421 4.3.2"),
        "{reply:?}"
    );
    let e = &w.entries()[0];
    assert_eq!(e.provider, Provider::Smtp);
    assert_eq!(e.recipient, "a@example.com");
    assert_eq!(e.fault.as_deref(), Some("outage_421"), "{e:?}");
    assert_eq!(
        (e.outcome, e.status.as_str(), e.attempt),
        (Outcome::Transient, "421 4.3.2", 1)
    );
    assert_eq!(
        OutageMode::of_label("outage_421"),
        Some(OutageMode::Unavailable)
    );
    // Healed: the next transaction's RCPT is accepted, as attempt 2.
    assert_eq!(put_outage(&w, "smtp", json!(null)).await, 200);
    let reply = smtp_up_to_rcpt(&w, "a@example.com", Duration::from_secs(5)).await;
    assert!(
        reply.as_deref().unwrap_or("").starts_with("250"),
        "{reply:?}"
    );
}

#[tokio::test]
async fn smtp_hang_never_answers_the_rcpt_and_records_the_hang_up() {
    let w = world(4, ProvidersConfig::default()).await;
    w.p.set_outage(
        Provider::Smtp,
        Some(Outage {
            mode: OutageMode::Hang,
        }),
    )
    .unwrap();
    let (reply, ()) = tokio::join!(
        smtp_up_to_rcpt(&w, "b@example.com", Duration::from_millis(300)),
        until(20, || w.p.ledger.held_requests(HELD) == 1)
    );
    assert_eq!(reply, None, "a hung RCPT was answered");
    until(20, || !w.entries().is_empty()).await;
    assert_eq!(
        w.p.ledger.held_requests(HELD),
        0,
        "the hang-up ends the hold"
    );
    let e = &w.entries()[0];
    assert_eq!(e.recipient, "b@example.com");
    assert_eq!(e.fault.as_deref(), Some("outage_hang"), "{e:?}");
    assert_eq!(
        (e.outcome, e.status.as_str()),
        (Outcome::Transient, "no_answer")
    );
    assert!(e.client_hung_up, "{e:?}");
    assert!(
        e.mono_ns >= e.received_ns + 250_000_000,
        "recorded at the hang-up: {e:?}"
    );
}
