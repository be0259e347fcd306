//! The load: recipients split into batches and enqueued through the stack's API, each request's
//! latency measured.

pub mod recipients;

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use crate::scenario::{Pacing, Scenario};
pub use recipients::Recipient;

/// The batches of a run: their ids and which recipients each holds.
pub struct Plan {
    pub batches: Vec<(String, std::ops::Range<usize>)>,
}

impl Plan {
    pub fn new(scenario: &Scenario, n: usize) -> Plan {
        let count = scenario.load.pacing.batch_count().max(1) as usize;
        let per = n.div_ceil(count);
        let batches = (0..count)
            .map(|k| {
                let start = (k * per).min(n);
                let end = ((k + 1) * per).min(n);
                (
                    format!("{}-{}-b{}", scenario.name, scenario.seed, k + 1),
                    start..end,
                )
            })
            .filter(|(_, r)| !r.is_empty())
            .collect();
        Plan { batches }
    }

    pub fn batch_of(&self, index: usize) -> String {
        self.batches
            .iter()
            .find(|(_, r)| r.contains(&index))
            .map(|(id, _)| id.clone())
            .unwrap_or_default()
    }
}

/// An enqueue request the stack refused or could not answer.
#[derive(Debug, thiserror::Error)]
#[error("enqueue of batch {batch_id} failed: {detail}")]
pub struct EnqueueError {
    pub batch_id: String,
    pub detail: String,
}

/// What the load recorded: every enqueue request's latency, and when each batch was posted.
pub struct Enqueued {
    /// Enqueue request latencies (µs).
    pub latency_us: hdrhistogram::Histogram<u64>,
    /// Every batch's request in order, its times read from `now_ns` (the run's ledger clock).
    pub batches: Vec<crate::report::BatchEnqueue>,
}

/// Enqueues every batch with the scenario's pacing; returns enqueue latencies and, read from
/// `now_ns`, when each batch's request was sent and answered.
pub async fn enqueue(
    scenario: &Scenario,
    api_base: &str,
    recipients: &[Recipient],
    plan: &Plan,
    now_ns: impl Fn() -> u64,
) -> Result<Enqueued, EnqueueError> {
    let mut batches = Vec::with_capacity(plan.batches.len());
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)
        .expect("histogram bounds");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("http client");
    let gap = match scenario.load.pacing {
        Pacing::Batches(_) => Duration::ZERO,
        Pacing::Rate { per_second, .. } => Duration::from_secs_f64(1.0 / per_second),
    };
    let start = Instant::now();
    let t = &scenario.load.template;
    let channels: Vec<&str> = scenario.load.channels.iter().map(|c| c.as_str()).collect();
    for (k, (batch_id, range)) in plan.batches.iter().enumerate() {
        // Paced from the intended start, so a slow enqueue does not hide behind the schedule.
        let due = start + gap * k as u32;
        tokio::time::sleep_until(due.into()).await;
        let body = json!({
            "batch_id": batch_id,
            "template": {"id": t.id, "version": t.version, "subject": t.subject, "text": t.text,
                          "html": t.html, "line": t.line, "sms": t.sms},
            "channels": channels,
            "recipients": &recipients[range.clone()],
        });
        let sent = Instant::now();
        let sent_ns = now_ns();
        let fail = |detail: String| EnqueueError {
            batch_id: batch_id.clone(),
            detail,
        };
        let resp = client
            .post(format!("{api_base}/v1/batches"))
            .json(&body)
            .send()
            .await
            .map_err(|e| fail(format!("request error: {e}")))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let _ = hist.record((sent.elapsed().as_micros() as u64).max(1));
        batches.push(crate::report::BatchEnqueue {
            batch_id: batch_id.clone(),
            sent_ns,
            acked_ns: now_ns(),
        });
        if !(status.as_u16() == 202 || status.as_u16() == 200) {
            return Err(fail(format!(
                "HTTP {status}: {}",
                text.chars().take(500).collect::<String>()
            )));
        }
    }
    Ok(Enqueued {
        latency_us: hist,
        batches,
    })
}

/// One batch's rows from the status API (`GET /v1/batches/{id}/deliveries`); `None` when the
/// stack answers 404, 405 or 501 for it (what that means is `run/status.rs`'s business: no
/// status API at all on the first batch, a lost batch after that).
pub async fn fetch_batch_status(
    client: &reqwest::Client,
    api_base: &str,
    batch_id: &str,
) -> anyhow::Result<Option<Vec<crate::check::StatusDelivery>>> {
    #[derive(serde::Deserialize)]
    struct Page {
        deliveries: Vec<crate::check::StatusDelivery>,
    }
    let resp = client
        .get(format!("{api_base}/v1/batches/{batch_id}/deliveries"))
        .send()
        .await
        .context("status API request")?;
    if matches!(resp.status().as_u16(), 404 | 405 | 501) {
        return Ok(None);
    }
    let resp = resp.error_for_status().context("status API")?;
    let page: Page = resp.json().await.context("status API body")?;
    Ok(Some(page.deliveries))
}
