//! The stack against the real fake providers (`mock-providers`), with faults and messy
//! callbacks switched on: every recipient gets each message exactly once, forged callbacks are
//! refused, and every delivery ends `delivered`.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use mock_providers::config::{CallbackConfig, HttpFault, ProvidersConfig, SmtpFault, SmtpStage};
use mock_providers::ledger::{CallbackVariant, EntryKind, Ledger, Outcome, Provider};
use mock_providers::units::{HumanDuration, Ratio};

fn fault(status: u16, after_commit: bool) -> HttpFault {
    HttpFault {
        status,
        rate: Ratio(0.25),
        retry_after: None,
        code: None,
        monthly_quota: false,
        after_commit,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stack_delivers_everything_once_through_the_mock_providers() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_addr = listener.local_addr().unwrap().to_string();

    let callbacks = CallbackConfig {
        enabled: true,
        delay_min: HumanDuration::from_millis(5),
        delay_max: HumanDuration::from_millis(50),
        duplicate_rate: Ratio(0.3),
        stale_rate: Ratio(0.3),
        out_of_order_rate: Ratio(0.2),
        forged_rate: Ratio(0.3),
        unknown_id_rate: Ratio(0.2),
        // Far above any stall of a loaded machine: a callback the stack answered late would be
        // retried and show up twice in the ledger. Retries are covered in mock-providers' tests.
        timeout: HumanDuration::from_millis(30_000),
        ..CallbackConfig::default()
    };
    let mut pc = ProvidersConfig::default();
    pc.line.transient = vec![fault(503, true), fault(429, false)];
    pc.sms.transient = vec![fault(500, true)];
    pc.sms.callbacks = callbacks.clone();
    pc.smtp.faults = vec![SmtpFault {
        stage: SmtpStage::Rcpt,
        code: 451,
        enhanced: None,
        rate: Ratio(0.25),
    }];
    pc.smtp.events = CallbackConfig {
        url: Some(format!("http://{api_addr}/v1/callbacks/email")),
        ..callbacks
    };
    let mocks = mock_providers::start(7, pc.clone(), "127.0.0.1".parse().unwrap(), Ledger::new())
        .await
        .unwrap();

    let mut cfg = stack::Config::for_tests(&db.url);
    cfg.api_addr = api_addr.clone();
    cfg.line_api_base = mocks.line_base();
    cfg.line_channel_token = pc.line.channel_token.clone();
    cfg.sms_api_base = mocks.sms_base();
    cfg.sms_account_sid = pc.sms.account_sid.clone();
    cfg.sms_auth_token = pc.sms.auth_token.clone();
    cfg.smtp_addr = mocks.smtp_addr.to_string();
    cfg.smtp_events_secret = pc.smtp.events_secret.clone();
    cfg.sms_poll_after = Duration::from_millis(500);
    cfg.max_attempts = 12;
    let (stop_api_tx, stop_api) = common::shutdown_pair();
    let api = tokio::spawn(stack::api::run(cfg.clone(), listener, stop_api));
    let mut workers = Vec::new();
    let mut stops = Vec::new();
    for i in 0..2 {
        let mut c = cfg.clone();
        c.worker_id = format!("w{i}");
        let (tx, stop) = common::shutdown_pair();
        stops.push(tx);
        workers.push(tokio::spawn(stack::worker::run(c, stop)));
    }

    let n = 30;
    let r = reqwest::Client::new()
        .post(format!("http://{api_addr}/v1/batches"))
        .json(&common::batch_body("compat", n, &["line", "email", "sms"]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    common::wait_for(
        "every delivery delivered",
        Duration::from_secs(60),
        || async {
            common::states(&pool)
                .await
                .get("delivered")
                .copied()
                .unwrap_or(0)
                == 3 * n as i64
        },
    )
    .await;
    tokio::time::timeout(Duration::from_secs(120), mocks.callbacks_quiesced())
        .await
        .expect("every callback answered within 120 s");
    for tx in stops {
        tx.send(true).unwrap();
    }
    for w in workers {
        w.await.unwrap().unwrap();
    }

    let ledger = mocks.ledger.snapshot();
    let mut accepted: HashMap<(Provider, String), u32> = HashMap::new();
    for e in ledger.iter().filter(|e| e.kind == EntryKind::Send) {
        if e.outcome == Outcome::Accepted {
            *accepted
                .entry((e.provider, e.recipient.clone()))
                .or_default() += 1;
        }
    }
    assert_eq!(accepted.len(), 3 * n, "every recipient on every channel");
    let dups: Vec<_> = accepted.iter().filter(|(_, c)| **c != 1).collect();
    assert!(dups.is_empty(), "sent more than once: {dups:?}");
    let faults = ledger.iter().filter(|e| e.fault.is_some()).count();
    assert!(faults > 0, "faults were injected");
    for e in ledger.iter().filter(|e| e.kind == EntryKind::Callback) {
        let want = match e.callback_variant {
            Some(v) if v.is_forged() => 403,
            _ => 200,
        };
        assert_eq!(e.callback_response, Some(want), "{e:?}");
    }
    for variant in [CallbackVariant::ForgedSignature, CallbackVariant::Unsigned] {
        let forged = ledger
            .iter()
            .filter(|e| e.callback_variant == Some(variant))
            .count();
        assert!(forged > 0, "{variant:?} callbacks were sent");
    }
    let mut kinds: HashMap<String, usize> = HashMap::new();
    for e in &ledger {
        let k = format!(
            "{:?} {:?} {:?} {:?}",
            e.provider, e.kind, e.outcome, e.callback_variant
        );
        *kinds.entry(k).or_default() += 1;
    }
    let mut kinds: Vec<_> = kinds.into_iter().collect();
    kinds.sort();
    eprintln!("ledger: {kinds:#?}");
    stop_api_tx.send(true).unwrap();
    api.await.unwrap().unwrap();
    mocks.shutdown().await;
    pool.close().await;
}
