//! Repeated enqueues (`[load] repeat`): a seeded share of the batches is POSTed again with the
//! same `batch_id`, as every real client does after a timeout or a lost answer. The contract
//! promises `200` and nothing new for a batch accepted before.
//!
//! Three ways, taking turns among the repeated batches: `concurrent` (the repeat leaves `after` the
//! original was sent, without waiting for its answer), `after_answer` (it leaves `after` the
//! original was answered) and `lost_answer` (the harness writes the original request, closes the
//! connection unread a moment later — the stack may or may not have committed it — and POSTs it
//! again `after` that, as a client whose answer was lost). Every answer is recorded for the
//! `idempotent_enqueue` checker; this module judges nothing.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::scenario::{Repeat, Scenario};

/// How a batch is repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RepeatMode {
    /// `after` the original was sent, not waiting for its answer.
    Concurrent,
    /// `after` the original's answer was read.
    AfterAnswer,
    /// The original's connection was closed unread; the repeat is the client's retry.
    LostAnswer,
}

/// One batch's repeat, decided from the seed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    pub mode: RepeatMode,
    pub after: Duration,
    /// `lost_answer`: how long the harness holds the connection after writing the request.
    pub hang_up_after: Duration,
}

/// Whether and how the `k`-th batch (0-based) of `sequence` (`"batches"` or `"trickle"`) is
/// repeated. Exactly every (1 / share)-th batch of a sequence is, from a seeded offset, so a run
/// of `n` batches repeats at least ⌊n × share⌋ of them whatever the seed, and the three ways take
/// turns. When it leaves (`after`) is seeded per batch id. A function of the seed, the sequence
/// and `k` only.
pub fn plan(scenario: &Scenario, sequence: &str, k: usize, batch_id: &str) -> Option<Plan> {
    let r: &Repeat = scenario.load.repeat.as_ref()?;
    let share = r.share.clamp(f64::MIN_POSITIVE, 1.0);
    let mut per_sequence = rng(&format!("{}:repeat:{sequence}", scenario.seed));
    let offset = per_sequence.gen_range(0.0..1.0) / share;
    let picks = |k: usize| ((k as f64 + offset) * share).floor() as u64;
    if picks(k + 1) == picks(k) {
        return None;
    }
    let turn = (picks(k + 1) + per_sequence.gen_range(0..3)) % 3;
    let mode = [
        RepeatMode::Concurrent,
        RepeatMode::AfterAnswer,
        RepeatMode::LostAnswer,
    ][turn as usize];
    let mut per_batch = rng(&format!("{}:repeat:{batch_id}", scenario.seed));
    let span = r.after_max.saturating_sub(r.after_min);
    let after = r.after_min + span.mul_f64(per_batch.gen_range(0.0..=1.0));
    // A hang-up at once is usually seen before the stack commits; a few milliseconds later it
    // often is not: both are real lost answers.
    let hang_up_after = Duration::from_millis(per_batch.gen_range(0..=30));
    Some(Plan {
        mode,
        after,
        hang_up_after,
    })
}

fn rng(key: &str) -> rand_chacha::ChaCha8Rng {
    let mut seed = [0u8; 32];
    seed.copy_from_slice(&Sha256::digest(key));
    rand_chacha::ChaCha8Rng::from_seed(seed)
}

/// Writes a `POST /v1/batches` with `body` to the API at `api_base` and closes the connection
/// `hang_up_after` later without reading the answer. Errors only when the request could not be
/// written at all, or not `within` (a stack that accepts and never reads would otherwise hold the
/// write, and the whole load, for ever).
pub async fn post_and_hang_up(
    api_base: &str,
    body: &[u8],
    hang_up_after: Duration,
    within: Duration,
) -> std::io::Result<()> {
    let addr = api_base
        .strip_prefix("http://")
        .unwrap_or(api_base)
        .trim_end_matches('/');
    let head = format!(
        "POST /v1/batches HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    let write = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await?;
        conn.write_all(head.as_bytes()).await?;
        conn.write_all(body).await?;
        conn.flush().await?;
        Ok::<_, std::io::Error>(conn)
    };
    let conn = tokio::time::timeout(within, write).await.map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the API did not take the request within {within:?}"),
        )
    })??;
    tokio::time::sleep(hang_up_after).await;
    drop(conn);
    Ok(())
}

/// Sleeps until `at` (now when it has passed).
pub async fn until(at: Instant) {
    tokio::time::sleep_until(at.into()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An API that accepts the connection and never reads: the write gives up `within`.
    #[tokio::test]
    async fn a_request_the_api_never_reads_gives_up_in_time() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let held = tokio::spawn(async move {
            let (conn, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
            drop(conn);
        });
        let body = vec![b' '; 64 << 20];
        let started = std::time::Instant::now();
        let err = post_and_hang_up(&base, &body, Duration::ZERO, Duration::from_millis(500))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        held.abort();
    }

    #[test]
    fn the_plan_is_seeded_exact_and_takes_turns() {
        let text = r#"
name = "t"
seed = 3
[load]
recipients = 10
channels = ["line"]
repeat = { share = "40%", after = "100ms..2s" }
"#;
        let s = crate::scenario::parse(std::path::Path::new("t.toml"), text).unwrap();
        let plans = |seq: &str| -> Vec<Option<Plan>> {
            (0..1_000)
                .map(|k| plan(&s, seq, k, &format!("{seq}{k}")))
                .collect()
        };
        assert_eq!(plans("trickle"), plans("trickle"));
        let chosen: Vec<Plan> = plans("trickle").into_iter().flatten().collect();
        assert_eq!(chosen.len(), 400);
        // The three ways take turns.
        for w in chosen.windows(3) {
            assert_ne!(w[0].mode, w[1].mode);
            assert_ne!(w[0].mode, w[2].mode);
        }
        assert!(chosen
            .iter()
            .all(|p| (Duration::from_millis(100)..=Duration::from_secs(2)).contains(&p.after)));
        assert!(chosen.iter().any(|p| p.after < Duration::from_millis(300)));
        assert!(chosen
            .iter()
            .any(|p| p.after > Duration::from_millis(1_800)));
        // However few batches, ⌊n × share⌋ of them: 2 of 5, whatever the seed.
        for seed in 0..50 {
            let mut s = s.clone();
            s.seed = seed;
            let n = (0..5)
                .filter(|&k| plan(&s, "batches", k, &format!("b{k}")).is_some())
                .count();
            assert!((2..=3).contains(&n), "seed {seed}: {n}");
        }
    }
}
