//! LINE push conformance: every error class, the retry-key semantics, and what the ledger says.

mod common;

use common::*;
use mock_providers::config::{LineConfig, ProvidersConfig};
use mock_providers::ledger::Outcome;
use mock_providers::units::Ratio;
use serde_json::json;

fn line_cfg(f: impl FnOnce(&mut LineConfig)) -> ProvidersConfig {
    let mut c = ProvidersConfig::default();
    f(&mut c.line);
    c
}

/// One request against a fresh world with one profile.
struct Case {
    name: &'static str,
    cfg: ProvidersConfig,
    auth: Option<&'static str>,
    key: Option<&'static str>,
    body: String,
    status: u16,
    message: &'static str,
    outcome: Outcome,
    fault: Option<&'static str>,
    retry_after: Option<&'static str>,
}

fn push_body(to: &str, text: &str) -> String {
    json!({"to": to, "messages": [{"type": "text", "text": text}]}).to_string()
}

#[tokio::test]
async fn conformance_table() {
    let u = uid(1);
    let ok = push_body(&u, "hi");
    let base = |name, cfg, status, message, outcome| Case {
        name,
        cfg,
        auth: Some(TOKEN),
        key: None,
        body: ok.clone(),
        status,
        message,
        outcome,
        fault: None,
        retry_after: None,
    };
    let cases = vec![
        base(
            "accepted",
            ProvidersConfig::default(),
            200,
            "",
            Outcome::Accepted,
        ),
        Case {
            auth: None,
            ..base(
                "no auth",
                ProvidersConfig::default(),
                401,
                "Authentication failed",
                Outcome::ProtocolError,
            )
        },
        Case {
            auth: Some("wrong"),
            ..base(
                "bad token",
                ProvidersConfig::default(),
                401,
                "Authentication failed",
                Outcome::ProtocolError,
            )
        },
        Case {
            body: "{nope".into(),
            ..base(
                "malformed json",
                ProvidersConfig::default(),
                400,
                "The request body has 1 error(s)",
                Outcome::ProtocolError,
            )
        },
        Case {
            body: json!({"messages": [{"type":"text","text":"x"}]}).to_string(),
            ..base(
                "missing to",
                ProvidersConfig::default(),
                400,
                "The request body has 1 error(s)",
                Outcome::ProtocolError,
            )
        },
        Case {
            body: json!({"to": u, "messages": []}).to_string(),
            ..base(
                "zero messages",
                ProvidersConfig::default(),
                400,
                "The request body has 1 error(s)",
                Outcome::ProtocolError,
            )
        },
        Case {
            body: json!({"to": u, "messages": vec![json!({"type":"text","text":"x"}); 6]})
                .to_string(),
            ..base(
                "six messages",
                ProvidersConfig::default(),
                400,
                "The request body has 1 error(s)",
                Outcome::ProtocolError,
            )
        },
        Case {
            body: push_body(&u, &"x".repeat(5001)),
            ..base(
                "text too long",
                ProvidersConfig::default(),
                400,
                "The request body has 1 error(s)",
                Outcome::ProtocolError,
            )
        },
        Case {
            key: Some("not-a-uuid"),
            ..base(
                "non-uuid retry key",
                ProvidersConfig::default(),
                400,
                "X-Line-Retry-Key",
                Outcome::ProtocolError,
            )
        },
        // Forms a UUID parser accepts but that are not the canonical 8-4-4-4-12 form.
        Case {
            key: Some("{123e4567-e89b-42d3-a456-426614174000}"),
            ..base(
                "braced uuid retry key",
                ProvidersConfig::default(),
                400,
                "X-Line-Retry-Key",
                Outcome::ProtocolError,
            )
        },
        Case {
            key: Some("urn:uuid:123e4567-e89b-42d3-a456-426614174000"),
            ..base(
                "urn uuid retry key",
                ProvidersConfig::default(),
                400,
                "X-Line-Retry-Key",
                Outcome::ProtocolError,
            )
        },
        Case {
            key: Some("123e4567e89b42d3a456426614174000"),
            ..base(
                "unhyphenated uuid retry key",
                ProvidersConfig::default(),
                400,
                "X-Line-Retry-Key",
                Outcome::ProtocolError,
            )
        },
        Case {
            key: Some("123E4567-E89B-42D3-A456-426614174000"),
            ..base(
                "upper-case canonical retry key",
                ProvidersConfig::default(),
                200,
                "",
                Outcome::Accepted,
            )
        },
        Case {
            body: push_body("Ubad", "x"),
            ..base(
                "malformed user id",
                ProvidersConfig::default(),
                400,
                "The property, 'to'",
                Outcome::Permanent,
            )
        },
        Case {
            fault: Some("bad_address"),
            ..base(
                "seeded bad address",
                line_cfg(|l| l.bad_addresses = Ratio(1.0)),
                400,
                "The property, 'to'",
                Outcome::Permanent,
            )
        },
        Case {
            fault: Some("http 429 monthly_quota"),
            ..base(
                "monthly quota",
                line_cfg(|l| {
                    l.permanent = vec![mock_providers::config::HttpFault {
                        monthly_quota: true,
                        ..fault(429, 1.0)
                    }]
                }),
                429,
                "You have reached your monthly limit.",
                Outcome::Permanent,
            )
        },
        Case {
            fault: Some("http 403"),
            ..base(
                "permanent 403",
                line_cfg(|l| l.permanent = vec![fault(403, 1.0)]),
                403,
                "not authorized",
                Outcome::Permanent,
            )
        },
        Case {
            fault: Some("http 503"),
            retry_after: Some("2"),
            ..base(
                "transient 503",
                line_cfg(|l| {
                    l.transient = vec![mock_providers::config::HttpFault {
                        retry_after: Some(ms(1500)),
                        ..fault(503, 1.0)
                    }]
                }),
                503,
                "temporarily unavailable",
                Outcome::Transient,
            )
        },
        Case {
            fault: Some("http 429"),
            ..base(
                "transient rate-limit 429",
                line_cfg(|l| l.transient = vec![fault(429, 1.0)]),
                429,
                "The API rate limit has been exceeded. Try again later.",
                Outcome::Transient,
            )
        },
        Case {
            fault: Some("http 500 after_commit"),
            ..base(
                "500 after commit",
                line_cfg(|l| {
                    l.transient = vec![mock_providers::config::HttpFault {
                        after_commit: true,
                        ..fault(500, 1.0)
                    }]
                }),
                500,
                "server",
                Outcome::Accepted,
            )
        },
    ];
    for c in cases {
        let w = world(1, c.cfg).await;
        let r = w.line_raw(c.auth, c.key, c.body.clone()).await;
        assert_eq!(r.status, c.status, "{}: {:?}", c.name, r.json);
        assert!(
            r.header("x-line-request-id").is_some(),
            "{}: no request id",
            c.name
        );
        if c.status == 200 {
            let sent = r.json["sentMessages"].as_array().unwrap();
            assert_eq!(sent.len(), 1, "{}", c.name);
            assert!(sent[0]["id"].as_str().unwrap().parse::<u64>().is_ok());
            assert!(sent[0]["quoteToken"].is_string());
        } else {
            let m = r.json["message"].as_str().unwrap_or("");
            assert!(m.contains(c.message), "{}: message {m:?}", c.name);
            if m.starts_with("The request body has") {
                let d = &r.json["details"][0];
                assert!(
                    d["message"].is_string() && d["property"].is_string(),
                    "{}: {d}",
                    c.name
                );
            }
        }
        assert_eq!(
            r.header("retry-after").as_deref(),
            c.retry_after,
            "{}",
            c.name
        );
        let e = w.entries();
        assert_eq!(e.len(), 1, "{}: one ledger entry", c.name);
        assert_eq!(e[0].outcome, c.outcome, "{}", c.name);
        assert_eq!(e[0].status, c.status.to_string(), "{}", c.name);
        assert_eq!(e[0].fault.as_deref(), c.fault, "{}", c.name);
        // The ledger records the Retry-After as sent (whole seconds), not as configured.
        let sent = c.retry_after.map(|s| s.parse::<u64>().unwrap() * 1000);
        assert_eq!(e[0].retry_after_ms, sent, "{}", c.name);
        assert!(e[0].peer.is_some(), "{}", c.name);
        w.p.shutdown().await;
    }
}

#[tokio::test]
async fn accepted_entry_carries_payload() {
    let w = world(1, ProvidersConfig::default()).await;
    let body = json!({"to": uid(2), "messages": [
        {"type":"text","text":"héllo"}, {"type":"sticker","packageId":"1","stickerId":"2"}, {"type":"text","text":"b"}]});
    let r = w.line_raw(Some(TOKEN), None, body.to_string()).await;
    assert_eq!(r.status, 200);
    let ids: Vec<&str> = r.json["sentMessages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);
    let e = &w.entries()[0];
    assert_eq!(e.recipient, uid(2));
    assert_eq!(e.attempt, 1);
    assert_eq!(e.body.as_deref(), Some("héllo\nb"));
    assert_eq!(e.message_id.as_deref(), Some(ids.join(",").as_str()));
    let compact = serde_json::to_string(&body["messages"]).unwrap();
    let want = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(compact.as_bytes()))
    };
    assert_eq!(e.payload_hash.as_deref(), Some(want.as_str()));
}

#[tokio::test]
async fn retry_key_409_after_200_is_not_a_new_delivery() {
    let w = world(1, ProvidersConfig::default()).await;
    let key = "123e4567-e89b-42d3-a456-426614174000";
    let first = w.line_push(&uid(3), Some(key), "hi").await;
    assert_eq!(first.status, 200);
    let again = w.line_push(&uid(3), Some(key), "hi").await;
    assert_eq!(again.status, 409);
    assert_eq!(again.json["message"], "The retry key is already accepted");
    assert_eq!(again.json["sentMessages"], first.json["sentMessages"]);
    assert_eq!(
        again.header("x-line-accepted-request-id"),
        first.header("x-line-request-id")
    );
    assert_ne!(
        again.header("x-line-request-id"),
        first.header("x-line-request-id")
    );
    let outcomes: Vec<Outcome> = w.entries().iter().map(|e| e.outcome).collect();
    assert_eq!(outcomes, [Outcome::Accepted, Outcome::IdempotentRepeat]);
    // Without the key the same push is a second delivery.
    assert_eq!(w.line_push(&uid(3), None, "hi").await.status, 200);
    let accepted = w
        .entries()
        .iter()
        .filter(|e| e.outcome == Outcome::Accepted)
        .count();
    assert_eq!(accepted, 2);
}

#[tokio::test]
async fn retry_key_is_accepted_once_after_a_5xx() {
    let w = world(1, line_cfg(|l| l.transient = vec![fault(503, 1.0)])).await;
    let key = "6f1c8b3e-2f4d-4e0a-9a43-2b8f1d2c3e4f";
    assert_eq!(w.line_push(&uid(4), Some(key), "hi").await.status, 503);
    let mut cfg = w.p.config();
    cfg.line.transient.clear();
    w.p.set_config(cfg);
    assert_eq!(w.line_push(&uid(4), Some(key), "hi").await.status, 200);
    assert_eq!(w.line_push(&uid(4), Some(key), "hi").await.status, 409);
    let outcomes: Vec<(u32, Outcome)> =
        w.entries().iter().map(|e| (e.attempt, e.outcome)).collect();
    assert_eq!(
        outcomes,
        [
            (1, Outcome::Transient),
            (2, Outcome::Accepted),
            (3, Outcome::IdempotentRepeat)
        ]
    );
}

#[tokio::test]
async fn retry_key_after_commit_5xx_answers_409() {
    let after_commit = mock_providers::config::HttpFault {
        after_commit: true,
        ..fault(500, 1.0)
    };
    let w = world(1, line_cfg(|l| l.transient = vec![after_commit])).await;
    let key = "0e6b8f7a-1c2d-4e3f-8a9b-0c1d2e3f4a5b";
    let first = w.line_push(&uid(5), Some(key), "hi").await;
    assert_eq!(first.status, 500);
    let again = w.line_push(&uid(5), Some(key), "hi").await;
    assert_eq!(again.status, 409, "the first attempt was committed");
    assert_eq!(
        again.header("x-line-accepted-request-id"),
        first.header("x-line-request-id")
    );
}

#[tokio::test]
async fn idempotency_off_makes_a_repeat_a_second_delivery() {
    let w = world(1, line_cfg(|l| l.idempotency = false)).await;
    let key = "123e4567-e89b-42d3-a456-426614174000";
    assert_eq!(w.line_push(&uid(6), Some(key), "hi").await.status, 200);
    assert_eq!(w.line_push(&uid(6), Some(key), "hi").await.status, 200);
}

/// One push per 100 s: the first takes the bucket's only token, the second is refused. The wait
/// is `100 s - (time between the two pushes)`, sent rounded up to whole seconds: `100` unless the
/// pushes were a second or more apart (a descheduled test process), so the test bounds it by the
/// time it measured around both pushes instead of expecting exactly 100.
#[tokio::test]
async fn rate_limit_answers_429_with_retry_after() {
    let w = world(1, line_cfg(|l| l.rate_limit = Some(0.01))).await;
    let t0 = std::time::Instant::now();
    assert_eq!(w.line_push(&uid(7), None, "a").await.status, 200);
    let r = w.line_push(&uid(7), None, "b").await;
    let apart = t0.elapsed();
    assert_eq!(r.status, 429);
    assert_eq!(
        r.json["message"],
        "The API rate limit has been exceeded. Try again later."
    );
    let secs: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(
        secs <= 100 && secs as f64 >= 100.0 - apart.as_secs_f64(),
        "retry-after {secs} s: want 100 s less the {apart:?} between the pushes, rounded up"
    );
    let e = &w.entries()[1];
    assert_eq!(
        (e.outcome, e.fault.as_deref(), e.retry_after_ms),
        (Outcome::Transient, Some("rate_limit"), Some(secs * 1000))
    );
}

/// Responses no push handler writes still carry `x-line-request-id`: unknown path (404), wrong
/// method (405), body over the limit (413).
#[tokio::test]
async fn request_id_on_404_405_and_413() {
    let w = world(1, ProvidersConfig::default()).await;
    let base = w.p.line_base();
    let big = "x".repeat(3 * 1024 * 1024);
    // (method, path, body, status)
    let cases = [
        ("POST", "/v2/bot/message/nope", String::new(), 404),
        ("GET", "/", String::new(), 404),
        ("GET", "/v2/bot/message/push", String::new(), 405),
        ("POST", "/v2/bot/message/push", big, 413),
    ];
    for (method, path, body, status) in cases {
        let r = w
            .http
            .request(method.parse().unwrap(), format!("{base}{path}"))
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{method} {path}");
        let id = r
            .headers()
            .get("x-line-request-id")
            .unwrap_or_else(|| panic!("{method} {path}: no x-line-request-id"))
            .to_str()
            .unwrap()
            .to_string();
        assert!(uuid::Uuid::parse_str(&id).is_ok(), "{method} {path}: {id}");
    }
    // A handled response keeps its own id (exactly one header).
    let r = w.line_push(&uid(1), None, "hi").await;
    assert_eq!(r.headers.get_all("x-line-request-id").iter().count(), 1);
    w.p.shutdown().await;
}

/// A body past the HTTP limit gets LINE's JSON error shape (status 413) and is recorded as a
/// protocol error like every other refusal (it used to be answered in plain text by the HTTP
/// stack and never reach the ledger).
#[tokio::test]
async fn an_oversized_body_is_refused_in_lines_shape_and_recorded() {
    let w = world(1, ProvidersConfig::default()).await;
    let huge = "x".repeat(3 * 1024 * 1024);
    let r = w.line_push(&uid(1), None, &huge).await;
    assert_eq!(r.status, 413, "{}", r.json);
    assert_eq!(r.json["message"], "The request body is too large");
    let entries = w.entries();
    assert_eq!(entries.len(), 1);
    assert_eq!(
        (entries[0].outcome, entries[0].status.as_str()),
        (Outcome::ProtocolError, "413")
    );
}
