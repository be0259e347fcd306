//! The `/_mock/` control API on each fake: ledger, stats, fault profile changes, reset.

mod common;

use common::*;
use mock_providers::config::ProvidersConfig;
use mock_providers::control::Stats;
use serde_json::json;

#[tokio::test]
async fn ledger_stats_faults_reset() {
    let w = world(1, ProvidersConfig::default()).await;
    w.line_push(&uid(1), None, "a").await;
    w.line_raw(None, None, "{}".into()).await;
    w.sms_send(&phone(1), "b", None).await;

    let line = w.p.line_base();
    let smtp_ctl = format!("http://{}", w.p.smtp_control_addr);
    // (url, expected JSON Lines count)
    let cases = [
        (format!("{line}/_mock/ledger"), 3),
        (format!("{line}/_mock/ledger?provider=line"), 2),
        (format!("{line}/_mock/ledger?provider=sms"), 1),
        (format!("{line}/_mock/ledger?since=2"), 1),
        (
            format!("{}/_mock/ledger?provider=line&since=1", w.p.sms_base()),
            1,
        ),
        (format!("{smtp_ctl}/_mock/ledger?provider=smtp"), 0),
    ];
    for (url, n) in cases {
        let text = w.http.get(&url).send().await.unwrap().text().await.unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), n, "{url}");
    }
    let arr = w.get(format!("{line}/_mock/ledger?format=json")).await;
    assert_eq!(arr.json.as_array().unwrap().len(), 3);
    // A query the API does not know is a 400 naming it, never the default answer.
    for q in ["format=xml", "since=abc", "provider=fax", "kind=zzz"] {
        let r = w
            .http
            .get(format!("{line}/_mock/ledger?{q}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{q}");
        let key = q.split('=').next().unwrap();
        assert!(r.text().await.unwrap().contains(key), "{q}");
    }

    let stats: Stats =
        serde_json::from_value(w.get(format!("{line}/_mock/stats")).await.json).unwrap();
    assert_eq!(stats.entries, 3);
    assert_eq!(stats.providers["line"].sends["accepted"], 1);
    assert_eq!(stats.providers["line"].sends["protocol_error"], 1);
    assert_eq!(stats.providers["sms"].sends["accepted"], 1);
    assert_eq!(stats.callbacks_pending, 0);

    // Change the LINE profile mid-run: every push now fails with 503.
    let r = w
        .http
        .put(format!("{line}/_mock/faults"))
        .json(&json!({"transient": [{"status": 503, "rate": "100%"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(w.line_push(&uid(2), None, "c").await.status, 503);
    assert_eq!(
        w.p.config().line.channel_token,
        TOKEN,
        "fields not given are kept"
    );
    // A bad profile is refused and changes nothing.
    let bad = w
        .http
        .put(format!("{line}/_mock/faults"))
        .json(&json!({"bad_addresses": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert_eq!(w.p.config().line.transient.len(), 1);
    // A profile that parses but cannot work gets the scenario rules' answer: 422 naming the field
    // (status 200 is no fault, shares past 100%, a rate limit of 0, a latency past a day, reply
    // text that would forge SMTP replies), and changes nothing.
    let invalid = [
        (
            &line,
            json!({"transient": [{"status": 200, "rate": "10%"}]}),
            "transient[0].status",
        ),
        (
            &line,
            json!({"transient": [{"status": 500, "rate": "70%"}, {"status": 503, "rate": "70%"}]}),
            "transient[1].rate",
        ),
        (&line, json!({"rate_limit": 0}), "rate_limit"),
        (&line, json!({"rate_limit": -5}), "rate_limit"),
        (
            &line,
            json!({"latency": {"kind": "fixed", "value": "300000000000y"}}),
            "",
        ),
        (
            &line,
            json!({"latency": {"kind": "uniform", "min": "2s", "max": "1s"}}),
            "latency.min",
        ),
        (&line, json!({"channel_token": ""}), "channel_token"),
        (
            &smtp_ctl,
            json!({"faults": [{"stage": "rcpt", "code": 451, "enhanced": "4.3.0\r\n250 ok", "rate": "10%"}]}),
            "faults[0].enhanced",
        ),
        (&smtp_ctl, json!({"max_size": 0}), "max_size"),
    ];
    for (base, patch, path) in invalid {
        let r = w
            .http
            .put(format!("{base}/_mock/faults"))
            .json(&patch)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body: serde_json::Value = r.json().await.unwrap();
        if path.is_empty() {
            // Refused while parsing (the duration itself is out of range).
            assert_eq!(status, 400, "{patch}: {body}");
        } else {
            assert_eq!(
                (status, body["path"].as_str()),
                (422, Some(path)),
                "{patch}: {body}"
            );
        }
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{body}"
        );
    }
    assert_eq!(w.p.config().line.transient.len(), 1);
    assert_eq!(w.p.config().line.rate_limit, None);
    // The SMTP control port changes the SMTP profile.
    let r = w
        .http
        .put(format!("{smtp_ctl}/_mock/faults"))
        .json(&json!({"max_size": 1234}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(w.p.config().smtp.max_size, 1234);

    let r = w
        .http
        .post(format!("{line}/_mock/reset"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert!(w.p.ledger.is_empty());
    // Attempt numbers start again after a reset.
    w.sms_send(&phone(1), "d", None).await;
    assert_eq!(w.entries()[0].attempt, 1);
    w.p.shutdown().await;
}

/// A reader polling `GET /_mock/ledger?since=N` keeps working across `POST /_mock/reset`: entry
/// numbers are never reused, so its next poll returns exactly what was recorded after the reset.
/// The reset, sent to the SMS fake, resets every provider (one shared ledger).
#[tokio::test]
async fn reset_keeps_since_polling_monotonic() {
    let w = world(1, ProvidersConfig::default()).await;
    let line = w.p.line_base();
    let poll = |since: u64| {
        let url = format!("{line}/_mock/ledger?since={since}");
        let http = w.http.clone();
        async move {
            let text = http.get(url).send().await.unwrap().text().await.unwrap();
            text.lines()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                        .as_u64()
                        .unwrap()
                })
                .collect::<Vec<u64>>()
        }
    };
    w.line_push(&uid(1), None, "a").await;
    w.sms_send(&phone(1), "b", None).await;
    assert_eq!(poll(0).await, [0, 1]);
    let next = 2;
    w.line_push(&uid(2), None, "c").await; // seq 2, forgotten by the reset before it is polled
    let r = w
        .http
        .post(format!("{}/_mock/reset", w.p.sms_base()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert!(
        w.p.ledger.is_empty(),
        "the SMS port reset the LINE entries too"
    );
    w.line_push(&uid(1), None, "d").await;
    w.sms_send(&phone(1), "e", None).await;
    assert_eq!(poll(next).await, [3, 4], "the poll after the reset");
    assert_eq!(poll(4).await, [4]);
    assert_eq!(poll(5).await, Vec::<u64>::new());
    // Attempt numbers restart; stats count what the ledger holds now.
    assert!(w.entries().iter().all(|e| e.attempt == 1));
    let stats: Stats =
        serde_json::from_value(w.get(format!("{line}/_mock/stats")).await.json).unwrap();
    assert_eq!(stats.entries, 2);
    w.p.shutdown().await;
}
