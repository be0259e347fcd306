//! The load as a client of a stack whose batch endpoint fails: a tiny axum server answers each
//! `POST /v1/batches` from a script (per attempt), and records what it was sent and when.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::post;
use axum::Router;

use super::super::{enqueue, Plan, Poster, Recipient};

/// One scripted answer: status, and `Retry-After` (seconds) when given.
type Scripted = (u16, Option<u64>);

/// What the server shares with its handler: what it saw, and its script.
type Shared = (Arc<Mutex<Seen>>, Arc<Vec<Scripted>>);

/// The server's view: every batch id it was sent, and when.
#[derive(Default)]
struct Seen {
    posts: Vec<(String, Instant)>,
}

/// Serves `script` (the n-th POST gets the n-th answer; past its end, the last one) on port 0;
/// returns the API base and what the server saw.
async fn serve(script: Vec<Scripted>) -> (String, Arc<Mutex<Seen>>) {
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let state = (seen.clone(), Arc::new(script));
    let app =
        Router::new().route(
            "/v1/batches",
            post(
                |axum::extract::State((seen, script)): axum::extract::State<Shared>,
                 body: String| async move {
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let n = {
                        let mut s = seen.lock().unwrap();
                        s.posts
                            .push((v["batch_id"].as_str().unwrap().to_string(), Instant::now()));
                        s.posts.len()
                    };
                    let (status, retry_after) = script[(n - 1).min(script.len() - 1)];
                    let mut headers = HeaderMap::new();
                    if let Some(s) = retry_after {
                        headers.insert("retry-after", HeaderValue::from(s));
                    }
                    let body = if status == 202 {
                        format!(r#"{{"batch_id":{},"deliveries":3}}"#, v["batch_id"])
                    } else {
                        r#"{"error":"database error"}"#.to_string()
                    };
                    (StatusCode::from_u16(status).unwrap(), headers, body)
                },
            ),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app.with_state(state)).await });
    (format!("http://{addr}"), seen)
}

fn scenario() -> crate::scenario::Scenario {
    let toml = "name = \"retry-test\"\n[load]\nrecipients = 1\nchannels = [\"line\", \"email\", \"sms\"]\n";
    crate::scenario::parse(std::path::Path::new("t.toml"), toml).unwrap()
}

fn one_recipient() -> Vec<Recipient> {
    vec![Recipient {
        id: "r000001".into(),
        name: "Ana".into(),
        line_user_id: "U1".into(),
        email: "r000001@example.test".into(),
        phone: "+15550000001".into(),
        vars: Default::default(),
        tricky: false,
    }]
}

async fn poster(base: &str, retry_for: Duration) -> (Poster, crate::scenario::Scenario) {
    let scenario = scenario();
    let start = Instant::now();
    let clock: super::super::Clock = Arc::new(move || start.elapsed().as_nanos() as u64);
    let mut poster = Poster::new(&scenario, base, clock);
    poster.retry_for = retry_for;
    (poster, scenario)
}

#[tokio::test]
async fn a_transient_failure_is_retried_with_the_same_batch_id_and_recorded() {
    // A 500, then a shed (503 with Retry-After: 1), then accepted.
    let (base, seen) = serve(vec![(500, None), (503, Some(1)), (202, None)]).await;
    let (poster, scenario) = poster(&base, super::super::RETRY_FOR).await;
    let people = one_recipient();
    let plan = Plan::new(&scenario, people.len());
    let out = enqueue(&poster, &people, &plan)
        .await
        .expect("not an error");
    let seen = seen.lock().unwrap();
    let ids: Vec<&str> = seen.posts.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids,
        [plan.batches[0].0.as_str(); 3],
        "same batch_id each time"
    );
    let f = &out.failures;
    let statuses: Vec<Option<u16>> = f.attempts.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [Some(500), Some(503)]);
    assert!(!f.attempts[0].shed() && f.attempts[1].shed(), "{f:#?}");
    assert_eq!(f.attempts[1].retry_after_s, Some(1));
    assert!(f.not_accepted.is_empty(), "{f:#?}");
    // The Retry-After was honoured: the third POST came at least a second after the second.
    let gap = seen.posts[2].1 - seen.posts[1].1;
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}");
    assert_eq!(out.batches.len(), 1, "the batch was accepted");
    // The client's latency runs from the first attempt to the accepted answer.
    let first_to_last = seen.posts[2].1 - seen.posts[0].1;
    assert!(out.latency_us.max() >= first_to_last.as_micros() as u64);
}

#[tokio::test]
async fn a_batch_never_accepted_is_recorded_not_an_error() {
    let (base, seen) = serve(vec![(500, None)]).await;
    let (poster, scenario) = poster(&base, Duration::from_millis(700)).await;
    let people = one_recipient();
    let plan = Plan::new(&scenario, people.len());
    let out = enqueue(&poster, &people, &plan)
        .await
        .expect("not an error");
    let posts = seen.lock().unwrap().posts.len();
    // 200 ms, then 400 ms of backoff fit in 700 ms: three attempts, two on a slow machine.
    assert!((2..=3).contains(&posts), "{posts} attempts");
    assert_eq!(out.failures.attempts.len(), posts);
    let gone = &out.failures.not_accepted;
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].batch_id, plan.batches[0].0);
    assert_eq!((gone[0].attempts as usize, gone[0].deliveries), (posts, 3));
    assert!(gone[0].last_error.contains("HTTP 500"), "{gone:?}");
    assert!(out.batches.is_empty());
}

#[tokio::test]
async fn a_retry_after_beyond_the_window_gives_up_without_waiting_for_it() {
    let (base, seen) = serve(vec![(503, Some(60))]).await;
    let (poster, scenario) = poster(&base, Duration::from_secs(5)).await;
    let people = one_recipient();
    let plan = Plan::new(&scenario, people.len());
    let started = Instant::now();
    let out = enqueue(&poster, &people, &plan)
        .await
        .expect("not an error");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(seen.lock().unwrap().posts.len(), 1);
    assert_eq!(out.failures.not_accepted.len(), 1);
}

/// Any answer but 202 or 200 that is not a failure to retry (a 4xx, a status the contract does
/// not name, a redirect) is the stack refusing the batch: final after one attempt, and recorded
/// as not accepted (judged by `responsiveness`), never an error that stops the run (exit 3).
#[tokio::test]
async fn a_refusal_is_final_and_recorded_as_not_accepted() {
    for status in [422, 400, 201, 302] {
        let (base, seen) = serve(vec![(status, None)]).await;
        let (poster, scenario) = poster(&base, super::super::RETRY_FOR).await;
        let people = one_recipient();
        let plan = Plan::new(&scenario, people.len());
        let out = enqueue(&poster, &people, &plan)
            .await
            .expect("not an error");
        assert_eq!(seen.lock().unwrap().posts.len(), 1, "{status}: not retried");
        let gone = &out.failures.not_accepted;
        assert_eq!(gone.len(), 1, "{status}");
        assert_eq!((gone[0].attempts, gone[0].deliveries), (1, 3), "{status}");
        let want = format!("HTTP {status}: ");
        assert!(gone[0].last_error.starts_with(&want), "{gone:?}");
        assert!(gone[0].last_error.contains("is final"), "{gone:?}");
        assert_eq!(out.failures.attempts[0].status, Some(status));
        assert!(out.batches.is_empty(), "{status}");
    }
}

/// An accepted answer of 64 MiB is read no further than the few kilobytes an answer needs.
#[tokio::test]
async fn a_huge_answer_is_read_only_up_to_its_cap() {
    let app = Router::new().route(
        "/v1/batches",
        post(|| async { (StatusCode::ACCEPTED, vec![b' '; 64 << 20]) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (poster, _) = poster(&format!("http://{addr}"), super::super::RETRY_FOR).await;
    let answer = poster.post("b1", b"{}".to_vec()).await.expect("answered");
    assert_eq!(answer.status, 202);
    assert!(
        answer.body.len() <= super::super::ANSWER_CAP,
        "{}",
        answer.body.len()
    );
    assert_eq!(answer.deliveries, None);
}
