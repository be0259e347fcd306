//! Figures derived from a finished run's ledger: throughput, end-to-end latency, sends per second,
//! attempts per delivery. Shared by the HTML report and the regression gate so both read the same
//! numbers.
//!
//! Everything here is a pure function of the report and the ledger; it must never read files or
//! the clock, so a report re-rendered a year later shows the same figures.

use std::collections::{BTreeMap, HashMap, HashSet};

use mock_providers::ledger::{EntryKind, Outcome, Provider};

use crate::check::{Entry, Pids};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{BatchEnqueue, Report};

/// The performance figures the regression gate compares (`report.json` `metrics`). Each is null
/// when the run has no data for it (nothing accepted, nothing enqueued): a gate on it is then
/// insufficient, never passed. A report written before they could be null has 0 instead.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Metrics {
    /// Accepted sends (new deliveries, not idempotent repeats) per second, from `load_start` to
    /// the last acceptance.
    #[serde(default)]
    pub deliveries_per_s: Option<f64>,
    /// 99th percentile of the enqueue request (`POST /v1/batches`) latency.
    #[serde(default)]
    pub enqueue_p99_ms: Option<f64>,
    /// Median end-to-end latency: from the moment the `POST /v1/batches` of the delivery's own
    /// batch was sent to the provider accepting the delivery's first copy.
    #[serde(default)]
    pub e2e_p50_ms: Option<f64>,
    /// 99th percentile of the same.
    #[serde(default)]
    pub e2e_p99_ms: Option<f64>,
}

impl Metrics {
    /// True for a report written before metrics existed (or a run that sent nothing).
    pub fn is_empty(&self) -> bool {
        [
            self.deliveries_per_s,
            self.enqueue_p99_ms,
            self.e2e_p50_ms,
            self.e2e_p99_ms,
        ]
        .iter()
        .all(|m| m.is_none_or(|v| v == 0.0))
    }
}

/// One bar of a latency histogram: values in `[from_ms, to_ms)`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Bucket {
    pub from_ms: f64,
    pub to_ms: f64,
    pub count: u64,
}

/// Latency distributions of a run (`report.json` `latency`), kept so that `ting-chaos report DIR`
/// draws the same histograms without the run's in-memory data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Latency {
    /// Enqueue request (`POST /v1/batches`) latency, one value per batch.
    pub enqueue_histogram: Vec<Bucket>,
    /// End-to-end latency, all channels: from the moment the `POST /v1/batches` of the delivery's
    /// own batch was sent to the provider's first acceptance of the delivery. Deliveries the
    /// providers never accepted are not counted.
    pub e2e: super::Percentiles,
    /// The same per channel (`line`, `email`, `sms`).
    pub e2e_by_channel: BTreeMap<String, super::Percentiles>,
    pub e2e_histogram: Vec<Bucket>,
    /// What end-to-end latency is measured from: `batch_post` (the delivery's own batch), or
    /// `load_start` for a report written before per-batch enqueue times existed (re-rendered;
    /// only single-batch loads, where the two agree to within the request's start).
    pub e2e_from: String,
}

/// The channel name a provider serves, as scenarios and checkers spell it.
pub(crate) fn channel_of(p: Provider) -> &'static str {
    match p {
        Provider::Line => "line",
        Provider::Smtp => "email",
        Provider::Sms => "sms",
    }
}

/// When the load started on the ledger clock.
pub(crate) fn load_start_ns(report: &Report) -> Option<u64> {
    report
        .timeline
        .iter()
        .find(|e| e.kind == crate::check::EventKind::LoadStart)
        .map(|e| e.mono_ns)
}

fn sends(ledger: &[Entry]) -> impl Iterator<Item = &Entry> {
    ledger.iter().filter(|e| e.kind == EntryKind::Send)
}

/// First acceptance of every delivery (provider, address): (provider, address, time), in ledger
/// order.
fn first_acceptances(ledger: &[Entry]) -> impl Iterator<Item = (Provider, &str, u64)> + '_ {
    // Per provider, the addresses seen accepted: a word pair a slot, no list of them kept.
    let mut seen: [HashSet<&str>; 3] = Default::default();
    sends(ledger)
        .filter(|e| e.outcome == Outcome::Accepted)
        .filter(move |e| seen[e.provider.index()].insert(e.recipient.as_str()))
        .map(|e| (e.provider, e.recipient.as_str(), e.mono_ns))
}

/// When each delivery was enqueued on the ledger clock: per provider, address → when the
/// `POST /v1/batches` of its batch was sent. One table per provider keyed by the expected
/// deliveries' own addresses (shared, not copied).
#[derive(Debug, Default)]
pub struct EnqueueTimes([HashMap<crate::check::Name, u64>; 3]);

impl EnqueueTimes {
    pub fn get(&self, provider: Provider, address: &str) -> Option<u64> {
        self.0[provider.index()].get(address).copied()
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// [`EnqueueTimes`] from the expected deliveries and the batches' send times.
pub fn enqueue_times(
    expected: &[crate::check::Expected],
    batches: &[BatchEnqueue],
) -> EnqueueTimes {
    let sent: HashMap<&str, u64> = batches
        .iter()
        .map(|b| (b.batch_id.as_str(), b.sent_ns))
        .collect();
    let mut times = EnqueueTimes::default();
    for e in expected {
        if let Some(at) = sent.get(e.batch_id.as_str()) {
            times.0[e.channel.provider().index()].insert(e.address.clone(), *at);
        }
    }
    times
}

/// End-to-end latencies in milliseconds, sorted, per channel: each delivery from its own enqueue
/// (`enqueued_at`) to its first acceptance. Deliveries with no enqueue time are left out.
pub(crate) fn e2e_ms(
    ledger: &[Entry],
    enqueued_at: impl Fn(Provider, &str) -> Option<u64>,
) -> BTreeMap<&'static str, Vec<f64>> {
    let mut out: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    for (p, to, at) in first_acceptances(ledger) {
        let Some(t0) = enqueued_at(p, to) else {
            continue;
        };
        out.entry(channel_of(p))
            .or_default()
            .push(at.saturating_sub(t0) as f64 / 1e6);
    }
    for v in out.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    out
}

/// Nearest-rank percentile of sorted values (`q` in 0..=1); 0 for no values.
pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// All channels' latencies in one sorted list.
pub(crate) fn merged(by_channel: &BTreeMap<&'static str, Vec<f64>>) -> Vec<f64> {
    let mut all: Vec<f64> = by_channel.values().flatten().copied().collect();
    all.sort_by(f64::total_cmp);
    all
}

fn percentiles_of(sorted: &[f64]) -> super::Percentiles {
    super::Percentiles {
        count: sorted.len() as u64,
        p50: round3(percentile(sorted, 0.5)),
        p90: round3(percentile(sorted, 0.9)),
        p99: round3(percentile(sorted, 0.99)),
        max: round3(sorted.last().copied().unwrap_or(0.0)),
    }
}

/// Buckets of a 1-2-5 width chosen for about 25 bars over `(value ms, count)` pairs.
pub(crate) fn histogram(values: &[(f64, u64)]) -> Vec<Bucket> {
    let Some(max) = values.iter().map(|v| v.0).reduce(f64::max) else {
        return Vec::new();
    };
    let raw = max.max(1.0) / 25.0;
    let mag = 10f64.powf(raw.log10().floor());
    let width = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|w| *w >= raw)
        .unwrap_or(10.0 * mag);
    let n = (max.max(0.0) / width).floor() as usize + 1;
    let mut counts = vec![0u64; n];
    for &(v, c) in values {
        counts[((v.max(0.0) / width).floor() as usize).min(n - 1)] += c;
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(i, count)| Bucket {
            from_ms: round3(i as f64 * width),
            to_ms: round3((i + 1) as f64 * width),
            count,
        })
        .collect()
}

/// The run's latency distributions: `enqueue_us` is the load's histogram of enqueue request
/// latencies (µs), `enqueued` when each delivery's batch was posted.
pub fn latency(
    ledger: &[Entry],
    enqueue_us: &hdrhistogram::Histogram<u64>,
    enqueued: &EnqueueTimes,
) -> Latency {
    let by_channel = e2e_ms(ledger, |p, to| enqueued.get(p, to));
    let mut l = e2e_latency(&by_channel, "batch_post");
    let recorded: Vec<(f64, u64)> = enqueue_us
        .iter_recorded()
        .map(|v| (v.value_iterated_to() as f64 / 1000.0, v.count_at_value()))
        .collect();
    l.enqueue_histogram = histogram(&recorded);
    l
}

fn e2e_latency(by_channel: &BTreeMap<&'static str, Vec<f64>>, from: &str) -> Latency {
    let all = merged(by_channel);
    Latency {
        enqueue_histogram: Vec::new(),
        e2e: percentiles_of(&all),
        e2e_by_channel: by_channel
            .iter()
            .map(|(c, v)| (c.to_string(), percentiles_of(v)))
            .collect(),
        e2e_histogram: histogram(&all.iter().map(|v| (*v, 1)).collect::<Vec<_>>()),
        e2e_from: from.into(),
    }
}

/// The latency distributions to show for `report`: its own, or for a report written before they
/// were kept, end-to-end latency recomputed from the ledger when the load was one batch (its
/// enqueue is then `load_start`, give or take the request's start). None when neither is
/// possible: a multi-batch report of that age has no per-delivery enqueue times.
pub(crate) fn latency_of<'a>(
    report: &'a Report,
    ledger: &[Entry],
) -> Option<std::borrow::Cow<'a, Latency>> {
    if let Some(l) = &report.latency {
        return Some(std::borrow::Cow::Borrowed(l));
    }
    let t0 = load_start_ns(report)?;
    if report.load.batches > 1 || ledger.is_empty() {
        return None;
    }
    let by_channel = e2e_ms(ledger, |_, _| Some(t0));
    Some(std::borrow::Cow::Owned(e2e_latency(
        &by_channel,
        "load_start",
    )))
}

/// The figures the regression gate compares. The run calls it once the report (with its
/// `latency`) is built: `report.metrics = report::metrics(&report, &ledger)`.
///
/// Throughput ends at the last acceptance rather than at quiescence: quiescence adds the
/// harness's own settle window (lease + heartbeat), which would make short runs look slow.
pub fn metrics(report: &Report, ledger: &[Entry]) -> Metrics {
    let (accepted, last) =
        first_acceptances(ledger).fold((0u64, None), |(n, last), a| (n + 1, last.max(Some(a.2))));
    let deliveries_per_s = match (load_start_ns(report), last) {
        (Some(t0), Some(t1)) if t1 > t0 => Some(round3(accepted as f64 / ((t1 - t0) as f64 / 1e9))),
        _ => None,
    };
    let e2e = latency_of(report, ledger)
        .map(|l| l.e2e.clone())
        .filter(|p| p.count > 0);
    let enqueue = Some(&report.load.enqueue_latency_ms).filter(|p| p.count > 0);
    Metrics {
        deliveries_per_s,
        enqueue_p99_ms: enqueue.map(|p| p.p99),
        e2e_p50_ms: e2e.as_ref().map(|p| p.p50),
        e2e_p99_ms: e2e.map(|p| p.p99),
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// How sends whose outcome their sender could not know (it died, or timed out, after the provider
/// may have committed) were settled, per channel (`report.json` `uncertain`). Counted from the
/// ledger and `no_loss`'s figures, so a run whose chaos never hit the uncertainty window shows
/// zeros here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Uncertain {
    /// LINE deliveries a resend settled with the provider's 409 for the same `X-Line-Retry-Key`:
    /// the ledger shows an `idempotent_repeat` for the delivery.
    pub line_retry_key: u64,
    /// SMS deliveries the stack adopted by listing the provider's messages: an accepted create,
    /// then a listing lookup (`GET …/Messages.json?To=…`) for that number, and no create after
    /// the lookup.
    pub sms_adopted_by_listing: u64,
    /// E-mails held as `unknown` that a delivery event then resolved (`no_loss`
    /// `unknown_resolved_by_channel.email`).
    pub email_unknown_resolved: u64,
    /// E-mails still held as `unknown` when the run ended (`no_loss` `by_channel.email.unknown`).
    pub email_unknown_held: u64,
}

impl Uncertain {
    /// True when no uncertain send was settled or held.
    pub fn is_empty(&self) -> bool {
        *self == Uncertain::default()
    }

    /// One line for people: `LINE 2 settled by retry key (409) · SMS 1 adopted by listing · …`.
    pub fn line(&self) -> String {
        format!(
            "LINE {} settled by retry key (409) · SMS {} adopted by listing · e-mail {} held \
             unknown then resolved by a delivery event ({} still unknown)",
            self.line_retry_key,
            self.sms_adopted_by_listing,
            self.email_unknown_resolved,
            self.email_unknown_held
        )
    }
}

/// [`Uncertain`] for a finished run: its ledger and its checkers' verdicts.
pub fn uncertain(ledger: &[Entry], checks: &[crate::check::Verdict]) -> Uncertain {
    use std::collections::HashSet;
    let line_retry_key = sends(ledger)
        .filter(|e| e.provider == Provider::Line && e.outcome == Outcome::IdempotentRepeat)
        .map(|e| e.recipient.as_str())
        .collect::<HashSet<_>>()
        .len() as u64;
    // Per SMS number: the first accepted create, the last create, and the listing lookups.
    let mut first_accept: HashMap<&str, u64> = HashMap::new();
    let mut last_send: HashMap<&str, u64> = HashMap::new();
    for e in sends(ledger).filter(|e| e.provider == Provider::Sms) {
        last_send.insert(&e.recipient, e.seq);
        if e.outcome == Outcome::Accepted {
            first_accept.entry(&e.recipient).or_insert(e.seq);
        }
    }
    let adopted: HashSet<&str> = ledger
        .iter()
        .filter(|e| {
            // A listing: a poll about a number, not about one message id.
            e.provider == Provider::Sms
                && e.kind == EntryKind::Poll
                && e.message_id.is_none()
                && e.status == "200"
                && !e.recipient.is_empty()
        })
        .filter(|p| {
            let to = p.recipient.as_str();
            first_accept.get(to).is_some_and(|a| *a < p.seq)
                && last_send.get(to).is_some_and(|s| *s < p.seq)
        })
        .map(|p| p.recipient.as_str())
        .collect();
    let no_loss = checks.iter().find(|v| v.checker == "no_loss");
    let figure = |path: &[&str]| -> u64 {
        let Some(v) = no_loss else { return 0 };
        let mut cur = v.figures.get(path[0]);
        for k in &path[1..] {
            cur = cur.and_then(|c| c.get(*k));
        }
        cur.and_then(serde_json::Value::as_u64).unwrap_or(0)
    };
    Uncertain {
        line_retry_key,
        sms_adopted_by_listing: adopted.len() as u64,
        email_unknown_resolved: figure(&[
            "unknown_resolved_by_channel",
            "email",
            "unknown_resolved",
        ]),
        email_unknown_held: figure(&["by_channel", "email", "unknown"]),
    }
}

/// Send attempts per process: ledger `seq` → pid (the attribution map the checkers get) folded
/// into pid → count. Sends the attribution could not place are left out. The run stores it as
/// `report.sends_by_pid`.
pub fn sends_by_pid(ledger: &[Entry], pids: &Pids) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for e in sends(ledger) {
        if let Some(pid) = pids.get(e.seq) {
            *out.entry(pid).or_default() += 1;
        }
    }
    out
}

/// Send attempts with no sender in the attribution map: `report.sends_unattributed`.
pub fn sends_unattributed(ledger: &[Entry], pids: &Pids) -> u64 {
    sends(ledger).filter(|e| !pids.contains(e.seq)).count() as u64
}

/// Per-second counts of accepted sends per channel, and of sends carrying an injected fault.
pub(crate) struct PerSecond {
    /// channel → counts, index = second since the ledger clock's zero.
    pub accepted: BTreeMap<&'static str, Vec<u32>>,
    pub faults: Vec<u32>,
    pub seconds: usize,
}

/// The longest timeline [`per_second`] draws: a week of seconds. A run lasts minutes; an entry
/// stamped later comes from a damaged or hand-edited `ledger.jsonl` and is left out, rather than
/// sizing the chart's arrays by it (`u64::MAX` ns would ask for tens of gigabytes).
const MAX_SECONDS: usize = 7 * 24 * 3600;

pub(crate) fn per_second(ledger: &[Entry]) -> PerSecond {
    let second = |e: &Entry| {
        usize::try_from(e.mono_ns / 1_000_000_000)
            .ok()
            .filter(|s| *s < MAX_SECONDS)
    };
    let seconds = ledger
        .iter()
        .filter_map(&second)
        .map(|s| s + 1)
        .max()
        .unwrap_or(0);
    let mut accepted: BTreeMap<&'static str, Vec<u32>> = BTreeMap::new();
    let mut faults = vec![0; seconds];
    for e in sends(ledger) {
        let Some(s) = second(e) else { continue };
        if e.outcome == Outcome::Accepted {
            accepted
                .entry(channel_of(e.provider))
                .or_insert_with(|| vec![0; seconds])[s] += 1;
        }
        if e.fault().is_some() {
            faults[s] += 1;
        }
    }
    PerSecond {
        accepted,
        faults,
        seconds,
    }
}

/// How many deliveries took 1, 2, 3… send attempts (deliveries the providers saw at least once).
pub(crate) fn attempts_per_delivery(ledger: &[Entry]) -> BTreeMap<u32, u64> {
    let mut per: HashMap<(Provider, &str), u32> = HashMap::new();
    for e in sends(ledger) {
        *per.entry((e.provider, e.recipient.as_str())).or_default() += 1;
    }
    let mut out = BTreeMap::new();
    for n in per.into_values() {
        *out.entry(n).or_default() += 1;
    }
    out
}

#[cfg(test)]
#[path = "stats_tests.rs"]
mod tests;
