//! Figures derived from a finished run's ledger: throughput, end-to-end latency, sends per second,
//! attempts per delivery. Shared by the HTML report and the regression gate so both read the same
//! numbers.
//!
//! Everything here is a pure function of the report and the ledger; it must never read files or
//! the clock, so a report re-rendered a year later shows the same figures.

use std::collections::{BTreeMap, HashMap};

use mock_providers::ledger::{EntryKind, LedgerEntry, Outcome, Provider};
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

fn sends(ledger: &[LedgerEntry]) -> impl Iterator<Item = &LedgerEntry> {
    ledger.iter().filter(|e| e.kind == EntryKind::Send)
}

/// First acceptance of every delivery (provider, address): (provider, address, time), in ledger
/// order.
fn first_acceptances(ledger: &[LedgerEntry]) -> Vec<(Provider, &str, u64)> {
    let mut seen = std::collections::HashSet::new();
    sends(ledger)
        .filter(|e| e.outcome == Outcome::Accepted)
        .filter(|e| seen.insert((e.provider, e.recipient.as_str())))
        .map(|e| (e.provider, e.recipient.as_str(), e.mono_ns))
        .collect()
}

/// When each delivery was enqueued on the ledger clock: (provider, address) → when the
/// `POST /v1/batches` of its batch was sent.
pub type EnqueueTimes = HashMap<(Provider, String), u64>;

/// [`EnqueueTimes`] from the expected deliveries and the batches' send times.
pub fn enqueue_times(
    expected: &[crate::check::Expected],
    batches: &[BatchEnqueue],
) -> EnqueueTimes {
    let sent: HashMap<&str, u64> = batches
        .iter()
        .map(|b| (b.batch_id.as_str(), b.sent_ns))
        .collect();
    expected
        .iter()
        .filter_map(|e| {
            let at = *sent.get(e.batch_id.as_str())?;
            Some(((e.channel.provider(), e.address.clone()), at))
        })
        .collect()
}

/// End-to-end latencies in milliseconds, sorted, per channel: each delivery from its own enqueue
/// (`enqueued_at`) to its first acceptance. Deliveries with no enqueue time are left out.
pub(crate) fn e2e_ms(
    ledger: &[LedgerEntry],
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
    ledger: &[LedgerEntry],
    enqueue_us: &hdrhistogram::Histogram<u64>,
    enqueued: &EnqueueTimes,
) -> Latency {
    let by_channel = e2e_ms(ledger, |p, to| enqueued.get(&(p, to.to_string())).copied());
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
    ledger: &[LedgerEntry],
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
pub fn metrics(report: &Report, ledger: &[LedgerEntry]) -> Metrics {
    let accepted = first_acceptances(ledger);
    let deliveries_per_s = match (load_start_ns(report), accepted.iter().map(|a| a.2).max()) {
        (Some(t0), Some(t1)) if t1 > t0 => {
            Some(round3(accepted.len() as f64 / ((t1 - t0) as f64 / 1e9)))
        }
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
pub fn uncertain(ledger: &[LedgerEntry], checks: &[crate::check::Verdict]) -> Uncertain {
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
pub fn sends_by_pid(ledger: &[LedgerEntry], pids: &HashMap<u64, u32>) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for e in sends(ledger) {
        if let Some(pid) = pids.get(&e.seq) {
            *out.entry(*pid).or_default() += 1;
        }
    }
    out
}

/// Send attempts with no sender in the attribution map: `report.sends_unattributed`.
pub fn sends_unattributed(ledger: &[LedgerEntry], pids: &HashMap<u64, u32>) -> u64 {
    sends(ledger).filter(|e| !pids.contains_key(&e.seq)).count() as u64
}

/// Per-second counts of accepted sends per channel, and of sends carrying an injected fault.
pub(crate) struct PerSecond {
    /// channel → counts, index = second since the ledger clock's zero.
    pub accepted: BTreeMap<&'static str, Vec<u32>>,
    pub faults: Vec<u32>,
    pub seconds: usize,
}

pub(crate) fn per_second(ledger: &[LedgerEntry]) -> PerSecond {
    let seconds = ledger
        .iter()
        .map(|e| (e.mono_ns / 1_000_000_000) as usize + 1)
        .max()
        .unwrap_or(0);
    let mut accepted: BTreeMap<&'static str, Vec<u32>> = BTreeMap::new();
    let mut faults = vec![0; seconds];
    for e in sends(ledger) {
        let s = (e.mono_ns / 1_000_000_000) as usize;
        if e.outcome == Outcome::Accepted {
            accepted
                .entry(channel_of(e.provider))
                .or_insert_with(|| vec![0; seconds])[s] += 1;
        }
        if e.fault.is_some() {
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
pub(crate) fn attempts_per_delivery(ledger: &[LedgerEntry]) -> BTreeMap<u32, u64> {
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
mod tests {
    use super::*;

    pub(crate) fn entry(seq: u64, p: Provider, to: &str, outcome: Outcome, ms: u64) -> LedgerEntry {
        let mut e = LedgerEntry::draft(p, EntryKind::Send, to);
        e.seq = seq;
        e.mono_ns = ms * 1_000_000;
        e.outcome = outcome;
        e
    }

    fn expected(
        recipient: &str,
        channel: crate::scenario::Channel,
        batch: &str,
    ) -> crate::check::Expected {
        crate::check::Expected {
            recipient: recipient.into(),
            channel,
            address: format!("{recipient}@{}", channel.as_str()),
            bad: false,
            tricky_name: None,
            batch_id: batch.into(),
        }
    }

    #[test]
    fn end_to_end_latency_runs_from_each_deliverys_own_batch() {
        use crate::scenario::Channel;
        use Outcome::*;
        // Batch b1 posted at 1 s, batch b2 at 60 s (a paced load): each delivery is accepted
        // 200 ms after its own batch was posted, so every end-to-end latency is 200 ms — not
        // 59.2 s for b2's, which is what timing from the start of the load would say.
        let exp = [
            expected("r1", Channel::Line, "b1"),
            expected("r2", Channel::Sms, "b2"),
            expected("r3", Channel::Line, "b2"),
        ];
        let batches = [
            BatchEnqueue {
                batch_id: "b1".into(),
                sent_ns: 1_000_000_000,
                acked_ns: 1_050_000_000,
                trickle: false,
            },
            BatchEnqueue {
                batch_id: "b2".into(),
                sent_ns: 60_000_000_000,
                acked_ns: 60_040_000_000,
                trickle: false,
            },
        ];
        let ledger = [
            entry(0, Provider::Line, "r1@line", Transient, 1_100),
            entry(1, Provider::Line, "r1@line", Accepted, 1_200),
            entry(2, Provider::Sms, "r2@sms", Accepted, 60_200),
            entry(3, Provider::Line, "r3@line", Accepted, 60_200),
            // A duplicate much later does not move the first acceptance.
            entry(4, Provider::Line, "r3@line", Accepted, 90_000),
            // Not in any batch: left out.
            entry(5, Provider::Line, "stranger", Accepted, 5_000),
        ];
        let times = enqueue_times(&exp, &batches);
        assert_eq!(times.len(), 3);
        let mut hist = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        hist.record(50_000).unwrap();
        hist.record(40_000).unwrap();
        let l = latency(&ledger, &hist, &times);
        assert_eq!(l.e2e_from, "batch_post");
        assert_eq!(l.e2e.count, 3);
        assert_eq!((l.e2e.p50, l.e2e.p99, l.e2e.max), (200.0, 200.0, 200.0));
        assert_eq!(l.e2e_by_channel["line"].count, 2);
        assert_eq!(l.e2e_by_channel["sms"].p99, 200.0);
        assert_eq!(l.e2e_histogram.iter().map(|b| b.count).sum::<u64>(), 3);
        // Two enqueue requests (40 ms and 50 ms) in the enqueue histogram.
        assert_eq!(l.enqueue_histogram.iter().map(|b| b.count).sum::<u64>(), 2);
        let last = l.enqueue_histogram.last().unwrap();
        assert!(last.from_ms <= 50.0 && 50.0 < last.to_ms, "{last:?}");
    }

    #[test]
    fn histogram_buckets_cover_every_value() {
        let b = histogram(&[(0.0, 1), (12.0, 2), (99.9, 1), (100.0, 1)]);
        // 100 ms / 25 bars = 4 ms, rounded up to the 1-2-5 width 5 ms: 21 buckets up to 105 ms.
        assert_eq!(b.len(), 21, "{b:?}");
        assert_eq!((b[0].from_ms, b[0].to_ms), (0.0, 5.0));
        assert_eq!(b.iter().map(|x| x.count).sum::<u64>(), 5);
        assert_eq!(b[2].count, 2, "12 ms is in [10, 15)");
        assert_eq!((b[19].count, b[20].count), (1, 1));
        assert!(histogram(&[]).is_empty());
    }

    #[test]
    fn uncertain_sends_are_counted_by_how_they_were_settled() {
        use crate::check::{Status, Verdict};
        use Outcome::*;
        let poll = |seq: u64, to: &str, sid: Option<&str>| {
            let mut e = LedgerEntry::draft(Provider::Sms, EntryKind::Poll, to);
            e.seq = seq;
            e.status = "200".into();
            e.message_id = sid.map(String::from);
            e
        };
        let ledger = [
            // LINE: accepted, the sender died, the resend got 409 (twice: one delivery).
            entry(0, Provider::Line, "U1", Accepted, 10),
            entry(1, Provider::Line, "U1", IdempotentRepeat, 2_000),
            entry(2, Provider::Line, "U1", IdempotentRepeat, 2_500),
            entry(3, Provider::Line, "U2", Accepted, 10),
            // SMS +1: accepted, then a listing found it; no create after: adopted.
            entry(4, Provider::Sms, "+1", Accepted, 10),
            poll(5, "+1", None),
            // SMS +2: a listing before anything was accepted, then a create: not adopted.
            poll(6, "+2", None),
            entry(7, Provider::Sms, "+2", Accepted, 20),
            // SMS +3: accepted, listed, and sent again anyway: not adopted (a duplicate).
            entry(8, Provider::Sms, "+3", Accepted, 10),
            poll(9, "+3", None),
            entry(10, Provider::Sms, "+3", Accepted, 30),
            // SMS +4: a fetch by sid is not a listing.
            entry(11, Provider::Sms, "+4", Accepted, 10),
            poll(12, "+4", Some("SM1")),
        ];
        let no_loss = Verdict {
            checker: "no_loss".into(),
            status: Status::Holds,
            summary: String::new(),
            counterexamples: Vec::new(),
            total_counterexamples: 0,
            figures: serde_json::json!({
                "by_channel": {"email": {"unknown": 1, "delivered": 9}},
                "unknown_resolved_by_channel": {"email": {"unknown_resolved": 3}, "line": {"unknown_resolved": 0}},
            })
            .as_object()
            .unwrap()
            .clone(),
            judged: Default::default(),
            main_rule: None,
            violations_by_rule: Default::default(),
        };
        let u = uncertain(&ledger, &[no_loss]);
        assert_eq!(
            u,
            Uncertain {
                line_retry_key: 1,
                sms_adopted_by_listing: 1,
                email_unknown_resolved: 3,
                email_unknown_held: 1,
            }
        );
        assert!(u
            .line()
            .starts_with("LINE 1 settled by retry key (409) · SMS 1 adopted"));
        assert!(uncertain(&[], &[]).is_empty());
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        for (q, want) in [(0.0, 1.0), (0.5, 50.0), (0.99, 99.0), (1.0, 100.0)] {
            assert_eq!(percentile(&v, q), want, "q={q}");
        }
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn counts_attempts_and_pids() {
        use Outcome::*;
        let ledger = [
            entry(0, Provider::Line, "a", Transient, 10),
            entry(1, Provider::Line, "a", Accepted, 20),
            entry(2, Provider::Sms, "a", Accepted, 30),
            entry(3, Provider::Sms, "a", IdempotentRepeat, 1500),
        ];
        let got = attempts_per_delivery(&ledger);
        assert_eq!(got.into_iter().collect::<Vec<_>>(), [(2, 2)]);
        let pids = HashMap::from([(0, 7), (1, 8), (2, 8)]);
        let by = sends_by_pid(&ledger, &pids);
        assert_eq!(by.into_iter().collect::<Vec<_>>(), [(7, 1), (8, 2)]);
        assert_eq!(sends_unattributed(&ledger, &pids), 1, "seq 3 has no sender");
        let ps = per_second(&ledger);
        assert_eq!(ps.seconds, 2);
        assert_eq!(ps.accepted["line"], [1, 0]);
        assert_eq!(ps.accepted["sms"], [1, 0]);
    }
}
