//! The API over HTTP on real PostgreSQL: validation, idempotent batches, enqueue speed, status
//! views and signed callbacks.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use sqlx::PgPool;
use stack::channels::sms::twilio_signature;

async fn count(pool: &PgPool, table: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .unwrap();
    n
}

#[tokio::test]
async fn bad_batches_are_rejected_naming_the_field_and_write_nothing() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let mut cfg = stack::Config::for_tests(&db.url);
    cfg.max_recipients = 5;
    cfg.max_body_bytes = 20_000;
    let (addr, _stop, _h) = common::start_api(&cfg).await;
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/v1/batches");
    let ok = common::batch_body("b1", 3, &["line", "email", "sms"]);
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = ok.clone();
        f(&mut v);
        v
    };
    // (case, body, status, field)
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        (
            "unknown channel",
            with(&|v| v["channels"] = json!(["line", "fax"])),
            422,
            "channels[1]",
        ),
        (
            "no channels",
            with(&|v| v["channels"] = json!([])),
            422,
            "channels",
        ),
        (
            "missing email",
            with(&|v| v["recipients"][1]["email"] = Value::Null),
            422,
            "recipients[1].email",
        ),
        (
            "bad email",
            with(&|v| v["recipients"][2]["email"] = json!("nope")),
            422,
            "recipients[2].email",
        ),
        (
            "bad phone",
            with(&|v| v["recipients"][0]["phone"] = json!("555")),
            422,
            "recipients[0].phone",
        ),
        (
            "missing line id",
            with(&|v| v["recipients"][0]["line_user_id"] = json!("")),
            422,
            "recipients[0].line_user_id",
        ),
        (
            "duplicate recipient",
            with(&|v| v["recipients"][1]["id"] = json!("r000000")),
            422,
            "recipients[1].id",
        ),
        (
            "template syntax",
            with(&|v| v["template"]["sms"] = json!("Hi {{name")),
            422,
            "template.sms",
        ),
        (
            "unescaped slot",
            with(&|v| v["template"]["html"] = json!("<p>{{{name}}}</p>")),
            422,
            "template.html",
        ),
        (
            "missing part",
            with(&|v| v["template"]["line"] = Value::Null),
            422,
            "template.line",
        ),
        (
            "missing variable",
            with(&|v| v["template"]["sms"] = json!("{{coupon}}")),
            422,
            "recipients[0].vars.coupon",
        ),
        (
            "empty batch id",
            with(&|v| v["batch_id"] = json!("")),
            422,
            "batch_id",
        ),
        // `:` joins the delivery key: `a:b` + `c` and `a` + `b:c` would collide.
        (
            "key separator in batch id",
            with(&|v| v["batch_id"] = json!("a:b")),
            422,
            "batch_id",
        ),
        (
            "key separator in recipient id",
            with(&|v| v["recipients"][2]["id"] = json!("b:c")),
            422,
            "recipients[2].id",
        ),
        (
            "block helper",
            with(&|v| v["template"]["sms"] = json!("{{#each vars}}{{this}}{{/each}}")),
            422,
            "template.sms",
        ),
        (
            "no batch id",
            with(&|v| {
                v.as_object_mut().unwrap().remove("batch_id");
            }),
            400,
            "batch_id",
        ),
        (
            "wrong type",
            with(&|v| v["recipients"][0]["id"] = json!(7)),
            400,
            "recipients[0].id",
        ),
        (
            "too many recipients",
            common::batch_body("b1", 6, &["line"]),
            413,
            "recipients",
        ),
        (
            "body too large",
            with(&|v| v["template"]["text"] = json!("x".repeat(30_000))),
            413,
            "body",
        ),
        ("not json", json!("just a string"), 400, "body"),
    ];
    for (case, body, status, field) in cases {
        let r = http.post(&url).json(&body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{case}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["field"], json!(field), "{case}: {v}");
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{case}");
    }
    assert_eq!(count(&pool, "batches").await, 0);
    assert_eq!(count(&pool, "deliveries").await, 0);
    pool.close().await;
}

#[tokio::test]
async fn batch_is_enqueued_once_rendered_and_visible() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let cfg = stack::Config::for_tests(&db.url);
    let (addr, _stop, _h) = common::start_api(&cfg).await;
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/v1/batches");
    let body = common::batch_body("big-1", 2000, &["line", "email", "sms"]);

    let t0 = Instant::now();
    let r = http.post(&url).json(&body).send().await.unwrap();
    let took = t0.elapsed();
    assert_eq!(r.status().as_u16(), 202);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"batch_id": "big-1", "deliveries": 6000})
    );
    eprintln!("enqueue of 2000 recipients x 3 channels took {took:?}");
    // About 1 s in a debug build; the bound only catches something pathological (it leaves room
    // for a loaded machine), not the one multi-row INSERT turned per-row, which costs about the
    // same here (6000 round trips on a local socket).
    assert!(took < Duration::from_secs(15), "enqueue took {took:?}");

    // The same batch id again: 200, nothing created.
    let r = http.post(&url).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["deliveries"], json!(6000));
    assert_eq!(count(&pool, "deliveries").await, 6000);
    assert_eq!(count(&pool, "batches").await, 1);

    let (payload, sha): (Value, String) = sqlx::query_as(
        "SELECT payload, payload_sha256 FROM deliveries WHERE key = 'big-1:r000007:email'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        payload["html"],
        json!("<p>Hi Ana &lt;b&gt;&amp;&lt;/b&gt; 7</p>")
    );
    assert_eq!(payload["subject"], json!("Order A-7 received"));
    let p: stack::render::Payload = serde_json::from_value(payload).unwrap();
    assert_eq!(p.sha256(), sha);

    let v: Value = http
        .get(format!("http://{addr}/v1/batches/big-1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["counts"]["sms"]["pending"], json!(2000));
    let v: Value = http
        .get(format!("http://{addr}/v1/batches/big-1/deliveries"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let d = &v["deliveries"][0];
    assert_eq!(d["key"], json!("big-1:r000000:line"));
    assert_eq!(d["state"], json!("pending"));
    assert_eq!(d["attempts"], json!(0));
    // The hash is written at enqueue, in the same insert, and is the payload's own.
    let (stored,): (Value,) =
        sqlx::query_as("SELECT payload FROM deliveries WHERE key = 'big-1:r000000:line'")
            .fetch_one(&pool)
            .await
            .unwrap();
    let stored: stack::render::Payload = serde_json::from_value(stored).unwrap();
    assert_eq!(stored.text, "Hi Ana &lt;b&gt;&amp;&lt;/b&gt; 0 A-0");
    assert_eq!(d["payload_sha256"], json!(stored.sha256()));
    assert_eq!(d["transitions"], json!([]));
    assert_eq!(v["deliveries"].as_array().unwrap().len(), 6000);
    // The incremental form: `?since=` the answer's cursor lists only rows changed after it.
    let cursor = v["cursor"].as_str().expect("a cursor").to_string();
    sqlx::query("UPDATE delivery_state SET updated_at = now() - interval '1 hour'")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE delivery_state SET state = 'delivered', updated_at = now() \
         WHERE id = (SELECT id FROM deliveries WHERE key = 'big-1:r000007:sms')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let since = |c: String| {
        let http = http.clone();
        let url = format!("http://{addr}/v1/batches/big-1/deliveries");
        async move { http.get(url).query(&[("since", c)]).send().await.unwrap() }
    };
    let inc: Value = since(cursor.clone()).await.json().await.unwrap();
    let keys: Vec<&str> = inc["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["big-1:r000007:sms"]);
    assert_eq!(inc["deliveries"][0]["state"], json!("delivered"));
    assert!(inc["cursor"].as_str().unwrap() >= cursor.as_str());
    let bad = since("yesterday".into()).await;
    assert_eq!(bad.status().as_u16(), 422);
    let r = http
        .get(format!("http://{addr}/v1/batches/nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let m = http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("ting_deliveries{channel=\"line\",state=\"pending\"} 2000"),
        "{m}"
    );
    assert!(m.contains("ting_oldest_ready_age_seconds"));
    assert_eq!(
        http.get(format!("http://{addr}/healthz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    pool.close().await;
}

/// A claim writes no event row and the latest transition lives on the state row, yet the status
/// API still reports every edge: a claim in flight, then each ended attempt as its claim and its
/// outcome, in order, the claim naming its worker — whether the worker (fenced) or a callback
/// (unfenced, after locking the row) ended it.
#[tokio::test]
async fn each_attempt_reads_back_as_its_claim_then_its_outcome() {
    use stack::state::{transition, Fence, Source, State, Transition, Updates};
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let cfg = stack::Config::for_tests(&db.url);
    let (addr, _stop, _h) = common::start_api(&cfg).await;
    let http = reqwest::Client::new();
    let body = common::batch_body("tr", 1, &["line"]);
    let r = http
        .post(format!("http://{addr}/v1/batches"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let edges = || async {
        let v: Value = reqwest::get(format!("http://{addr}/v1/batches/tr/deliveries"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ts = v["deliveries"][0]["transitions"]
            .as_array()
            .unwrap()
            .clone();
        let at: Vec<String> = ts
            .iter()
            .map(|t| t["at"].as_str().unwrap().into())
            .collect();
        assert!(
            at.windows(2).all(|w| w[0] <= w[1]),
            "in time order: {ts:#?}"
        );
        ts.iter()
            .map(|t| {
                let s = |k: &str| t[k].as_str().unwrap_or("-").to_string();
                format!("{}>{} {} {}", s("from"), s("to"), s("source"), s("detail"))
            })
            .collect::<Vec<_>>()
    };
    let mut conn = pool.acquire().await.unwrap();
    let lease = Duration::from_secs(60);
    let d = stack::claim::claim(&mut conn, "w1", 1, lease)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(edges().await, ["pending>sending worker w1"]);
    let outcome = |to, fence| Transition {
        delivery_id: d.id,
        from: &[State::Sending],
        to,
        source: Source::Worker,
        detail: Some("429".into()),
        fence,
        set: Updates {
            retry_in: Some(Duration::ZERO),
            outcome_class: Some("transient"),
            ..Updates::default()
        },
    };
    let fence = Fence::Lease {
        owner: "w1".into(),
        token: d.lease_token,
    };
    let left = transition(&mut conn, &outcome(State::Retryable, fence))
        .await
        .unwrap();
    assert_eq!(left, Some(State::Sending));
    let ended = ["pending>sending worker w1", "sending>retryable worker 429"];
    assert_eq!(edges().await, ended);
    let d2 = stack::claim::claim(&mut conn, "w2", 1, lease)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(d2.id, d.id);
    assert_eq!(
        edges().await,
        [&ended[..], &["retryable>sending worker w2"]].concat()
    );
    // A callback overtakes the worker: unfenced, it reads the lease owner from the row it locks.
    let cb = Transition {
        source: Source::Callback,
        detail: Some("cb".into()),
        set: Updates::default(),
        ..outcome(State::Delivered, Fence::None)
    };
    assert_eq!(
        transition(&mut conn, &cb).await.unwrap(),
        Some(State::Sending)
    );
    let all = [
        "pending>sending worker w1",
        "sending>retryable worker 429",
        "retryable>sending worker w2",
        "sending>delivered callback cb",
    ];
    assert_eq!(edges().await, all);
    // The second claim moved the first attempt into the history; the latest is on the row.
    assert_eq!(count(&pool, "delivery_events").await, 1);
    drop(conn);
    pool.close().await;
}

/// Puts the SMS delivery of `r000000` in `submitted` with sid `SM1`, as a worker would.
async fn submitted_sms(pool: &PgPool) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    let rows = stack::claim::claim(&mut conn, "w1", 10, Duration::from_secs(60))
        .await
        .unwrap();
    let d = rows
        .into_iter()
        .find(|d| d.key == "cb:r000000:sms")
        .unwrap();
    let t = stack::state::Transition {
        delivery_id: d.id,
        from: &[stack::state::State::Sending],
        to: stack::state::State::Submitted,
        source: stack::state::Source::Worker,
        detail: None,
        fence: stack::state::Fence::None,
        set: stack::state::Updates {
            provider_message_id: Some("SM1".into()),
            ..Default::default()
        },
    };
    stack::state::transition(&mut conn, &t)
        .await
        .unwrap()
        .unwrap();
    d.id
}

async fn state_and_events(pool: &PgPool, id: i64) -> (String, i64) {
    sqlx::query_as("SELECT state, (SELECT count(*) FROM delivery_transitions WHERE delivery_id = $1) FROM deliveries WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn sms_callbacks_are_verified_deduplicated_and_never_regress() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let cfg = stack::Config::for_tests(&db.url);
    let (addr, _stop, _h) = common::start_api(&cfg).await;
    let http = reqwest::Client::new();
    let r = http
        .post(format!("http://{addr}/v1/batches"))
        .json(&common::batch_body("cb", 1, &["sms", "email"]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let id = submitted_sms(&pool).await;
    let url = format!("http://{addr}/v1/callbacks/sms?d={id}");
    let post = |status: &str, token: &str, tamper: bool| {
        let params: Vec<(String, String)> = vec![
            ("MessageSid".into(), "SM1".into()),
            ("MessageStatus".into(), status.into()),
        ];
        let mut sig = twilio_signature(&cfg.sms_auth_token, &url, &params);
        if tamper {
            sig = twilio_signature("wrong-token", &url, &params);
        }
        http.post(&url)
            .header("X-Twilio-Signature", sig)
            .header("I-Twilio-Idempotency-Token", token)
            .form(&params)
            .send()
    };
    let (_, before) = state_and_events(&pool, id).await;
    // Forged: 403, nothing changes.
    assert_eq!(
        post("undelivered", "t0", true)
            .await
            .unwrap()
            .status()
            .as_u16(),
        403
    );
    assert_eq!(
        state_and_events(&pool, id).await,
        ("submitted".into(), before)
    );
    // Genuine: applied once.
    assert_eq!(
        post("delivered", "t1", false)
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        state_and_events(&pool, id).await,
        ("delivered".into(), before + 1)
    );
    // Duplicate (same token) and duplicate (new token, same status): acknowledged, no change.
    assert_eq!(
        post("delivered", "t1", false)
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        post("delivered", "t2", false)
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    // Stale intermediate and late failure after the terminal state: no regression.
    assert_eq!(
        post("sent", "t3", false).await.unwrap().status().as_u16(),
        200
    );
    assert_eq!(
        post("undelivered", "t4", false)
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        state_and_events(&pool, id).await,
        ("delivered".into(), before + 1)
    );
    // Unknown message: acknowledged.
    let params = vec![
        ("MessageSid".to_string(), "SM404".to_string()),
        ("MessageStatus".into(), "delivered".into()),
    ];
    let u = format!("http://{addr}/v1/callbacks/sms");
    let r = http
        .post(&u)
        .header(
            "X-Twilio-Signature",
            twilio_signature(&cfg.sms_auth_token, &u, &params),
        )
        .form(&params)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    pool.close().await;
}

/// Enqueues one e-mail delivery in batch `batch` through the API and moves it, as a worker whose
/// attempt ended so, from `sending` to `to`.
async fn email_delivery_in(
    pool: &PgPool,
    addr: &str,
    batch: &str,
    to: stack::state::State,
) -> stack::claim::Claimed {
    reqwest::Client::new()
        .post(format!("http://{addr}/v1/batches"))
        .json(&common::batch_body(batch, 1, &["email"]))
        .send()
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let d = stack::claim::claim(&mut conn, "w1", 1, Duration::from_secs(60))
        .await
        .unwrap()
        .remove(0);
    let t = stack::state::Transition {
        delivery_id: d.id,
        from: &[stack::state::State::Sending],
        to,
        source: stack::state::Source::Worker,
        detail: None,
        fence: stack::state::Fence::None,
        set: Default::default(),
    };
    stack::state::transition(&mut conn, &t)
        .await
        .unwrap()
        .unwrap();
    d
}

/// A delivery event about `d` and its `X-Ting-Signature` under `secret`.
fn email_event(d: &stack::claim::Claimed, id: &str, kind: &str, secret: &str) -> (String, String) {
    let body =
        json!({"id": id, "type": kind, "message_id": d.correlation_id, "recipient": d.address,
                      "timestamp": "2026-11-30T00:00:00Z", "reason": "550 5.1.1 mailbox unknown"})
        .to_string();
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let sig = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    (body, sig)
}

#[tokio::test]
async fn email_events_are_verified_and_resolve_unknown() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let cfg = stack::Config::for_tests(&db.url);
    let (addr, _stop, _h) = common::start_api(&cfg).await;
    let http = reqwest::Client::new();
    // An attempt whose outcome could not be known.
    let d = email_delivery_in(&pool, &addr, "cb", stack::state::State::Unknown).await;
    let url = format!("http://{addr}/v1/callbacks/email");
    let send = |id: &str, kind: &str, secret: &str| {
        let (body, sig) = email_event(&d, id, kind, secret);
        http.post(&url)
            .header("X-Ting-Signature", sig)
            .body(body)
            .send()
    };
    let (_, before) = state_and_events(&pool, d.id).await;
    assert_eq!(
        send("e1", "bounced", "forged")
            .await
            .unwrap()
            .status()
            .as_u16(),
        403
    );
    assert_eq!(
        state_and_events(&pool, d.id).await,
        ("unknown".into(), before)
    );
    assert_eq!(
        send("e2", "delivered", &cfg.smtp_events_secret)
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        send("e2", "delivered", &cfg.smtp_events_secret)
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        send("e3", "bounced", &cfg.smtp_events_secret)
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        state_and_events(&pool, d.id).await,
        ("delivered".into(), before + 1)
    );
    pool.close().await;
}

/// A provider that stops waiting (its request timed out on a slow database) must not cancel the
/// callback's work: it is applied anyway, and the provider's retry is answered from the receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_callback_is_applied_even_when_its_sender_stops_waiting() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let (frozen, via_proxy) = common::start_freezable_proxy(&db.url).await;
    let cfg = stack::Config::for_tests(&via_proxy);
    let (addr, _stop, _h) = common::start_api(&cfg).await;
    let http = reqwest::Client::new();
    let d = email_delivery_in(&pool, &addr, "gone", stack::state::State::Submitted).await;
    let (body, sig) = email_event(&d, "ev-gone", "delivered", &cfg.smtp_events_secret);
    let post = || {
        http.post(format!("http://{addr}/v1/callbacks/email"))
            .header("X-Ting-Signature", sig.clone())
            .body(body.clone())
    };

    // The API's database stops answering; the sender gives up after 2 s and hangs up. (Long
    // enough for the request to reach the API even on a loaded machine; the API cannot answer
    // before the database does, so the sender's timeout is what ends the request.)
    frozen.store(true, Ordering::SeqCst);
    let r = post().timeout(Duration::from_secs(2)).send().await;
    assert!(r.is_err_and(|e| e.is_timeout()));
    frozen.store(false, Ordering::SeqCst);
    common::wait_for("the event applied", Duration::from_secs(20), || async {
        state_and_events(&pool, d.id).await.0 == "delivered"
    })
    .await;
    // The retry is a duplicate: acknowledged, nothing applied twice.
    let (_, events) = state_and_events(&pool, d.id).await;
    assert_eq!(post().send().await.unwrap().status().as_u16(), 200);
    assert_eq!(
        state_and_events(&pool, d.id).await,
        ("delivered".into(), events)
    );
    pool.close().await;
}
