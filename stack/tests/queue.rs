//! The queue on real PostgreSQL: concurrent claims, the lease fence, and the compare-and-set
//! function under mixed outcomes, duplicate and stale reports.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use sqlx::PgPool;
use stack::channels::{class, Outcome};
use stack::claim::{self, Claimed};
use stack::state::{transition, Fence, Source, State, Transition, Updates};

/// Inserts one batch of `n` LINE deliveries directly (no rendering needed here).
async fn seed(pool: &PgPool, batch: &str, n: i64) {
    sqlx::query("INSERT INTO batches (id, template_id, template_version, deliveries) VALUES ($1, 't', 1, $2)")
        .bind(batch)
        .bind(n as i32)
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "WITH items AS (INSERT INTO delivery_items (batch_id, key, recipient, channel, address, \
         template_version, payload, payload_sha256, correlation_id) \
         SELECT $1, $1 || ':r' || g || ':line', 'r' || g, 'line', 'U' || g, 1, \
         jsonb_build_object('text', 'hello ' || g), md5(g::text), $1 || '-' || g \
         FROM generate_series(1, $2) g RETURNING id) \
         INSERT INTO delivery_state (id) SELECT id FROM items",
    )
    .bind(batch)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// The lease of the claims whose expiry a test waits for: long enough that nothing checked while
/// it runs (a start, "nothing rescued yet") depends on the test process or the database being
/// scheduled in time; the test then ends it by hand with [`expire_leases`].
const LEASE: Duration = Duration::from_secs(60);

/// Ends every running lease now, as the passing of its time would (on the database's clock).
async fn expire_leases(pool: &PgPool) {
    sqlx::query(
        "UPDATE delivery_state SET lease_expires_at = now() - interval '1 millisecond' \
         WHERE state = 'sending'",
    )
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_concurrent_claimers_never_claim_a_row_twice() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed(&pool, "b", 20_000).await;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            let mut ids = Vec::new();
            loop {
                let rows = claim::claim(&mut conn, &format!("w{w}"), 37, Duration::from_secs(60))
                    .await
                    .unwrap();
                if rows.is_empty() {
                    return ids;
                }
                ids.extend(rows.iter().map(|r| r.id));
            }
        }));
    }
    let mut all = Vec::new();
    let mut busy = 0;
    for t in tasks {
        let ids = t.await.unwrap();
        busy += usize::from(!ids.is_empty());
        all.extend(ids);
    }
    let unique: HashSet<i64> = all.iter().copied().collect();
    assert_eq!(all.len(), 20_000, "every row claimed exactly once");
    assert_eq!(unique.len(), 20_000, "no row claimed twice");
    assert!(busy >= 2, "claims were actually concurrent");
    let (events,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM delivery_transitions WHERE to_state = 'sending'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(events, 20_000, "one recorded claim per row");
    pool.close().await;
}

/// The checker above can fail: the racy claim (a flaw) hands one row to two claimers.
#[tokio::test]
async fn racy_claim_hands_out_a_row_twice() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed(&pool, "b", 10).await;
    let mut a = pool.acquire().await.unwrap();
    let mut b = pool.acquire().await.unwrap();
    let first = claim::claim_racy(&mut a, "w1", 10, Duration::from_secs(60))
        .await
        .unwrap();
    // A second claimer that read the same ready rows before the first one wrote: replay its read.
    sqlx::query("UPDATE delivery_state SET state = 'pending'")
        .execute(&pool)
        .await
        .unwrap();
    let second = claim::claim_racy(&mut b, "w2", 10, Duration::from_secs(60))
        .await
        .unwrap();
    let overlap = first
        .iter()
        .filter(|r| second.iter().any(|s| s.id == r.id))
        .count();
    assert_eq!(overlap, 10);
    drop((a, b));
    pool.close().await;
}

#[tokio::test]
async fn lost_lease_blocks_the_attempt_start() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed(&pool, "b", 2).await;
    let mut conn = pool.acquire().await.unwrap();
    let rows = claim::claim(&mut conn, "w1", 2, LEASE).await.unwrap();
    assert_eq!(rows.len(), 2);
    // The lease runs for what was asked, counted from the claim.
    let (left,): (f64,) = sqlx::query_as(
        "SELECT extract(epoch FROM min(lease_expires_at) - now())::float8 FROM deliveries",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(left > 30.0 && left <= 60.0, "{left} s left on a 60 s lease");
    // With the lease still running, the start is recorded.
    assert_eq!(
        claim::start_attempt(&pool, &rows[0], Duration::ZERO)
            .await
            .unwrap(),
        Some(1)
    );
    // Like a worker frozen by SIGSTOP until the lease is over (on the database's clock).
    expire_leases(&pool).await;
    common::wait_for("lease expiry", Duration::from_secs(5), || async {
        let (expired,): (bool,) =
            sqlx::query_as("SELECT bool_and(lease_expires_at < now()) FROM deliveries")
                .fetch_one(&pool)
                .await
                .unwrap();
        expired
    })
    .await;
    assert_eq!(
        claim::start_attempt(&pool, &rows[1], Duration::ZERO)
            .await
            .unwrap(),
        None
    );
    // A renewal does not revive an expired lease.
    assert_eq!(
        claim::renew(
            &mut conn,
            "w1",
            Duration::from_secs(60),
            &[(rows[1].id, rows[1].lease_token)]
        )
        .await
        .unwrap(),
        Vec::<(i64, i64)>::new()
    );
    // A stale token is refused even with time left.
    let mut stale = rows[1].clone();
    stale.lease_token -= 1;
    sqlx::query("UPDATE delivery_state SET lease_expires_at = now() + interval '1 minute'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        claim::start_attempt(&pool, &stale, Duration::ZERO)
            .await
            .unwrap(),
        None
    );
    drop(conn);
    pool.close().await;
}

fn fenced<'a>(d: &Claimed, to: State, set: Updates) -> Transition<'a> {
    Transition {
        delivery_id: d.id,
        from: &[State::Sending],
        to,
        source: Source::Worker,
        detail: None,
        fence: Fence::Lease {
            owner: d.lease_owner.clone(),
            token: d.lease_token,
        },
        set,
    }
}

async fn state_of(pool: &PgPool, id: i64) -> (String, String, i32, i64) {
    sqlx::query_as(
        "SELECT state, payload_sha256, attempts, (SELECT count(*) FROM delivery_transitions WHERE delivery_id = $1) \
         FROM deliveries WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Replaces the seeded stand-in hashes with the payloads' real SHA-256, as the API stores them.
async fn real_hashes(pool: &PgPool) -> Vec<(i64, String)> {
    let rows: Vec<(i64, serde_json::Value)> =
        sqlx::query_as("SELECT id, payload FROM deliveries ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    let mut out = Vec::new();
    for (id, payload) in rows {
        let p: stack::render::Payload = serde_json::from_value(payload).unwrap();
        let sha = p.sha256();
        sqlx::query("UPDATE delivery_items SET payload_sha256 = $2 WHERE id = $1")
            .bind(id)
            .bind(&sha)
            .execute(pool)
            .await
            .unwrap();
        out.push((id, sha));
    }
    out
}

#[tokio::test]
async fn mixed_outcomes_only_the_transient_one_is_eligible_again() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed(&pool, "b", 3).await;
    let enqueued = real_hashes(&pool).await;
    let cfg = stack::Config::for_tests(&db.url);
    let mut conn = pool.acquire().await.unwrap();
    let rows = claim::claim(&mut conn, "w1", 3, Duration::from_secs(60))
        .await
        .unwrap();
    let outcomes = [
        Outcome::Accepted {
            provider_id: Some("m1".into()),
            done: true,
        },
        Outcome::Retry {
            class: class::TRANSIENT,
            error: "503 try later".into(),
            retry_after: None,
        },
        Outcome::Permanent {
            error: "400 bad user".into(),
        },
    ];
    let mut hashes = Vec::new();
    for (d, o) in rows.iter().zip(&outcomes) {
        let attempts = claim::start_attempt(&pool, d, Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        let mut dec = stack::worker::decide(&cfg, d, attempts, o, 0.5);
        dec.set.retry_in = dec.set.retry_in.map(|_| Duration::ZERO);
        assert!(transition(&mut conn, &fenced(d, dec.to, dec.set))
            .await
            .unwrap()
            .is_some());
        hashes.push(state_of(&pool, d.id).await.1);
    }
    let again = claim::claim(&mut conn, "w2", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(again.len(), 1, "only the transient one is claimable");
    assert_eq!(again[0].id, rows[1].id);
    // Same payload hash on the retry: the hash the claim hands back is the one written at
    // enqueue, the payload it hands back still hashes to it, and so does what the retry would
    // send (`payload_to_send` is what the worker sends).
    let at_enqueue = &enqueued.iter().find(|(id, _)| *id == rows[1].id).unwrap().1;
    assert_eq!(&hashes[1], at_enqueue, "the outcome did not touch the hash");
    assert_eq!(&again[0].payload_sha256, at_enqueue);
    assert_eq!(&again[0].payload.sha256(), at_enqueue);
    let retry_no = again[0].attempts + 1;
    let sent = stack::worker::payload_to_send(&cfg, &again[0], retry_no);
    assert_eq!(
        &sent.sha256(),
        at_enqueue,
        "the retry sends the stored payload"
    );
    // The same check sees a retry that re-renders.
    let mut rerender = cfg.clone();
    rerender.flaws = stack::config::Flaws::default().with(stack::config::Flaw::RerenderOnRetry);
    let sent = stack::worker::payload_to_send(&rerender, &again[0], retry_no);
    assert_ne!(&sent.sha256(), at_enqueue, "a re-render must not pass");
    assert_eq!(again[0].attempts, 1);
    assert_eq!(state_of(&pool, rows[0].id).await.0, "delivered");
    assert_eq!(state_of(&pool, rows[2].id).await.0, "permanent_failure");
    let (err,): (Option<String>,) =
        sqlx::query_as("SELECT last_error FROM deliveries WHERE id = $1")
            .bind(rows[2].id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        err.as_deref(),
        Some("400 bad user"),
        "the provider's own text is kept"
    );
    drop(conn);
    pool.close().await;
}

#[tokio::test]
async fn duplicate_and_stale_reports_change_nothing() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed(&pool, "b", 1).await;
    let mut conn = pool.acquire().await.unwrap();
    let d = claim::claim(&mut conn, "w1", 1, Duration::from_secs(60))
        .await
        .unwrap()
        .remove(0);
    let submitted = fenced(&d, State::Submitted, Updates::default());
    assert_eq!(
        transition(&mut conn, &submitted).await.unwrap(),
        Some(State::Sending)
    );
    let cb = |to| Transition {
        delivery_id: d.id,
        from: &[State::Sending, State::Submitted],
        to,
        source: Source::Callback,
        detail: None,
        fence: Fence::None,
        set: Updates::default(),
    };
    let events_before = state_of(&pool, d.id).await.3;
    assert_eq!(
        transition(&mut conn, &cb(State::Delivered)).await.unwrap(),
        Some(State::Submitted)
    );
    // The same callback again: acknowledged by the caller, no second transition.
    assert_eq!(
        transition(&mut conn, &cb(State::Delivered)).await.unwrap(),
        None
    );
    // A stale failure report after the terminal state: no regression.
    assert_eq!(
        transition(&mut conn, &cb(State::PermanentFailure))
            .await
            .unwrap(),
        None
    );
    let (state, _, _, events) = state_of(&pool, d.id).await;
    assert_eq!(state, "delivered");
    assert_eq!(events, events_before + 1, "exactly one transition recorded");
    // And an illegal edge is refused before touching the database.
    let bad = Transition {
        from: &[State::Delivered],
        to: State::Pending,
        ..cb(State::Pending)
    };
    assert!(transition(&mut conn, &bad).await.is_err());
    // The worker's own late outcome loses the compare-and-set too.
    assert_eq!(
        transition(&mut conn, &fenced(&d, State::Retryable, Updates::default()))
            .await
            .unwrap(),
        None
    );
    drop(conn);
    pool.close().await;
}

#[tokio::test]
async fn rescuer_reconciles_expired_leases_per_channel() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed_recipients(&pool, 3).await;
    let mut cfg = stack::Config::for_tests(&db.url);
    let mut conn = pool.acquire().await.unwrap();
    let rows = claim::claim(&mut conn, "dead", 10, LEASE).await.unwrap();
    assert_eq!(rows.len(), 9);
    // Recipient r1's attempts started (outcome lost; its e-mail's body had begun to go out);
    // r2's never did; r3's e-mail attempt started but died before its body (nothing committed).
    let started = |d: &&claim::Claimed| d.key.contains(":r1:") || d.key == "b:r3:email";
    for d in rows.iter().filter(started) {
        claim::start_attempt(&pool, d, Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
    }
    let r1_email = rows.iter().find(|d| d.key == "b:r1:email").unwrap();
    assert!(claim::mark_body(&pool, r1_email).await.unwrap());
    // Another rescuer holding the lock: this one stands aside.
    let mut other = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(1953066599)")
        .execute(&mut *other)
        .await
        .unwrap();
    assert!(!stack::rescuer::rescue_once(&pool, &cfg).await.unwrap().ran);
    other.rollback().await.unwrap();
    // Nothing is rescued before the lease is over.
    let r = stack::rescuer::rescue_once(&pool, &cfg).await.unwrap();
    assert!(r.ran);
    assert_eq!((r.released, r.resend, r.unknown, r.exhausted), (0, 0, 0, 0));
    expire_leases(&pool).await;
    common::wait_for("lease expiry", Duration::from_secs(5), || async {
        let (n,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM deliveries WHERE lease_expires_at < now()")
                .fetch_one(&pool)
                .await
                .unwrap();
        n == 9
    })
    .await;
    let r = stack::rescuer::rescue_once(&pool, &cfg).await.unwrap();
    assert_eq!((r.released, r.resend, r.unknown), (5, 3, 1));
    let got: Vec<(String, String, i32, Option<String>)> = sqlx::query_as(
        "SELECT key, state, attempts, last_error_class FROM deliveries ORDER BY key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let want = [
        ("b:r1:email", "unknown", 1, Some("ambiguous")),
        ("b:r1:line", "retryable", 1, Some("ambiguous")),
        ("b:r1:sms", "retryable", 1, Some("ambiguous")),
        ("b:r2:email", "pending", 0, None),
        ("b:r2:line", "pending", 0, None),
        ("b:r2:sms", "pending", 0, None),
        ("b:r3:email", "retryable", 1, None),
        ("b:r3:line", "pending", 0, None),
        ("b:r3:sms", "pending", 0, None),
    ];
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert_eq!((g.0.as_str(), g.1.as_str(), g.2, g.3.as_deref()), w);
    }
    // The dead worker's late outcome loses.
    let late = rows.iter().find(|d| d.key == "b:r1:line").unwrap();
    assert!(transition(
        &mut conn,
        &fenced(late, State::Delivered, Updates::default())
    )
    .await
    .unwrap()
    .is_none());
    // E-mail policy: hold keeps it; resend (after the horizon) hands it back.
    assert_eq!(
        stack::rescuer::rescue_once(&pool, &cfg)
            .await
            .unwrap()
            .policy,
        0
    );
    cfg.email_unknown_policy = stack::config::UnknownPolicy::Resend;
    cfg.reconcile_horizon = Duration::ZERO;
    common::wait_for("policy resend", Duration::from_secs(5), || async {
        stack::rescuer::rescue_once(&pool, &cfg)
            .await
            .unwrap()
            .policy
            == 1
    })
    .await;
    let (state,): (String,) =
        sqlx::query_as("SELECT state FROM deliveries WHERE key = 'b:r1:email'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(state, "retryable");
    drop(conn);
    pool.close().await;
}

/// A start taken back (the worker stalled past its local deadline after the fence) and left
/// unreleased (the worker died, or its database connection did, before the release) is released
/// by the rescuer like a claim that never started — and it must not break the rescue pass for
/// every other row, as it once did (`started` read NULL and failed to decode).
#[tokio::test]
async fn rescuer_releases_a_start_that_was_taken_back() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed(&pool, "b", 2).await;
    let cfg = stack::Config::for_tests(&db.url);
    let mut conn = pool.acquire().await.unwrap();
    let rows = claim::claim(&mut conn, "stalled", 2, LEASE).await.unwrap();
    assert_eq!(rows.len(), 2);
    for d in &rows {
        claim::start_attempt(&pool, d, Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
    }
    // Only the first one's start is taken back; the second really went out.
    assert!(claim::undo_start(&pool, &rows[0]).await.unwrap());
    assert!(
        !claim::undo_start(&pool, &rows[0]).await.unwrap(),
        "undo twice"
    );
    expire_leases(&pool).await;
    common::wait_for("lease expiry", Duration::from_secs(5), || async {
        let (n,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM deliveries WHERE lease_expires_at < now()")
                .fetch_one(&pool)
                .await
                .unwrap();
        n == 2
    })
    .await;
    let r = stack::rescuer::rescue_once(&pool, &cfg).await.unwrap();
    assert_eq!((r.released, r.resend), (1, 1));
    let (s0, _, a0, _) = state_of(&pool, rows[0].id).await;
    assert_eq!((s0.as_str(), a0), ("pending", 0));
    let (s1, _, a1, _) = state_of(&pool, rows[1].id).await;
    assert_eq!((s1.as_str(), a1), ("retryable", 1));
    drop(conn);
    pool.close().await;
}

/// PostgreSQL's plan cache settles on the claim's generic plan (the batch size is in the
/// statement's text: with `LIMIT $n` it planned the claim afresh on every call), and that plan does
/// not depend on the planner's guesses: it once hash-joined the picked rows against a sequential
/// scan of the whole table, and, joining the items by `id = ANY(…)`, re-read every claimed row's
/// item once per claimed row (100 × 100 lookups for a claim of 100). Judged on what the plan did:
/// no sequential scan, and each claimed row's item read once.
#[tokio::test]
async fn the_claim_runs_one_generic_plan_that_reads_each_claimed_row_once() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed(&pool, "b", 12_000).await;
    sqlx::query("ANALYZE delivery_items, delivery_state")
        .execute(&pool)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    for batch in [1, 100] {
        for _ in 0..8 {
            let got = claim::claim(&mut conn, "w", batch, LEASE).await.unwrap();
            assert_eq!(got.len(), batch as usize);
        }
        let (generic, custom): (i64, i64) = sqlx::query_as(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1",
        )
        .bind(claim::for_batch(claim::CLAIM_SQL, batch))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        assert!(
            custom <= 5 && generic >= 3,
            "batch {batch}: {custom} custom plans, {generic} generic"
        );
    }
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    for batch in [1, 100] {
        sqlx::query(&format!(
            "PREPARE claim_plan_{batch}(text, float8) AS {}",
            claim::for_batch(claim::CLAIM_SQL, batch)
        ))
        .execute(&mut *conn)
        .await
        .unwrap();
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        let (plan,): (sqlx::types::Json<serde_json::Value>,) = sqlx::query_as(&format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim_plan_{batch}('w', 60000)"
        ))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        tx.rollback().await.unwrap();
        let mut nodes = Vec::new();
        plan_nodes(&plan.0[0]["Plan"], &mut nodes);
        let shown = serde_json::to_string_pretty(&plan.0).unwrap();
        assert!(
            !nodes.iter().any(|n| n["Node Type"] == "Seq Scan"),
            "batch {batch}: a sequential scan\n{shown}"
        );
        let items_read: f64 = nodes
            .iter()
            .filter(|n| n["Relation Name"] == "delivery_items")
            .map(|n| n["Actual Rows"].as_f64().unwrap() * n["Actual Loops"].as_f64().unwrap())
            .sum();
        assert_eq!(items_read, batch as f64, "batch {batch}:\n{shown}");
        let removed: f64 = nodes
            .iter()
            .filter_map(|n| n["Rows Removed by Join Filter"].as_f64())
            .sum();
        assert_eq!(
            removed, 0.0,
            "batch {batch}: rows joined then thrown away\n{shown}"
        );
    }
}

/// Every node of an `EXPLAIN (FORMAT JSON)` plan, `node` first.
fn plan_nodes<'a>(node: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
    out.push(node);
    for child in node["Plans"].as_array().into_iter().flatten() {
        plan_nodes(child, out);
    }
}

/// Giving back an unstarted claim (worker or rescuer) never undoes a start: the `Unstarted`
/// fence is checked on the row as it is when locked.
#[tokio::test]
async fn an_unstarted_give_back_loses_to_a_start() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed(&pool, "b", 2).await;
    let mut conn = pool.acquire().await.unwrap();
    let rows = claim::claim(&mut conn, "w1", 2, Duration::from_secs(60))
        .await
        .unwrap();
    claim::start_attempt(&pool, &rows[0], Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    let give_back = |d: &Claimed| Transition {
        delivery_id: d.id,
        from: &[State::Sending],
        to: State::Pending,
        source: Source::Rescuer,
        detail: None,
        fence: Fence::Unstarted {
            owner: d.lease_owner.clone(),
            token: d.lease_token,
        },
        set: Updates::default(),
    };
    assert_eq!(
        transition(&mut conn, &give_back(&rows[0])).await.unwrap(),
        None
    );
    assert_eq!(
        transition(&mut conn, &give_back(&rows[1])).await.unwrap(),
        Some(State::Sending)
    );
    assert_eq!(state_of(&pool, rows[0].id).await.0, "sending");
    assert_eq!(state_of(&pool, rows[1].id).await.0, "pending");
    drop(conn);
    pool.close().await;
}

/// A transition that has to wait for a row another session is changing is judged on the row as
/// that session committed it. From one state (no row lock first: PostgreSQL re-checks the
/// update's `WHERE`): a worker's outcome that waited behind a rescue loses, one that waited behind
/// a lease renewal wins. From several states (row locked first): a report that waited behind the
/// worker's own `sending → submitted` applies, and its event says it left `submitted`.
#[tokio::test]
async fn a_transition_that_waited_is_judged_on_the_committed_row() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed(&pool, "b", 3).await;
    let mut conn = pool.acquire().await.unwrap();
    let rows = claim::claim(&mut conn, "w1", 3, Duration::from_secs(60))
        .await
        .unwrap();
    const REPORT_FROM: &[State] = &[State::Sending, State::Submitted, State::Unknown];
    // (concurrent change, the transition's from states, what it returns, the state after)
    let cases: [(&str, &'static [State], Option<State>, &str); 3] = [
        (
            "UPDATE delivery_state SET state = 'retryable', lease_owner = NULL WHERE id = $1",
            &[State::Sending],
            None,
            "retryable",
        ),
        (
            "UPDATE delivery_state SET lease_expires_at = now() + interval '2 minutes' WHERE id = $1",
            &[State::Sending],
            Some(State::Sending),
            "delivered",
        ),
        (
            "UPDATE delivery_state SET state = 'submitted' WHERE id = $1",
            REPORT_FROM,
            Some(State::Submitted),
            "delivered",
        ),
    ];
    for (d, (change, from, want, after)) in rows.iter().zip(cases) {
        let mut other = pool.begin().await.unwrap();
        sqlx::query(change)
            .bind(d.id)
            .execute(&mut *other)
            .await
            .unwrap();
        let waiting = {
            let pool = pool.clone();
            let mut t = fenced(d, State::Delivered, Updates::default());
            if from.len() > 1 {
                t = Transition {
                    from,
                    source: Source::Callback,
                    fence: Fence::None,
                    ..t
                };
            }
            tokio::spawn(async move {
                let mut c = pool.acquire().await.unwrap();
                transition(&mut c, &t).await.unwrap()
            })
        };
        common::wait_for(
            "the transition waiting for the row",
            Duration::from_secs(20),
            || async {
                let (n,): (i64,) = sqlx::query_as(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                     AND query LIKE '%UPDATE delivery_state d SET%'",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                n == 1
            },
        )
        .await;
        other.commit().await.unwrap();
        assert_eq!(waiting.await.unwrap(), want, "{change}");
        assert_eq!(state_of(&pool, d.id).await.0, after, "{change}");
        let left: Vec<(String,)> = sqlx::query_as(
            "SELECT from_state FROM delivery_transitions WHERE delivery_id = $1 AND to_state = 'delivered'",
        )
        .bind(d.id)
        .fetch_all(&pool)
        .await
        .unwrap();
        let want_left: Vec<(String,)> = want.iter().map(|s| (s.to_string(),)).collect();
        assert_eq!(left, want_left, "{change}");
    }
    drop(conn);
    pool.close().await;
}

/// The attempt start changes no indexed column of the narrow `delivery_state` row and its page
/// has room (fillfactor), so PostgreSQL updates it in place: no index entry, a small WAL record.
/// And it locks nothing before it writes: a BEFORE ROW UPDATE trigger on `delivery_state` would
/// make PostgreSQL lock each row first, one heap LOCK WAL record per attempt start, body mark,
/// renewal and outcome (`migrations/0008_history_after_the_update.sql`). A HOT update never needs
/// a page of its own, the one other reason an update logs a lock.
#[tokio::test]
async fn the_attempt_start_is_a_hot_update_that_locks_nothing() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed(&pool, "b", 20).await;
    let mut conn = pool.acquire().await.unwrap();
    let rows = claim::claim(&mut conn, "w1", 20, Duration::from_secs(60))
        .await
        .unwrap();
    sqlx::query("CREATE EXTENSION pg_walinspect")
        .execute(&pool)
        .await
        .unwrap();
    let (from,): (String,) = sqlx::query_as("SELECT pg_current_wal_insert_lsn()::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    for d in &rows {
        assert!(claim::start_attempt(&mut *tx, d, Duration::ZERO)
            .await
            .unwrap()
            .is_some());
    }
    let (updated, hot): (i64, i64) = sqlx::query_as(
        "SELECT pg_stat_get_xact_tuples_updated('delivery_state'::regclass), \
         pg_stat_get_xact_tuples_hot_updated('delivery_state'::regclass)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!((updated, hot), (20, 20), "every attempt start is HOT");
    // The cluster is shared with other tests: only records on this database's `delivery_state`.
    let records: Vec<(String, i64)> = sqlx::query_as(
        "SELECT resource_manager || ' ' || record_type, count(*) \
         FROM pg_get_wal_records_info($1::pg_lsn, pg_current_wal_flush_lsn()) \
         WHERE resource_manager = 'Heap' AND block_ref LIKE '%rel %/' || \
           (SELECT oid FROM pg_database WHERE datname = current_database()) || '/' || \
           pg_relation_filenode('delivery_state') || ' %' \
         GROUP BY 1 ORDER BY 1",
    )
    .bind(&from)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        records,
        [("Heap HOT_UPDATE".to_string(), 20)],
        "20 attempt starts and no row lock"
    );
    drop(conn);
    pool.close().await;
}

/// The claim is the one state change outside `transition`; it must still never take a row that
/// is not `pending` or `retryable`, terminal rows above all, however due they look.
#[tokio::test]
async fn the_claim_never_takes_a_row_out_of_any_other_state() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed(&pool, "b", State::ALL.len() as i64).await;
    let ids: Vec<(i64,)> = sqlx::query_as("SELECT id FROM deliveries ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    for ((id,), st) in ids.iter().zip(State::ALL) {
        sqlx::query(
            "UPDATE delivery_state SET state = $2, next_attempt_at = now() - interval '1 hour' \
             WHERE id = $1",
        )
        .bind(id)
        .bind(st.as_str())
        .execute(&pool)
        .await
        .unwrap();
    }
    let mut conn = pool.acquire().await.unwrap();
    let got = claim::claim(&mut conn, "w1", 100, Duration::from_secs(60))
        .await
        .unwrap();
    let mut took: Vec<State> = got.iter().map(|d| d.from_state).collect();
    took.sort();
    assert_eq!(took, [State::Pending, State::Retryable]);
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM deliveries GROUP BY state ORDER BY state")
            .fetch_all(&pool)
            .await
            .unwrap();
    for (st, n) in states {
        let want = match st.as_str() {
            "sending" => 3,
            "pending" | "retryable" => 0,
            _ => 1,
        };
        assert_eq!(n, want, "{st}");
    }
    let (claims,): (i64,) = sqlx::query_as("SELECT count(*) FROM delivery_transitions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        claims, 2,
        "one transition per claimed row, none for the others"
    );
    let (events,): (i64,) = sqlx::query_as("SELECT count(*) FROM delivery_events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        events, 0,
        "a claim writes no event row until its attempt ends"
    );
    drop(conn);
    pool.close().await;
}

/// Inserts, for recipients r1..=n, one delivery per channel (batch `b`).
async fn seed_recipients(pool: &PgPool, n: i64) {
    seed(pool, "b", 0).await;
    sqlx::query(
        "WITH items AS (INSERT INTO delivery_items (batch_id, key, recipient, channel, address, \
         template_version, payload, payload_sha256, correlation_id) \
         SELECT 'b', 'b:r' || g || ':' || c, 'r' || g, c, 'a' || g, 1, '{\"text\": \"hi\"}'::jsonb, 'h', \
         c || g FROM generate_series(1, $1) g, unnest(ARRAY['line', 'email', 'sms']) c RETURNING id) \
         INSERT INTO delivery_state (id) SELECT id FROM items",
    )
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// A rescue never hands back for a resend what the attempt cap or the age cap forbid: such a
/// LINE or SMS attempt lost mid-way ends `failed`, saying its outcome is unknown; the e-mail
/// policy resend respects both caps too. The last allowed attempt, lost mid-way, is still
/// reconciled (it may have landed): handed back as ambiguous, not failed unseen.
#[tokio::test]
async fn rescuer_resends_respect_the_attempt_and_age_caps() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed_recipients(&pool, 4).await;
    let mut cfg = stack::Config::for_tests(&db.url);
    cfg.max_attempts = 2;
    cfg.max_age = Duration::from_secs(3600);
    // r1: past the age cap (one attempt made); r2: past the attempt cap (a reconciling attempt
    // beyond it lost too); r3: neither; r4: its last allowed attempt lost.
    sqlx::query(
        "UPDATE delivery_items SET created_at = now() - interval '2 hours' WHERE recipient = 'r1'",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE delivery_state SET attempts = 2, state = 'retryable' \
         WHERE id IN (SELECT id FROM deliveries WHERE recipient = 'r2')",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE delivery_state SET attempts = 1, state = 'retryable' \
         WHERE id IN (SELECT id FROM deliveries WHERE recipient = 'r4')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let rows = claim::claim(&mut conn, "dead", 20, LEASE).await.unwrap();
    assert_eq!(rows.len(), 12);
    for d in &rows {
        claim::start_attempt(&pool, d, Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        // Every e-mail's body had begun to go out: its outcome is unknown.
        if d.key.ends_with(":email") {
            assert!(claim::mark_body(&pool, d).await.unwrap());
        }
    }
    expire_leases(&pool).await;
    common::wait_for("lease expiry", Duration::from_secs(5), || async {
        let (n,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM deliveries WHERE lease_expires_at < now()")
                .fetch_one(&pool)
                .await
                .unwrap();
        n == 12
    })
    .await;
    let r = stack::rescuer::rescue_once(&pool, &cfg).await.unwrap();
    assert_eq!((r.exhausted, r.resend, r.unknown, r.released), (4, 4, 4, 0));
    type Row = (String, String, i32, Option<String>, Option<String>);
    let got: Vec<Row> = sqlx::query_as(
        "SELECT key, state, attempts, last_error_class, last_error FROM deliveries ORDER BY key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let want = [
        ("b:r1:email", "unknown", 1),
        ("b:r1:line", "failed", 1),
        ("b:r1:sms", "failed", 1),
        ("b:r2:email", "unknown", 3),
        ("b:r2:line", "failed", 3),
        ("b:r2:sms", "failed", 3),
        ("b:r3:email", "unknown", 1),
        ("b:r3:line", "retryable", 1),
        ("b:r3:sms", "retryable", 1),
        ("b:r4:email", "unknown", 2),
        ("b:r4:line", "retryable", 2),
        ("b:r4:sms", "retryable", 2),
    ];
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert_eq!((g.0.as_str(), g.1.as_str(), g.2), w);
        if g.1 == "failed" {
            assert_eq!(g.3.as_deref(), Some("exhausted"), "{g:?}");
            let text = g.4.as_deref().unwrap_or("");
            assert!(text.contains("outcome unknown; not resent"), "{text}");
            let cap = if g.0.contains(":r1:") {
                "age cap"
            } else {
                "max 2"
            };
            assert!(text.contains(cap), "{text}");
        }
    }
    // Each lost attempt is counted once, as ambiguous, on the event that left `sending`.
    let (lost,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM delivery_transitions WHERE source = 'rescuer' AND outcome_class = 'ambiguous'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(lost, 12);
    // The e-mail policy resend: only r3's e-mail may go again.
    cfg.email_unknown_policy = stack::config::UnknownPolicy::Resend;
    cfg.reconcile_horizon = Duration::ZERO;
    common::wait_for("policy pass", Duration::from_secs(5), || async {
        stack::rescuer::rescue_once(&pool, &cfg)
            .await
            .unwrap()
            .policy
            == 4
    })
    .await;
    let emails: Vec<(String, String)> =
        sqlx::query_as("SELECT key, state FROM deliveries WHERE channel = 'email' ORDER BY key")
            .fetch_all(&pool)
            .await
            .unwrap();
    let emails: Vec<(&str, &str)> = emails
        .iter()
        .map(|(k, s)| (k.as_str(), s.as_str()))
        .collect();
    assert_eq!(
        emails,
        [
            ("b:r1:email", "failed"),
            ("b:r2:email", "failed"),
            ("b:r3:email", "retryable"),
            ("b:r4:email", "failed")
        ]
    );
    drop(conn);
    pool.close().await;
}

/// An SMS still `submitted` when the reconciliation horizon has passed is not left there for
/// ever: it becomes `unknown` (by poll, with an event), is never resent by the e-mail policy,
/// and a late report still settles it.
#[tokio::test]
async fn sms_past_the_poll_horizon_becomes_unknown_with_an_event() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed_recipients(&pool, 2).await;
    let mut cfg = stack::Config::for_tests(&db.url);
    cfg.reconcile_horizon = Duration::from_secs(600);
    let mut conn = pool.acquire().await.unwrap();
    let rows = claim::claim(&mut conn, "w1", 20, Duration::from_secs(60))
        .await
        .unwrap();
    for d in rows.iter().filter(|d| d.key.ends_with(":sms")) {
        let set = Updates {
            provider_message_id: Some(format!("SM-{}", d.id)),
            ..Updates::default()
        };
        assert!(transition(&mut conn, &fenced(d, State::Submitted, set))
            .await
            .unwrap()
            .is_some());
    }
    // r1's SMS was accepted long ago and never heard of again; r2's just now.
    sqlx::query(
        "UPDATE delivery_state SET submitted_at = now() - interval '11 minutes' \
         WHERE id = (SELECT id FROM deliveries WHERE key = 'b:r1:sms')",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(
        stack::rescuer::settle_unconfirmed_sms(&pool, &cfg)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        stack::rescuer::settle_unconfirmed_sms(&pool, &cfg)
            .await
            .unwrap(),
        0
    );
    let (state, class, error): (String, Option<String>, Option<String>) = sqlx::query_as(
        "SELECT state, last_error_class, last_error FROM deliveries WHERE key = 'b:r1:sms'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(state, "unknown");
    assert_eq!(class.as_deref(), Some("ambiguous"));
    assert!(error.unwrap_or_default().contains("no final status"));
    let (source, detail): (String, Option<String>) = sqlx::query_as(
        "SELECT e.source, e.detail FROM delivery_transitions e JOIN deliveries d ON d.id = e.delivery_id \
         WHERE d.key = 'b:r1:sms' AND e.to_state = 'unknown'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(source, "poll");
    assert!(detail
        .unwrap_or_default()
        .contains("reconciliation horizon"));
    let (r2,): (String,) = sqlx::query_as("SELECT state FROM deliveries WHERE key = 'b:r2:sms'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(r2, "submitted");
    // The e-mail unknown policy never resends an SMS.
    cfg.email_unknown_policy = stack::config::UnknownPolicy::Resend;
    cfg.reconcile_horizon = Duration::ZERO;
    assert_eq!(
        stack::rescuer::rescue_once(&pool, &cfg)
            .await
            .unwrap()
            .policy,
        0
    );
    // A late report still resolves it.
    let id = rows.iter().find(|d| d.key == "b:r1:sms").unwrap().id;
    let late = Transition {
        delivery_id: id,
        from: &[State::Sending, State::Submitted, State::Unknown],
        to: State::Delivered,
        source: Source::Callback,
        detail: None,
        fence: Fence::None,
        set: Updates::default(),
    };
    assert_eq!(
        transition(&mut conn, &late).await.unwrap(),
        Some(State::Unknown)
    );
    drop(conn);
    pool.close().await;
}

/// A status poll that was under way when the reconciliation horizon settled its row as
/// `unknown` still records the final status it fetched: its answer is not thrown away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_under_way_at_the_horizon_still_records_its_answer() {
    use std::sync::atomic::Ordering;
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed_recipients(&pool, 1).await;
    let (fake, fakes) = common::start_fakes().await;
    let mut cfg = stack::Config::for_tests(&db.url);
    cfg.sms_api_base = fakes;
    cfg.reconcile_horizon = Duration::from_secs(600);
    let cfg = std::sync::Arc::new(cfg);
    let sid = fake.inject_sms("a1", "hi", chrono::Utc::now());
    let mut conn = pool.acquire().await.unwrap();
    let rows = claim::claim(&mut conn, "w1", 20, LEASE).await.unwrap();
    let d = rows.iter().find(|d| d.key == "b:r1:sms").unwrap();
    let set = Updates {
        provider_message_id: Some(sid.clone()),
        ..Updates::default()
    };
    assert!(transition(&mut conn, &fenced(d, State::Submitted, set))
        .await
        .unwrap()
        .is_some());
    // Due for a poll, one second inside the horizon.
    sqlx::query(
        "UPDATE delivery_state SET next_poll_at = now(), \
         submitted_at = now() - interval '599 seconds' \
         WHERE id = (SELECT id FROM deliveries WHERE key = 'b:r1:sms')",
    )
    .execute(&pool)
    .await
    .unwrap();
    fake.sms_fetch_hold.store(true, Ordering::SeqCst);
    let client = stack::channels::sms::SmsClient::new(reqwest::Client::new(), cfg.clone());
    let (p, c) = (pool.clone(), cfg.clone());
    let poll = tokio::spawn(async move { stack::rescuer::poll_sms_once(&p, &c, &client).await });
    common::wait_for(
        "the poll's fetch in flight",
        Duration::from_secs(20),
        || async { fake.sms_fetches.load(Ordering::SeqCst) >= 1 },
    )
    .await;
    // Meanwhile the horizon passes and the row is settled as unknown.
    sqlx::query(
        "UPDATE delivery_state SET submitted_at = now() - interval '601 seconds' \
         WHERE id = (SELECT id FROM deliveries WHERE key = 'b:r1:sms')",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(
        stack::rescuer::settle_unconfirmed_sms(&pool, &cfg)
            .await
            .unwrap(),
        1
    );
    fake.sms_fetch_hold.store(false, Ordering::SeqCst);
    assert_eq!(poll.await.unwrap().unwrap(), 1);
    let (state,): (String,) = sqlx::query_as("SELECT state FROM deliveries WHERE key = 'b:r1:sms'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(state, "delivered");
    let (from, source): (String, String) = sqlx::query_as(
        "SELECT e.from_state, e.source FROM delivery_transitions e JOIN deliveries d \
         ON d.id = e.delivery_id WHERE d.key = 'b:r1:sms' AND e.to_state = 'delivered'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((from.as_str(), source.as_str()), ("unknown", "poll"));
    drop(conn);
    pool.close().await;
}

/// The latest transition lives on the row until the next one moves it into `delivery_events`.
/// A state change that writes no transition of its own (what the flaws that bypass the state
/// machine do) still moves it, with the state it led to, and clears it: the history never reads
/// a transition as leading to a state it did not lead to, and never holds one twice.
#[tokio::test]
async fn a_bypassing_state_change_moves_the_latest_transition_once() {
    let db = common::fresh_db().await;
    let pool = common::pool(&db.url).await;
    seed(&pool, "b", 1).await;
    let mut conn = pool.acquire().await.unwrap();
    let d = claim::claim(&mut conn, "w1", 1, LEASE)
        .await
        .unwrap()
        .remove(0);
    let done = Transition {
        delivery_id: d.id,
        from: &[State::Sending],
        to: State::Delivered,
        source: Source::Worker,
        detail: Some("attempt 1 accepted".into()),
        fence: Fence::Lease {
            owner: "w1".into(),
            token: d.lease_token,
        },
        set: Updates::default(),
    };
    assert_eq!(
        transition(&mut conn, &done).await.unwrap(),
        Some(State::Sending)
    );
    let edges = || async {
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT from_state, to_state, source FROM delivery_transitions \
             ORDER BY event_id NULLS LAST, part",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        rows.into_iter()
            .map(|(f, t, s)| format!("{f}>{t} {s}"))
            .collect::<Vec<_>>()
    };
    let ended = ["pending>sending worker", "sending>delivered worker"];
    assert_eq!(edges().await, ended);
    let events = || async {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM delivery_events")
            .fetch_one(&pool)
            .await
            .unwrap();
        n
    };
    assert_eq!(events().await, 0, "the one attempt is on the row");
    // As `restart-from-first` does: back to pending, bypassing the state machine.
    sqlx::query("UPDATE delivery_state SET state = 'pending', lease_owner = NULL")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(edges().await, ended, "moved, still leading to delivered");
    assert_eq!(events().await, 1);
    let again = claim::claim(&mut conn, "w2", 1, LEASE).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        edges().await,
        [&ended[..], &["pending>sending worker"]].concat()
    );
    assert_eq!(events().await, 1, "the claim found no head to move again");
    drop(conn);
    pool.close().await;
}
