//! Workers against fake providers on real PostgreSQL: a worker killed mid-batch is rescued by
//! another with no message sent twice; SIGTERM drains, releasing unstarted claims at once.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sqlx::PgPool;

fn worker_cfg(db_url: &str, fakes: &str, api: &str, id: &str) -> stack::Config {
    let mut cfg = stack::Config::for_tests(db_url);
    cfg.line_api_base = fakes.to_string();
    cfg.sms_api_base = fakes.to_string();
    cfg.api_addr = api.to_string();
    cfg.worker_id = id.to_string();
    // Long enough that no lease lapses while the test process or the database is descheduled
    // for a few seconds (a lapsed lease is moved by the worker's own rescuer, which these tests
    // do not expect). The tests that need a lease to expire set a short one themselves.
    cfg.lease = Duration::from_secs(30);
    cfg.heartbeat = Duration::from_millis(100);
    // Likewise, a send the fake holds (`hang`) stays in flight until the test releases it.
    cfg.provider_timeout = Duration::from_secs(30);
    cfg.sms_poll_after = Duration::from_millis(100);
    cfg.concurrency = 4;
    cfg.channel_concurrency = 2;
    cfg.claim_batch = 8;
    cfg
}

async fn count_where(pool: &PgPool, cond: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(&format!("SELECT count(*) FROM deliveries WHERE {cond}"))
        .fetch_one(pool)
        .await
        .unwrap();
    n
}

/// `url` with the connection's `application_name` set, so a test can find its sessions.
fn with_application_name(url: &str, name: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={name}")
}

async fn enqueue(addr: &str, batch: &str, n: usize, channels: &[&str]) {
    let r = reqwest::Client::new()
        .post(format!("http://{addr}/v1/batches"))
        .json(&common::batch_body(batch, n, channels))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_worker_is_rescued_and_nothing_is_sent_twice() {
    let dups = kill_mid_batch(stack::config::Flaws::default()).await;
    assert!(dups.is_empty(), "sent twice: {dups:?}");
}

/// The same check catches the classic mistake: resending an SMS whose first attempt may have
/// landed, without looking it up first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_worker_with_resend_uncertain_flaw_sends_twice() {
    let flaws = stack::config::Flaws::default().with(stack::config::Flaw::ResendUncertain);
    let dups = kill_mid_batch(flaws).await;
    assert!(!dups.is_empty(), "the duplicate check must see the flaw");
    assert!(
        dups.iter().all(|(addr, _)| addr.starts_with('+')),
        "only SMS is affected: {dups:?}"
    );
}

/// Kills a worker mid-batch, lets another finish, and returns the addresses that got more than
/// one message.
async fn kill_mid_batch(flaws: stack::config::Flaws) -> Vec<(String, u32)> {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let (fake, fakes) = common::start_fakes().await;
    let (api, _stop_api, _h) = common::start_api(&stack::Config::for_tests(&db.url)).await;
    enqueue(&api, "kill", 30, &["line", "sms"]).await;

    // Worker A: every send commits at the provider and then never answers. Its lease is short:
    // once A is dead, its rows must lapse for B's rescuer to take them over.
    fake.hang.store(true, Ordering::SeqCst);
    let (_never, stop_a) = common::shutdown_pair();
    let a_url = with_application_name(&db.url, "wA");
    let mut cfg_a = worker_cfg(&a_url, &fakes, &api, "wA");
    cfg_a.lease = Duration::from_secs(1);
    cfg_a.flaws = flaws.clone();
    let a = tokio::spawn(stack::worker::run(cfg_a, stop_a));
    common::wait_for("A mid-batch", Duration::from_secs(20), || async {
        fake.hanging.load(Ordering::SeqCst) >= 4
            && count_where(&pool, "state = 'sending'").await >= 8
    })
    .await;
    let (sessions,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name = 'wA'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(sessions > 0, "A's sessions are named");
    // Kill A: no cleanup code runs (its tasks are dropped with it).
    a.abort();
    assert!(a.await.unwrap_err().is_cancelled());
    // A's tasks are cancelled asynchronously, and a statement one of them had sent may still be
    // on its way: cut A's database sessions, as its process dying would, and wait until they are
    // gone. From here on nothing of A's changes the database.
    common::wait_for("A's sessions gone", Duration::from_secs(20), || async {
        let (left,): (i64,) = sqlx::query_as(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = 'wA'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        left == 0
    })
    .await;
    // What A held when it died (every row still `sending`), whether each attempt had started
    // under A's lease, and its attempt count then. Anything A's own rescuer did before is
    // history: only events after `died_at` are B's work.
    type Held = (i64, String, bool, i32);
    let held: Vec<Held> = sqlx::query_as(
        "SELECT id, coalesce(lease_owner, ''), coalesce(attempt_lease_token = lease_token, false), \
         attempts FROM deliveries WHERE state = 'sending' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let (died_at,): (chrono::DateTime<chrono::Utc>,) = sqlx::query_as("SELECT clock_timestamp()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(held.iter().all(|h| h.1 == "wA"), "{held:?}");
    let started_by_a = held.iter().filter(|h| h.2).count();
    let unstarted_by_a = held.len() - started_by_a;
    assert!(
        started_by_a >= 4 && unstarted_by_a >= 1,
        "{started_by_a} started, {unstarted_by_a} not"
    );
    fake.release_all();

    // Worker B rescues A's rows and finishes the batch.
    let (stop_b_tx, stop_b) = common::shutdown_pair();
    let mut cfg_b = worker_cfg(&db.url, &fakes, &api, "wB");
    cfg_b.flaws = flaws;
    let b = tokio::spawn(stack::worker::run(cfg_b, stop_b));
    common::wait_for("all delivered", Duration::from_secs(30), || async {
        count_where(&pool, "state = 'delivered'").await == 60
    })
    .await;
    stop_b_tx.send(true).unwrap();
    b.await.unwrap().unwrap();

    let commits = fake.commits_per_address();
    assert_eq!(
        commits.len(),
        60,
        "every recipient on every channel got its message"
    );
    let dups: Vec<(String, u32)> = commits.into_iter().filter(|(_, n)| *n != 1).collect();
    // Every row A held, and no other, was rescued from A's lease once after A died: a started
    // attempt reconciled, an unstarted claim released.
    let rescued: Vec<(i64, String)> = sqlx::query_as(
        "SELECT delivery_id, coalesce(detail, '') FROM delivery_transitions \
         WHERE source = 'rescuer' AND at > $1 AND detail LIKE '%lease of wA %' \
         ORDER BY delivery_id, event_id NULLS LAST, part",
    )
    .bind(died_at)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        rescued.iter().map(|r| r.0).collect::<Vec<_>>(),
        held.iter().map(|h| h.0).collect::<Vec<_>>(),
        "every row A held was rescued, once: {rescued:#?}"
    );
    for ((id, _, started, _), (_, detail)) in held.iter().zip(&rescued) {
        let released = detail.ends_with("expired before the attempt started");
        assert_eq!(released, !started, "delivery {id}: {detail}");
    }
    // Rows A never started went back without an attempt counted: B's send is their only one
    // since.
    let unstarted: Vec<i64> = held.iter().filter(|h| !h.2).map(|h| h.0).collect();
    let attempts: Vec<(i64, i32)> =
        sqlx::query_as("SELECT id, attempts FROM deliveries WHERE id = ANY($1) ORDER BY id")
            .bind(&unstarted)
            .fetch_all(&pool)
            .await
            .unwrap();
    for (id, now) in attempts {
        let then = held.iter().find(|h| h.0 == id).unwrap().3;
        assert_eq!(now, then + 1, "delivery {id}: attempts");
    }
    // LINE resends were answered 409 (same retry key); SMS resends were replaced by a lookup.
    assert!(
        fake.line_requests.load(Ordering::SeqCst) > 30
            || fake.sms_lookups.load(Ordering::SeqCst) > 0
    );
    pool.close().await;
    dups
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_releases_unstarted_claims_at_once_and_drains() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let (fake, fakes) = common::start_fakes().await;
    let (api, _stop_api, _h) = common::start_api(&stack::Config::for_tests(&db.url)).await;
    enqueue(&api, "term", 30, &["line"]).await;

    fake.hang.store(true, Ordering::SeqCst);
    let cfg = worker_cfg(&db.url, &fakes, &api, "w1");
    let grace = cfg.shutdown_grace;
    let capacity = (cfg.concurrency + cfg.claim_batch as usize) as i64;
    let (stop_tx, stop) = common::shutdown_pair();
    let w = tokio::spawn(stack::worker::run(cfg, stop));
    common::wait_for("claims in flight", Duration::from_secs(20), || async {
        fake.hanging.load(Ordering::SeqCst) == 2
            && count_where(&pool, "state = 'sending'").await == capacity
    })
    .await;

    let t0 = Instant::now();
    stop_tx.send(true).unwrap();
    // Unstarted claims go back while the two sends are still in flight.
    common::wait_for("unstarted released", Duration::from_secs(5), || async {
        count_where(&pool, "state = 'sending'").await == 2
    })
    .await;
    assert_eq!(fake.hanging.load(Ordering::SeqCst), 2);
    assert_eq!(
        count_where(&pool, "state = 'pending' AND attempts = 0").await,
        28
    );
    fake.release_all();
    w.await.unwrap().unwrap();
    assert!(t0.elapsed() < grace, "drained within the grace period");
    assert_eq!(
        count_where(&pool, "state = 'delivered' AND attempts = 1").await,
        2
    );
    let (released,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM delivery_transitions \
         WHERE detail = 'released on shutdown before start'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(released, capacity - 2);
    let (stopped,): (bool,) =
        sqlx::query_as("SELECT stopped_at IS NOT NULL FROM workers WHERE id = 'w1'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(stopped);
    assert_eq!(fake.commits_per_address().len(), 2, "nothing else was sent");
    pool.close().await;
}

/// What the worker processes logged, for tests that must wait on a step nothing else shows.
fn worker_log() -> &'static std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    static LOG: std::sync::OnceLock<std::sync::Arc<std::sync::Mutex<Vec<u8>>>> =
        std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || LogSink(sink.clone()))
            .try_init();
        buf
    })
}

struct LogSink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logged(needle: &str) -> bool {
    worker_log()
        .lock()
        .map(|v| String::from_utf8_lossy(&v).contains(needle))
        .unwrap_or(false)
}

/// A SIGTERM that lands while a claim is on its way to the database: the rows that claim took
/// are given back untouched, none is sent (issue 14, item 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_claimed_as_sigterm_arrives_go_back_unsent() {
    worker_log();
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let (fake, fakes) = common::start_fakes().await;
    let (api, _stop_api, _h) = common::start_api(&stack::Config::for_tests(&db.url)).await;
    enqueue(&api, "late", 12, &["line"]).await;

    // Hold the table so the worker's first claim waits for it.
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE delivery_state IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let mut cfg = worker_cfg(&db.url, &fakes, &api, "wlate");
    cfg.shutdown_grace = Duration::from_secs(20);
    let claim_batch = cfg.claim_batch;
    let (stop_tx, stop) = common::shutdown_pair();
    let w = tokio::spawn(stack::worker::run(cfg, stop));
    common::wait_for(
        "a claim waiting for the lock",
        Duration::from_secs(20),
        || async {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND query LIKE '%picked AS MATERIALIZED%'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            n > 0
        },
    )
    .await;
    stop_tx.send(true).unwrap();
    common::wait_for(
        "the worker saw SIGTERM",
        Duration::from_secs(10),
        || async { logged("SIGTERM during a claim") },
    )
    .await;
    lock.commit().await.unwrap();

    w.await.unwrap().unwrap();
    assert_eq!(fake.commits_per_address().len(), 0, "nothing was sent");
    assert_eq!(
        count_where(&pool, "state = 'pending' AND attempts = 0").await,
        12
    );
    let (released,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM delivery_transitions \
         WHERE detail = 'released on shutdown before start'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(released, claim_batch.min(12));
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn email_outcomes_are_classified_and_resends_are_byte_identical() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let (_fake, fakes) = common::start_fakes().await;
    let (smtp, smtp_addr) = common::start_smtp().await;
    let (api, _stop_api, _h) = common::start_api(&stack::Config::for_tests(&db.url)).await;
    let mut body = common::batch_body("mail", 5, &["email"]);
    body["recipients"][1]["email"] = serde_json::json!("bad@example.test");
    body["recipients"][2]["email"] = serde_json::json!("flaky@example.test");
    body["recipients"][4]["email"] = serde_json::json!("hangup@example.test");
    let r = reqwest::Client::new()
        .post(format!("http://{api}/v1/batches"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);

    let mut cfg = worker_cfg(&db.url, &fakes, &api, "w1");
    cfg.smtp_addr = smtp_addr;
    let (stop_tx, stop) = common::shutdown_pair();
    let w = tokio::spawn(stack::worker::run(cfg, stop));
    common::wait_for("all e-mails settled", Duration::from_secs(20), || async {
        count_where(&pool, "state IN ('submitted', 'permanent_failure')").await == 5
    })
    .await;
    stop_tx.send(true).unwrap();
    w.await.unwrap().unwrap();

    type Row = (String, String, i32, Option<String>, Option<String>, String);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT address, state, attempts, last_error, provider_message_id, correlation_id \
         FROM deliveries ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for (address, state, attempts, err, pid, cid) in &rows {
        match address.as_str() {
            "bad@example.test" => {
                assert_eq!(state, "permanent_failure");
                assert!(err.as_deref().unwrap_or("").contains("5.1.1"), "{err:?}");
            }
            "flaky@example.test" => {
                assert_eq!((state.as_str(), *attempts), ("submitted", 2));
                assert!(err.as_deref().unwrap_or("").contains("4.3.0"), "{err:?}");
            }
            // The connection dropped at RCPT, before any body: a plain retry, never `unknown`.
            "hangup@example.test" => {
                assert_eq!((state.as_str(), *attempts), ("submitted", 2));
            }
            _ => assert_eq!((state.as_str(), *attempts), ("submitted", 1)),
        }
        if state == "submitted" {
            assert_eq!(
                pid.as_deref(),
                Some(cid.as_str()),
                "Message-ID is the provider id"
            );
        }
    }
    let data = smtp.data.lock().unwrap().clone();
    let flaky: Vec<&String> = data
        .iter()
        .filter(|(to, _)| to.contains("flaky"))
        .map(|(_, d)| d)
        .collect();
    assert_eq!(flaky.len(), 2);
    assert_eq!(flaky[0], flaky[1], "both attempts sent the same bytes");
    let cid = &rows[2].5;
    assert!(
        flaky[0].contains(&format!("Message-ID: {cid}")),
        "{}",
        flaky[0]
    );
    assert_eq!(smtp.accepted.lock().unwrap().len(), 4);
    pool.close().await;
}

async fn api_deliveries(api: &str, batch: &str) -> serde_json::Value {
    reqwest::get(format!("http://{api}/v1/batches/{batch}/deliveries"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Attempts exhausted by transient faults end `failed`, visible in the API with the attempt
/// count, the provider's last text and the reason; every attempt sent the stored payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exhausted_deliveries_end_failed_and_visible_in_the_api() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let (fake, fakes) = common::start_fakes().await;
    let (api, _stop_api, _h) = common::start_api(&stack::Config::for_tests(&db.url)).await;
    enqueue(&api, "tired", 2, &["line"]).await;
    *fake.line_fail.lock().unwrap() = Some((429, Some("0".into())));

    let mut cfg = worker_cfg(&db.url, &fakes, &api, "w1");
    cfg.max_attempts = 3;
    let (stop_tx, stop) = common::shutdown_pair();
    let w = tokio::spawn(stack::worker::run(cfg, stop));
    common::wait_for("both failed", Duration::from_secs(20), || async {
        count_where(&pool, "state = 'failed'").await == 2
    })
    .await;
    stop_tx.send(true).unwrap();
    w.await.unwrap().unwrap();

    let v = api_deliveries(&api, "tired").await;
    let rows = v["deliveries"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for d in rows {
        assert_eq!(d["state"], "failed", "{d}");
        assert_eq!(d["attempts"], 3, "{d}");
        assert_eq!(d["last_error_class"], "exhausted", "{d}");
        assert_eq!(
            d["last_error"], "429 fake says 429 Too Many Requests",
            "the provider's own text: {d}"
        );
        let last = d["transitions"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(
            (last["from"].as_str(), last["to"].as_str()),
            (Some("sending"), Some("failed"))
        );
        assert_eq!(last["source"], "worker");
        assert!(
            last["detail"]
                .as_str()
                .unwrap()
                .starts_with("gave up after 3 attempts (max 3)"),
            "{last}"
        );
        // Three attempts, all with the bytes stored at enqueue (and hashed then).
        let address = d["address"].as_str().unwrap();
        let texts: Vec<String> = fake
            .line_texts
            .lock()
            .unwrap()
            .iter()
            .filter(|(to, _)| to == address)
            .map(|(_, t)| t.clone())
            .collect();
        assert_eq!(texts.len(), 3, "{address}");
        let stored = stack::render::Payload {
            text: texts[0].clone(),
            ..Default::default()
        };
        assert!(texts.iter().all(|t| *t == texts[0]), "{texts:?}");
        assert_eq!(d["payload_sha256"], serde_json::json!(stored.sha256()));
    }
    assert_eq!(
        fake.line_requests.load(Ordering::SeqCst),
        6,
        "nothing after failed"
    );
    pool.close().await;
}

/// The age cap is enforced before a send (a row already past it fails without being sent once
/// more) and when scheduling a retry (a Retry-After that would land past it fails now).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_age_cap_is_enforced_before_sending_and_on_retry_after() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let (fake, fakes) = common::start_fakes().await;
    let (api, _stop_api, _h) = common::start_api(&stack::Config::for_tests(&db.url)).await;
    let http = reqwest::Client::new();
    for (batch, user) in [("old", "Uold"), ("late", "Ulate")] {
        let mut body = common::batch_body(batch, 1, &["line"]);
        body["recipients"][0]["line_user_id"] = serde_json::json!(user);
        let r = http
            .post(format!("http://{api}/v1/batches"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }
    sqlx::query(
        "UPDATE delivery_items SET created_at = now() - interval '2 hours' WHERE batch_id = 'old'",
    )
    .execute(&pool)
    .await
    .unwrap();
    // The provider asks for two minutes; the age cap is one.
    *fake.line_fail.lock().unwrap() = Some((429, Some("120".into())));
    let mut cfg = worker_cfg(&db.url, &fakes, &api, "w1");
    cfg.max_age = Duration::from_secs(60);
    let (stop_tx, stop) = common::shutdown_pair();
    let w = tokio::spawn(stack::worker::run(cfg, stop));
    common::wait_for("both failed", Duration::from_secs(20), || async {
        count_where(&pool, "state = 'failed'").await == 2
    })
    .await;
    stop_tx.send(true).unwrap();
    w.await.unwrap().unwrap();

    let texts = fake.line_texts.lock().unwrap().clone();
    assert!(
        texts.iter().all(|(to, _)| to != "Uold"),
        "too old: never sent"
    );
    assert_eq!(texts.iter().filter(|(to, _)| to == "Ulate").count(), 1);
    let old = &api_deliveries(&api, "old").await["deliveries"][0];
    assert_eq!(
        (old["state"].as_str(), old["attempts"].as_i64()),
        (Some("failed"), Some(0))
    );
    assert_eq!(old["last_error_class"], "exhausted");
    let detail = old["transitions"].as_array().unwrap().last().unwrap()["detail"].clone();
    assert_eq!(
        detail,
        "not attempted again: older than the age cap of 60000ms"
    );
    let late = &api_deliveries(&api, "late").await["deliveries"][0];
    assert_eq!(
        (late["state"].as_str(), late["attempts"].as_i64()),
        (Some("failed"), Some(1))
    );
    assert_eq!(late["last_error"], "429 fake says 429 Too Many Requests");
    let detail = late["transitions"].as_array().unwrap().last().unwrap()["detail"].clone();
    assert!(
        detail
            .as_str()
            .unwrap()
            .contains("would be past the age cap of 60000ms"),
        "{detail}"
    );
    pool.close().await;
}

/// `/metrics` after a small run: deliveries by state, oldest ready age, lease expirations,
/// attempts by channel and outcome class, time in submitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_after_a_small_run() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let (fake, fakes) = common::start_fakes().await;
    let (api, _stop_api, _h) = common::start_api(&stack::Config::for_tests(&db.url)).await;
    enqueue(&api, "m", 3, &["line", "sms"]).await;
    // Each LINE address's first push is a 429: one transient attempt per LINE delivery.
    fake.line_fail_first.store(true, Ordering::SeqCst);
    // A worker that died right after claiming one row: its lease expires and is rescued.
    let mut conn = pool.acquire().await.unwrap();
    let dead = stack::claim::claim(&mut conn, "dead", 1, Duration::from_millis(1))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    drop(conn);

    let cfg = worker_cfg(&db.url, &fakes, &api, "w1");
    let (stop_tx, stop) = common::shutdown_pair();
    let w = tokio::spawn(stack::worker::run(cfg, stop));
    common::wait_for("all delivered", Duration::from_secs(20), || async {
        count_where(&pool, "state = 'delivered'").await == 6
    })
    .await;
    stop_tx.send(true).unwrap();
    w.await.unwrap().unwrap();

    let m = common::metrics(&api).await;
    let at = |series: &str| common::sample(&m, series).unwrap_or_else(|| panic!("{series}\n{m}"));
    assert_eq!(
        at(r#"ting_deliveries{channel="line",state="delivered"}"#),
        3.0
    );
    assert_eq!(
        at(r#"ting_deliveries{channel="sms",state="delivered"}"#),
        3.0
    );
    assert_eq!(at("ting_oldest_ready_age_seconds"), 0.0, "nothing ready");
    assert_eq!(at("ting_lease_expirations_total"), 1.0);
    assert_eq!(
        at(r#"ting_attempts_total{channel="line",class="transient"}"#),
        3.0
    );
    assert_eq!(
        at(r#"ting_attempts_total{channel="line",class="accepted"}"#),
        3.0
    );
    assert_eq!(
        at(r#"ting_attempts_total{channel="sms",class="accepted"}"#),
        3.0
    );
    assert_eq!(
        common::sample(
            &m,
            r#"ting_attempts_total{channel="sms",class="transient"}"#
        ),
        None
    );
    // Only the SMS went through `submitted` (LINE is final at once).
    assert_eq!(at("ting_submitted_seconds_count"), 3.0);
    assert!(at("ting_submitted_seconds_sum") > 0.0, "{m}");
    assert_eq!(at("ting_submitted_oldest_seconds"), 0.0);
    assert!(m.contains("# TYPE ting_attempts_total counter"));

    // With no worker, a new row waits: the oldest ready age grows.
    enqueue(&api, "waiting", 1, &["line"]).await;
    common::wait_for("ready age", Duration::from_secs(10), || async {
        common::sample(
            &common::metrics(&api).await,
            "ting_oldest_ready_age_seconds",
        )
        .is_some_and(|s| s >= 0.2)
    })
    .await;
    pool.close().await;
}

/// A shutdown during start-up (here: the database never answers the connection) ends the
/// worker at once with `Ok`, instead of after the connect timeout or with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_start_up_exits_at_once() {
    let (url, accepted) = common::start_silent_db().await;
    let cfg = stack::Config::for_tests(&url);
    let (stop_tx, stop) = common::shutdown_pair();
    let w = tokio::spawn(stack::worker::run(cfg, stop));
    common::wait_for("connecting", Duration::from_secs(10), || async {
        accepted.load(Ordering::SeqCst) >= 1
    })
    .await;
    let t0 = Instant::now();
    stop_tx.send(true).unwrap();
    let r = tokio::time::timeout(Duration::from_secs(8), w)
        .await
        .expect("returned")
        .unwrap();
    assert!(r.is_ok(), "{r:?}");
    // Well under the pool's 10 s acquire timeout, which is what a worker that ignored the signal
    // during start-up would wait out (slack for a loaded machine).
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

/// The drain ends within the grace period even when the database stops answering: give-backs,
/// the final bookkeeping and the pool's close are all bounded by what is left of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_drain_ends_within_the_grace_period_when_the_database_is_gone() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let (frozen, via_proxy) = common::start_freezable_proxy(&db.url).await;
    let (fake, fakes) = common::start_fakes().await;
    let (api, _stop_api, _h) = common::start_api(&stack::Config::for_tests(&db.url)).await;
    enqueue(&api, "gone", 30, &["line"]).await;

    fake.hang.store(true, Ordering::SeqCst);
    let mut cfg = worker_cfg(&via_proxy, &fakes, &api, "w1");
    cfg.shutdown_grace = Duration::from_secs(3);
    let grace = cfg.shutdown_grace;
    let capacity = (cfg.concurrency + cfg.claim_batch as usize) as i64;
    let (stop_tx, stop) = common::shutdown_pair();
    let w = tokio::spawn(stack::worker::run(cfg, stop));
    common::wait_for("claims in flight", Duration::from_secs(20), || async {
        fake.hanging.load(Ordering::SeqCst) == 2
            && count_where(&pool, "state = 'sending'").await == capacity
    })
    .await;
    frozen.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    stop_tx.send(true).unwrap();
    let r = tokio::time::timeout(grace * 2, w)
        .await
        .expect("the worker returned")
        .unwrap();
    let took = t0.elapsed();
    assert!(r.is_ok(), "{r:?}");
    // The worker is done by 90% of the grace period after it saw the signal; the test allows
    // half a grace period more for a loaded machine, which still fails a drain whose steps each
    // get their own deadline (the bookkeeping's 90% counted from the drain's 80%: 1.7 × grace).
    assert!(
        took < grace * 3 / 2,
        "took {took:?} with a grace of {grace:?}"
    );
    frozen.store(false, Ordering::SeqCst);
    fake.release_all();
    pool.close().await;
}

/// Two SMS deliveries' shared text and number, and the deliveries' keys.
async fn sms_text(pool: &PgPool, key: &str) -> String {
    let (t,): (String,) = sqlx::query_as("SELECT payload->>'text' FROM deliveries WHERE key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap();
    t
}

/// Makes `key` look like an SMS whose attempt started `ago` and whose answer was lost.
async fn make_uncertain(pool: &PgPool, key: &str, ago: &str) {
    sqlx::query(&format!(
        "UPDATE delivery_state SET state = 'retryable', attempts = 1, last_error_class = 'ambiguous', \
         last_error = '503', attempt_started_at = now() - interval '{ago}', \
         uncertain_since = now() - interval '{ago}', next_attempt_at = now() \
         WHERE id = (SELECT id FROM deliveries WHERE key = $1)"
    ))
    .bind(key)
    .execute(pool)
    .await
    .unwrap();
}

/// The SMS lookup before a resend adopts only a message that can be this delivery's: not one
/// another delivery owns (same number, same text), not one from before the uncertain attempt,
/// and it reads every page of the provider's list to find it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sms_lookup_adopts_only_this_deliverys_message() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let (fake, fakes) = common::start_fakes().await;
    let (api, _stop_api, _h) = common::start_api(&stack::Config::for_tests(&db.url)).await;
    let http = reqwest::Client::new();
    // twins: two recipients on one shared phone with the same text; early, paged: one each.
    for (batch, phones) in [
        ("twins", vec!["+15550000001", "+15550000001"]),
        ("early", vec!["+15550000002"]),
        ("paged", vec!["+15550000003"]),
    ] {
        let mut body = common::batch_body(batch, phones.len(), &["sms"]);
        for (i, phone) in phones.iter().enumerate() {
            body["recipients"][i]["phone"] = serde_json::json!(phone);
            body["recipients"][i]["name"] = serde_json::json!("Ana");
            body["recipients"][i]["vars"] = serde_json::json!({"order_id": "A-1"});
        }
        let r = http
            .post(format!("http://{api}/v1/batches"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }
    let text = sms_text(&pool, "twins:r000000:sms").await;
    assert_eq!(text, sms_text(&pool, "twins:r000001:sms").await);
    let now = chrono::Utc::now();

    // twins: r0 really was sent and recorded; r1's attempt (a second earlier) never reached the
    // provider. The only candidate is r0's.
    let owned = fake.inject_sms("+15550000001", &text, now);
    sqlx::query(
        "UPDATE delivery_state SET state = 'submitted', provider_message_id = $1, attempts = 1, \
         submitted_at = now(), next_poll_at = now() + interval '1 hour' \
         WHERE id = (SELECT id FROM deliveries WHERE key = 'twins:r000000:sms')",
    )
    .bind(&owned)
    .execute(&pool)
    .await
    .unwrap();
    make_uncertain(&pool, "twins:r000001:sms", "1 second").await;
    // early: the only message with its number and text is from ten minutes before its attempt.
    let stale = fake.inject_sms("+15550000002", &text, now - chrono::Duration::minutes(10));
    make_uncertain(&pool, "early:r000000:sms", "1 second").await;
    // paged: its message landed; two newer ones (other texts) come first, one per page.
    let landed = fake.inject_sms("+15550000003", &text, now - chrono::Duration::seconds(2));
    fake.inject_sms(
        "+15550000003",
        "other 1",
        now - chrono::Duration::seconds(1),
    );
    fake.inject_sms("+15550000003", "other 2", now);
    fake.sms_page_size.store(1, Ordering::SeqCst);
    make_uncertain(&pool, "paged:r000000:sms", "5 seconds").await;

    let mut cfg = worker_cfg(&db.url, &fakes, &api, "w1");
    cfg.sms_poll_after = Duration::from_secs(3600);
    let (stop_tx, stop) = common::shutdown_pair();
    let w = tokio::spawn(stack::worker::run(cfg, stop));
    common::wait_for("all reconciled", Duration::from_secs(20), || async {
        count_where(&pool, "state = 'submitted'").await == 4
    })
    .await;
    stop_tx.send(true).unwrap();
    w.await.unwrap().unwrap();

    let sid = |key: &'static str| {
        let pool = pool.clone();
        async move {
            let (s,): (Option<String>,) =
                sqlx::query_as("SELECT provider_message_id FROM deliveries WHERE key = $1")
                    .bind(key)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            s.unwrap()
        }
    };
    let to = |phone: &str| {
        fake.sms
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m.to == phone)
            .count()
    };
    // Not adopted: another delivery owns it. Sent instead.
    let twin = sid("twins:r000001:sms").await;
    assert_ne!(twin, owned);
    assert_eq!(to("+15550000001"), 2, "each twin got its own message");
    assert_eq!(sid("twins:r000000:sms").await, owned);
    // Not adopted: from before the attempt (less the skew allowance). Sent instead.
    assert_ne!(sid("early:r000000:sms").await, stale);
    assert_eq!(to("+15550000002"), 2);
    // Adopted from the third page, not sent again.
    assert_eq!(sid("paged:r000000:sms").await, landed);
    assert_eq!(to("+15550000003"), 3);
    assert!(
        fake.sms_lookups.load(Ordering::SeqCst) >= 5,
        "three lookups, one of three pages"
    );
    let (adopted,): (String,) = sqlx::query_as(
        "SELECT e.detail FROM delivery_transitions e JOIN deliveries d ON d.id = e.delivery_id \
         WHERE d.key = 'paged:r000000:sms' AND e.to_state = 'submitted'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        adopted.starts_with(&format!("adopted {landed}")),
        "{adopted}"
    );
    pool.close().await;
}

/// A worker frozen during the lookup that precedes an SMS resend (here: its database unreachable,
/// so its lease renewals stall, while the provider's list takes longer than the lease) must not
/// wake up and send: by then the lease is gone and another worker may have looked up, found
/// nothing and sent. It takes its start back instead, and the delivery is sent once, later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_stalled_in_the_sms_lookup_does_not_send_after_its_lease() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let (frozen, via_proxy) = common::start_freezable_proxy(&db.url).await;
    let (fake, fakes) = common::start_fakes().await;
    let (api, _stop_api, _h) = common::start_api(&stack::Config::for_tests(&db.url)).await;
    enqueue(&api, "stall", 1, &["sms"]).await;
    let key = "stall:r000000:sms";
    make_uncertain(&pool, key, "1 second").await;

    let mut cfg = worker_cfg(&via_proxy, &fakes, &api, "w1");
    // A short lease, for the lookup to outlast it.
    cfg.lease = Duration::from_secs(1);
    // The lookup must answer (slowly), not time out: a timed-out lookup is "cannot tell".
    cfg.provider_timeout = Duration::from_secs(10);
    let lease = cfg.lease;
    fake.sms_list_delay_ms
        .store(lease.as_millis() as u64 * 5 / 2, Ordering::SeqCst);
    let (stop_tx, stop) = common::shutdown_pair();
    let w = tokio::spawn(stack::worker::run(cfg, stop));
    common::wait_for("the lookup in flight", Duration::from_secs(20), || async {
        fake.sms_lookups.load(Ordering::SeqCst) >= 1
    })
    .await;
    frozen.store(true, Ordering::SeqCst);
    common::wait_for("the lookup answered", Duration::from_secs(20), || async {
        fake.sms_lookups_done.load(Ordering::SeqCst) >= 1
    })
    .await;
    // The lookup found nothing and the lease has lapsed: a send now would be the zombie's.
    let deadline = Instant::now() + lease;
    while Instant::now() < deadline {
        assert!(
            fake.sms.lock().unwrap().is_empty(),
            "sent after the lease was lost"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fake.sms_list_delay_ms.store(0, Ordering::SeqCst);
    frozen.store(false, Ordering::SeqCst);
    common::wait_for("sent once, later", Duration::from_secs(20), || async {
        count_where(&pool, "state IN ('submitted', 'delivered')").await == 1
    })
    .await;
    stop_tx.send(true).unwrap();
    w.await.unwrap().unwrap();
    assert_eq!(fake.sms.lock().unwrap().len(), 1);
    // The stalled attempt is given back either by the worker itself (start taken back) or, if
    // the rescuer got to the expired lease first once the database answered again, by the
    // rescuer; never by both. Other claims may be given back too, depending on timing: a claim
    // statement that sat in the frozen connection for longer than a lease ("lease too close to
    // expiry to start"), or the final attempt if the test process stalls past its lease. So:
    // at least one give-back of a started attempt, and no claim given back twice (each
    // `sending → retryable` directly follows its own claim, the transitions of one delivery
    // chain, and no claim is ended by two event rows).
    let (ended_twice,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM (SELECT at FROM delivery_transitions WHERE to_state = 'sending' \
         GROUP BY at HAVING count(*) > 1) twice",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(ended_twice, 0, "a claim ended twice");
    let events: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT from_state, to_state, source, coalesce(detail, '') FROM delivery_transitions \
         ORDER BY event_id NULLS LAST, part",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut state: Option<&str> = None;
    let mut stalled_given_back = 0;
    for (from, to, source, detail) in &events {
        if let Some(state) = state {
            assert_eq!(from, state, "the events chain: {events:#?}");
        }
        // Taken back by the worker, or reconciled by the rescuer as started.
        let started_given_back = detail == "lease deadline passed before send"
            || (source == "rescuer" && detail.contains("mid-attempt"));
        if from == "sending" && to == "retryable" && started_given_back {
            stalled_given_back += 1;
        }
        state = Some(to.as_str());
    }
    assert!(
        stalled_given_back >= 1,
        "the stalled attempt was given back: {events:#?}"
    );
    pool.close().await;
}

/// How the twin's attempt in flight ends in [`twin_in_flight`].
#[derive(Clone, Copy, Debug, PartialEq)]
enum TwinEnds {
    /// Its worker records its outcome: the sid of the message it sent.
    Recorded,
    /// Its worker dies: the lease lapses and the rescuer marks it uncertain.
    Rescued,
}

/// Twins A and B (two recipients sharing a phone, the same text): B's send has landed at the
/// provider but B has not recorded its sid yet (its attempt is in flight under another worker's
/// lease). A, whose earlier attempt is uncertain (it never landed), must not adopt B's message:
/// B's own outcome records that sid without the adoption lock, so two rows would own one message
/// and A's would never be sent. A cannot tell yet and looks again later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sms_lookup_does_not_adopt_a_twins_message_in_flight() {
    twin_in_flight(TwinEnds::Recorded).await;
}

/// As above, but B's worker dies: once the rescuer has marked B uncertain too, B is no longer
/// in flight and cannot record the sid except through the adoption lock, so the twins do not
/// wait on each other: one adopts B's message, the other sends its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sms_twins_both_uncertain_settle_with_one_message_each() {
    twin_in_flight(TwinEnds::Rescued).await;
}

async fn twin_in_flight(ends: TwinEnds) {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let (fake, fakes) = common::start_fakes().await;
    let (api, _stop_api, _h) = common::start_api(&stack::Config::for_tests(&db.url)).await;
    let phone = "+15550000009";
    let mut body = common::batch_body("pair", 2, &["sms"]);
    for i in 0..2 {
        body["recipients"][i]["phone"] = serde_json::json!(phone);
        body["recipients"][i]["name"] = serde_json::json!("Ana");
        body["recipients"][i]["vars"] = serde_json::json!({"order_id": "A-1"});
    }
    let r = reqwest::Client::new()
        .post(format!("http://{api}/v1/batches"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let (a, b) = ("pair:r000000:sms", "pair:r000001:sms");
    let text = sms_text(&pool, a).await;
    assert_eq!(text, sms_text(&pool, b).await);

    // B: claimed by another worker (alive: its lease has an hour left), attempt started a second
    // ago; its message is at the provider, its answer not recorded yet.
    let theirs = fake.inject_sms(phone, &text, chrono::Utc::now());
    sqlx::query(
        "UPDATE delivery_state SET state = 'sending', attempts = 1, lease_owner = 'wOther', \
         lease_token = 7, attempt_lease_token = 7, lease_expires_at = now() + interval '1 hour', \
         attempt_started_at = now() - interval '1 second' \
         WHERE id = (SELECT id FROM deliveries WHERE key = $1)",
    )
    .bind(b)
    .execute(&pool)
    .await
    .unwrap();
    // A: its attempt a second ago may have landed (it did not).
    make_uncertain(&pool, a, "1 second").await;

    let mut cfg = worker_cfg(&db.url, &fakes, &api, "w1");
    cfg.sms_poll_after = Duration::from_secs(3600);
    // A looks again every few tens of ms while B is in flight: its attempts must not run out
    // before the test lets B finish.
    cfg.max_attempts = 10_000;
    let (stop_tx, stop) = common::shutdown_pair();
    let w = tokio::spawn(stack::worker::run(cfg, stop));
    let sid_of = |key: &'static str| {
        let pool = pool.clone();
        async move {
            let (s,): (Option<String>,) =
                sqlx::query_as("SELECT provider_message_id FROM deliveries WHERE key = $1")
                    .bind(key)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            s
        }
    };
    // A looked up and found B's message: it either adopted it (wrong) or gave up on this
    // attempt without a decision (cannot tell).
    common::wait_for("A's lookup decided", Duration::from_secs(20), || async {
        count_where(
            &pool,
            &format!(
                "key = '{a}' AND (provider_message_id IS NOT NULL \
                 OR (state = 'retryable' AND attempts >= 2))"
            ),
        )
        .await
            == 1
    })
    .await;
    assert_ne!(
        sid_of(a).await.as_deref(),
        Some(theirs.as_str()),
        "A adopted its twin's message, whose attempt is still in flight"
    );
    let (b_state, b_sid): (String, Option<String>) =
        sqlx::query_as("SELECT state, provider_message_id FROM deliveries WHERE key = $1")
            .bind(b)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((b_state.as_str(), b_sid), ("sending", None), "B untouched");

    match ends {
        // B's worker gets its answer and records it, as `attempt` does (fenced on its lease).
        TwinEnds::Recorded => {
            let r = sqlx::query(
                "UPDATE delivery_state SET state = 'submitted', provider_message_id = $2, \
                 submitted_at = now(), next_poll_at = now() + interval '1 hour', \
                 last_error_class = NULL, uncertain_since = NULL, lease_owner = NULL, \
                 lease_expires_at = NULL \
                 WHERE id = (SELECT id FROM deliveries WHERE key = $1) AND state = 'sending' \
                 AND lease_owner = 'wOther' AND lease_token = 7",
            )
            .bind(b)
            .bind(&theirs)
            .execute(&pool)
            .await
            .unwrap();
            assert_eq!(r.rows_affected(), 1);
        }
        // B's worker is gone: its lease lapses (by hand) and w1's rescuer takes the row.
        TwinEnds::Rescued => {
            sqlx::query(
                "UPDATE delivery_state SET lease_expires_at = now() - interval '1 second' \
                 WHERE id = (SELECT id FROM deliveries WHERE key = $1)",
            )
            .bind(b)
            .execute(&pool)
            .await
            .unwrap();
        }
    }
    common::wait_for("both submitted", Duration::from_secs(20), || async {
        count_where(&pool, "state = 'submitted'").await == 2
    })
    .await;
    stop_tx.send(true).unwrap();
    w.await.unwrap().unwrap();

    // One message each on the shared phone: B's (adopted by one of them, or recorded by B) and
    // one more; no row owns another's.
    let sent: Vec<String> = fake
        .sms
        .lock()
        .unwrap()
        .iter()
        .filter(|m| m.to == phone)
        .map(|m| m.sid.clone())
        .collect();
    assert_eq!(sent.len(), 2, "{sent:?}");
    let (sid_a, sid_b) = (sid_of(a).await.unwrap(), sid_of(b).await.unwrap());
    assert_ne!(sid_a, sid_b, "two rows own one message");
    assert!(sent.contains(&sid_a) && sent.contains(&sid_b), "{sent:?}");
    if ends == TwinEnds::Recorded {
        assert_eq!(sid_b, theirs);
    }
    let (shared,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM (SELECT provider_message_id FROM deliveries \
         WHERE provider_message_id IS NOT NULL GROUP BY 1 HAVING count(*) > 1) s",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(shared, 0);
    // A held back at least once, saying why.
    let (held_back,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM delivery_transitions e JOIN deliveries d ON d.id = e.delivery_id \
         WHERE d.key = $1 AND e.from_state = 'sending' AND e.to_state = 'retryable' \
         AND e.detail LIKE '%in flight%cannot tell yet%'",
    )
    .bind(a)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(held_back >= 1);
    pool.close().await;
}
