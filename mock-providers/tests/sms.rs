//! Twilio-subset conformance: every error class, duplicates with and without `Idempotency-Key`,
//! reading one message and listing by `To` / `DateSent`.

mod common;

use common::*;
use mock_providers::config::{HttpFault, ProvidersConfig, SmsConfig};
use mock_providers::ledger::{EntryKind, Outcome};
use mock_providers::units::Ratio;

fn sms_cfg(f: impl FnOnce(&mut SmsConfig)) -> ProvidersConfig {
    let mut c = ProvidersConfig::default();
    f(&mut c.sms);
    c
}

#[tokio::test]
async fn conformance_table() {
    let to = phone(1);
    let full: Vec<(&str, &str)> = vec![("To", &to), ("From", "+15550009999"), ("Body", "hello")];
    // Twilio's limit counts characters, not bytes: 1 600 multi-byte characters still go.
    let longest = "é".repeat(1600);
    let too_long = "x".repeat(1601);
    // (name, profile, auth, form, status, twilio code, outcome, fault)
    type Case<'a> = (
        &'a str,
        ProvidersConfig,
        bool,
        Vec<(&'a str, &'a str)>,
        u16,
        Option<u64>,
        Outcome,
        Option<&'a str>,
    );
    let d = ProvidersConfig::default;
    let cases: Vec<Case> = vec![
        (
            "created",
            d(),
            true,
            full.clone(),
            201,
            None,
            Outcome::Accepted,
            None,
        ),
        (
            "messaging service",
            d(),
            true,
            vec![("To", &to), ("MessagingServiceSid", "MG1"), ("Body", "x")],
            201,
            None,
            Outcome::Accepted,
            None,
        ),
        (
            "no auth",
            d(),
            false,
            full.clone(),
            401,
            Some(20003),
            Outcome::ProtocolError,
            None,
        ),
        (
            "missing To",
            d(),
            true,
            vec![("From", "+15550009999"), ("Body", "x")],
            400,
            Some(21604),
            Outcome::ProtocolError,
            None,
        ),
        (
            "missing From",
            d(),
            true,
            vec![("To", &to), ("Body", "x")],
            400,
            Some(21603),
            Outcome::ProtocolError,
            None,
        ),
        (
            "missing Body",
            d(),
            true,
            vec![("To", &to), ("From", "+15550009999")],
            400,
            Some(21602),
            Outcome::ProtocolError,
            None,
        ),
        (
            "longest body",
            d(),
            true,
            vec![("To", &to), ("From", "+15550009999"), ("Body", &longest)],
            201,
            None,
            Outcome::Accepted,
            None,
        ),
        (
            "body over 1600 characters",
            d(),
            true,
            vec![("To", &to), ("From", "+15550009999"), ("Body", &too_long)],
            400,
            Some(21617),
            Outcome::ProtocolError,
            None,
        ),
        // A callback the fake could never send (a script URL, no host) is refused as Twilio
        // refuses it, not accepted with reports that then fail as "no answer".
        (
            "StatusCallback not an http URL",
            d(),
            true,
            vec![
                ("To", &to),
                ("From", "+15550009999"),
                ("Body", "x"),
                ("StatusCallback", "javascript:alert(1)"),
            ],
            400,
            Some(21609),
            Outcome::ProtocolError,
            None,
        ),
        (
            "StatusCallback a relative path",
            d(),
            true,
            vec![
                ("To", &to),
                ("From", "+15550009999"),
                ("Body", "x"),
                ("StatusCallback", "/v1/callbacks/sms"),
            ],
            400,
            Some(21609),
            Outcome::ProtocolError,
            None,
        ),
        (
            "invalid To",
            d(),
            true,
            vec![("To", "555-1234"), ("From", "+15550009999"), ("Body", "x")],
            400,
            Some(21211),
            Outcome::Permanent,
            None,
        ),
        (
            "seeded bad address",
            sms_cfg(|s| s.bad_addresses = Ratio(1.0)),
            true,
            full.clone(),
            400,
            None,
            Outcome::Permanent,
            Some("bad_address"),
        ),
        (
            "unsubscribed",
            sms_cfg(|s| {
                s.permanent = vec![HttpFault {
                    code: Some(21610),
                    ..fault(400, 1.0)
                }]
            }),
            true,
            full.clone(),
            400,
            Some(21610),
            Outcome::Permanent,
            Some("http 400"),
        ),
        (
            "too many requests",
            sms_cfg(|s| s.transient = vec![fault(429, 1.0)]),
            true,
            full.clone(),
            429,
            Some(20429),
            Outcome::Transient,
            Some("http 429"),
        ),
        (
            "500",
            sms_cfg(|s| s.transient = vec![fault(500, 1.0)]),
            true,
            full.clone(),
            500,
            Some(20500),
            Outcome::Transient,
            Some("http 500"),
        ),
        (
            "503",
            sms_cfg(|s| s.transient = vec![fault(503, 1.0)]),
            true,
            full.clone(),
            503,
            Some(20503),
            Outcome::Transient,
            Some("http 503"),
        ),
        (
            "rate limit",
            sms_cfg(|s| s.rate_limit = Some(0.001)),
            true,
            full.clone(),
            201,
            None,
            Outcome::Accepted,
            None,
        ),
    ];
    for (name, cfg, auth, form, status, code, outcome, fault_label) in cases {
        let w = world(1, cfg).await;
        let r = w.sms_raw(auth, &form, None).await;
        assert_eq!(r.status, status, "{name}: {}", r.json);
        if status == 201 {
            let sid = r.json["sid"].as_str().unwrap();
            assert!(
                sid.len() == 34
                    && sid.starts_with("SM")
                    && sid[2..].chars().all(|c| c.is_ascii_hexdigit()),
                "{name}: {sid}"
            );
            assert!(
                ["queued", "accepted"].contains(&r.json["status"].as_str().unwrap()),
                "{name}"
            );
            assert_eq!(r.json["to"], to.as_str());
            assert!(
                r.json["date_created"].as_str().unwrap().ends_with("+0000"),
                "{name}: RFC 2822 date"
            );
        } else {
            assert_eq!(r.json["status"], status, "{name}");
            assert!(
                r.json["message"].is_string() && r.json["more_info"].is_string(),
                "{name}"
            );
            if let Some(c) = code {
                assert_eq!(r.json["code"], c, "{name}");
            } else {
                assert!(
                    [21211, 21610].contains(&r.json["code"].as_u64().unwrap()),
                    "{name}"
                );
            }
        }
        let e = w.entries();
        assert_eq!(e.len(), 1, "{name}");
        assert_eq!(
            (e[0].outcome, e[0].fault.as_deref()),
            (outcome, fault_label),
            "{name}"
        );
        if name == "body over 1600 characters" {
            // Kept whole, with its number: the harness judges the length it was sent with.
            assert_eq!(e[0].body.as_deref(), Some(too_long.as_str()), "{name}");
            assert_eq!(e[0].recipient, to, "{name}");
        }
        if name == "rate limit" {
            let r = w.sms_raw(true, &form, None).await;
            assert_eq!(
                (r.status, r.json["code"].as_u64()),
                (429, Some(20429)),
                "second request is over the limit"
            );
            assert!(r.header("retry-after").is_some());
        }
        w.p.shutdown().await;
    }
}

#[tokio::test]
async fn duplicates_are_two_deliveries_unless_the_key_feature_is_on() {
    // (idempotency on?, accepted deliveries, repeats)
    for (on, accepted, repeats) in [(false, 2, 0), (true, 1, 1)] {
        let w = world(1, sms_cfg(|s| s.idempotency = on)).await;
        let form = [
            ("To", "+15550000042"),
            ("From", "+15550009999"),
            ("Body", "same"),
        ];
        let a = w.sms_raw(true, &form, Some("key-1")).await;
        let b = w.sms_raw(true, &form, Some("key-1")).await;
        assert_eq!((a.status, b.status), (201, 201));
        assert_eq!(
            a.json["sid"] == b.json["sid"],
            on,
            "same SID iff idempotent"
        );
        assert_eq!(b.header("idempotent-replayed").is_some(), on);
        let e = w.entries();
        let count = |o| e.iter().filter(|x| x.outcome == o).count();
        assert_eq!(
            (count(Outcome::Accepted), count(Outcome::IdempotentRepeat)),
            (accepted, repeats),
            "idempotency {on}"
        );
        assert!(e.iter().all(|x| x.payload_hash == e[0].payload_hash));
    }
}

#[tokio::test]
async fn fetch_and_list_for_reconciliation() {
    let w = world(1, ProvidersConfig::default()).await;
    let a = w.sms_send(&phone(1), "one", None).await;
    let _b = w.sms_send(&phone(2), "two", None).await;
    let c = w.sms_send(&phone(1), "three", None).await;
    let sid_a = a.json["sid"].as_str().unwrap();

    let one = w.sms_get(&format!("Messages/{sid_a}.json")).await;
    assert_eq!(one.status, 200);
    assert_eq!(one.json["sid"], sid_a);
    assert_eq!(one.json["body"], "one");
    let missing = w
        .sms_get("Messages/SM00000000000000000000000000000000.json")
        .await;
    assert_eq!(
        (missing.status, missing.json["code"].as_u64()),
        (404, Some(20404))
    );

    let today = chrono::Utc::now().date_naive();
    let tomorrow = today.succ_opt().unwrap();
    let to = urlencode(&phone(1));
    // (query, expected bodies newest first)
    let cases: Vec<(String, Vec<&str>)> = vec![
        (format!("Messages.json?To={to}"), vec!["three", "one"]),
        (
            format!("Messages.json?To={to}&DateSent%3E={today}"),
            vec!["three", "one"],
        ),
        (
            format!("Messages.json?To={to}&DateSent>={today}"),
            vec!["three", "one"],
        ),
        (
            format!("Messages.json?To={to}&DateSent%3E={tomorrow}"),
            vec![],
        ),
        (
            format!("Messages.json?To={}", urlencode(&phone(2))),
            vec!["two"],
        ),
        ("Messages.json".to_string(), vec!["three", "two", "one"]),
        (format!("Messages.json?To={to}&PageSize=1"), vec!["three"]),
        (
            format!("Messages.json?To={to}&PageSize=1&Page=1"),
            vec!["one"],
        ),
        // Pages past the end are empty, however far: the offset arithmetic must not wrap round
        // to the first page.
        (
            format!("Messages.json?To={to}&PageSize=1&Page=18446744073709551615"),
            vec![],
        ),
        (
            format!("Messages.json?To={to}&Page=9223372036854775808"),
            vec![],
        ),
    ];
    for (q, want) in cases {
        let r = w.sms_get(&q).await;
        assert_eq!(r.status, 200, "{q}");
        let got: Vec<&str> = r.json["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["body"].as_str().unwrap())
            .collect();
        assert_eq!(got, want, "{q}");
        if want.is_empty() {
            assert!(r.json["next_page_uri"].is_null(), "{q}: {}", r.json);
        }
    }
    // Following `next_page_uri` pages through the same filtered list (a message to another
    // number in between never shows up), and stops at its end.
    let mut bodies = Vec::new();
    let mut q = format!("Messages.json?To={to}&DateSent%3E={today}&PageSize=1");
    loop {
        let r = w.sms_get(&q).await;
        assert_eq!(r.status, 200, "{q}");
        for m in r.json["messages"].as_array().unwrap() {
            bodies.push(m["body"].as_str().unwrap().to_string());
        }
        match r.json["next_page_uri"].as_str() {
            Some(next) => q = next[next.find("Messages.json").unwrap()..].to_string(),
            None => break,
        }
    }
    assert_eq!(bodies, ["three", "one"]);
    assert_eq!(c.json["to"], phone(1).as_str());
    let polls = w
        .entries()
        .iter()
        .filter(|e| e.kind == EntryKind::Poll)
        .count();
    assert_eq!(polls, 2 + 10 + 2);
}

#[tokio::test]
async fn status_moves_along_the_timeline() {
    let mut cfg = ProvidersConfig::default();
    cfg.sms.callbacks.delay_min = ms(0);
    cfg.sms.callbacks.delay_max = ms(0);
    cfg.sms.callbacks.fail_rate = Ratio(1.0);
    let w = world(1, cfg).await;
    let sid = w.sms_send(&phone(9), "x", None).await.json["sid"]
        .as_str()
        .unwrap()
        .to_string();
    let r = w.sms_get(&format!("Messages/{sid}.json")).await;
    let told = r.json["status"].as_str().unwrap().to_string();
    assert!(
        ["undelivered", "failed"].contains(&told.as_str()),
        "{}",
        r.json
    );
    assert!(r.json["error_code"].is_u64());
    assert!(r.json["date_sent"].is_string());
    // The ledger keeps what each read told the stack (a stack may learn the failure from it
    // before any report arrives), beside the read's own HTTP status.
    let listed = w
        .sms_get(&format!("Messages.json?To={}", urlencode(&phone(9))))
        .await;
    assert_eq!(listed.json["messages"][0]["status"], told.as_str());
    // A list of every number's messages told this one's failure too: an entry names it.
    let all = w.sms_get("Messages.json").await;
    assert_eq!(all.json["messages"][0]["status"], told.as_str());
    let polls: Vec<(String, String, Option<String>)> = w
        .entries()
        .iter()
        .filter(|e| e.kind == EntryKind::Poll)
        .map(|e| {
            (
                e.recipient.clone(),
                e.status.clone(),
                e.callback_status.clone(),
            )
        })
        .collect();
    let (to, ok, want) = (phone(9), "200".to_string(), Some(told));
    assert_eq!(
        polls,
        [
            (to.clone(), ok.clone(), want.clone()),
            (to.clone(), ok.clone(), want.clone()),
            (String::new(), ok.clone(), want.clone()),
            (to, ok, want),
        ]
    );
}

fn urlencode(s: &str) -> String {
    s.replace('+', "%2B")
}

/// A request body past the HTTP limit gets Twilio's JSON error shape (status 413, code 21617),
/// like every other refusal, not the HTTP stack's plain text, and is recorded.
#[tokio::test]
async fn an_oversized_body_is_refused_in_twilios_shape() {
    let w = world(1, ProvidersConfig::default()).await;
    let huge = "x".repeat(3 * 1024 * 1024);
    let r = w.sms_send(&phone(1), &huge, None).await;
    assert_eq!(
        (r.status, r.json["code"].as_u64(), r.json["status"].as_u64()),
        (413, Some(21617), Some(413)),
        "{}",
        r.json
    );
    let entries = w.entries();
    assert_eq!(entries.len(), 1, "recorded, as every request is");
    assert_eq!(
        (entries[0].outcome, entries[0].status.as_str()),
        (Outcome::ProtocolError, "413")
    );
}
