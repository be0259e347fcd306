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
    cfg.lease = Duration::from_millis(1000);
    cfg.heartbeat = Duration::from_millis(100);
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

    // Worker A: every send commits at the provider and then never answers.
    fake.hang.store(true, Ordering::SeqCst);
    let (_never, stop_a) = common::shutdown_pair();
    let mut cfg_a = worker_cfg(&db.url, &fakes, &api, "wA");
    cfg_a.flaws = flaws.clone();
    let a = tokio::spawn(stack::worker::run(cfg_a, stop_a));
    common::wait_for("A mid-batch", Duration::from_secs(20), || async {
        fake.hanging.load(Ordering::SeqCst) >= 4
            && count_where(&pool, "state = 'sending'").await >= 8
    })
    .await;
    // Kill A: no cleanup code runs (its tasks are dropped with it).
    a.abort();
    assert!(a.await.unwrap_err().is_cancelled());
    let started_by_a = count_where(
        &pool,
        "state = 'sending' AND attempt_lease_token = lease_token",
    )
    .await;
    let unstarted_by_a =
        count_where(&pool, "state = 'sending' AND attempt_lease_token IS NULL").await;
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
    let (rescued,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM delivery_events WHERE source = 'rescuer'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        rescued,
        started_by_a + unstarted_by_a,
        "every row A held was rescued"
    );
    // Rows A never started went back without an attempt counted.
    let (never_started_attempts,): (Option<i64>,) = sqlx::query_as(
        "SELECT max(attempts)::bigint FROM deliveries d WHERE EXISTS (SELECT 1 FROM delivery_events e \
         WHERE e.delivery_id = d.id AND e.source = 'rescuer' AND e.to_state = 'pending')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(never_started_attempts.unwrap_or(1), 1);
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
        "SELECT count(*) FROM delivery_events WHERE detail = 'released on shutdown before start'",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn email_outcomes_are_classified_and_resends_are_byte_identical() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    let (_fake, fakes) = common::start_fakes().await;
    let (smtp, smtp_addr) = common::start_smtp().await;
    let (api, _stop_api, _h) = common::start_api(&stack::Config::for_tests(&db.url)).await;
    let mut body = common::batch_body("mail", 4, &["email"]);
    body["recipients"][1]["email"] = serde_json::json!("bad@example.test");
    body["recipients"][2]["email"] = serde_json::json!("flaky@example.test");
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
        count_where(&pool, "state IN ('submitted', 'permanent_failure')").await == 4
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
    assert_eq!(smtp.accepted.lock().unwrap().len(), 3);
    pool.close().await;
}
