//! A provider-wide outage, set through `PUT /_mock/faults` as the harness's `provider_outage`
//! step sets it: `unavailable` answers every send 503 (recorded `outage_503`, transient); `hang`
//! reads the request and never answers, and the entry records that its sender hung up
//! (`outage_hang`, `client_hung_up`, status `no_answer`). Clearing it serves normally again; a
//! request already held stays unanswered (a black-holed connection).

mod common;

use std::time::Duration;

use common::*;
use mock_providers::config::ProvidersConfig;
use mock_providers::ledger::{Outcome, Provider};
use mock_providers::outage::{Outage, OutageMode};
use serde_json::json;

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
    let held = send().await;
    assert!(held.unwrap_err().is_timeout());
    until(20, || !w.entries().is_empty()).await;
    let e = &w.entries()[0];
    assert_eq!(e.fault.as_deref(), Some("outage_hang"), "{e:?}");
    assert_eq!(
        (e.outcome, e.status.as_str()),
        (Outcome::Transient, "no_answer")
    );
    assert!(e.client_hung_up, "{e:?}");
    // The SMTP fake has no outage mode; healing serves the next request.
    assert!(w
        .p
        .set_outage(
            Provider::Smtp,
            Some(Outage {
                mode: OutageMode::Hang
            })
        )
        .is_err());
    w.p.set_outage(Provider::Sms, None).unwrap();
    assert_eq!(send().await.unwrap().status().as_u16(), 201);
}
