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

use super::Report;

/// The performance figures a run is judged on by the regression gate (`report.json` `metrics`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Metrics {
    /// Accepted sends (new deliveries, not idempotent repeats) per second, from `load_start` to
    /// the last acceptance.
    pub deliveries_per_s: f64,
    /// 99th percentile of the enqueue request (`POST /v1/batches`) latency.
    pub enqueue_p99_ms: f64,
    /// Median time from `load_start` to the provider accepting a delivery's first copy.
    pub e2e_p50_ms: f64,
    /// 99th percentile of the same.
    pub e2e_p99_ms: f64,
}

impl Metrics {
    /// True for a report written before metrics existed (or a run that sent nothing).
    pub fn is_empty(&self) -> bool {
        *self == Metrics::default()
    }
}

/// The channel name a provider serves, as scenarios and checkers spell it.
pub(crate) fn channel_of(p: Provider) -> &'static str {
    match p {
        Provider::Line => "line",
        Provider::Smtp => "email",
        Provider::Sms => "sms",
    }
}

/// When the load started on the ledger clock (the enqueue time of end-to-end latency).
pub(crate) fn load_start_ns(report: &Report) -> Option<u64> {
    report
        .timeline
        .iter()
        .find(|e| e.kind == "load_start")
        .map(|e| e.mono_ns)
}

fn sends(ledger: &[LedgerEntry]) -> impl Iterator<Item = &LedgerEntry> {
    ledger.iter().filter(|e| e.kind == EntryKind::Send)
}

/// First acceptance time of every delivery (provider, address), in ledger order.
fn first_acceptances(ledger: &[LedgerEntry]) -> Vec<(Provider, u64)> {
    let mut seen = std::collections::HashSet::new();
    sends(ledger)
        .filter(|e| e.outcome == Outcome::Accepted)
        .filter(|e| seen.insert((e.provider, e.recipient.as_str())))
        .map(|e| (e.provider, e.mono_ns))
        .collect()
}

/// End-to-end latencies in milliseconds (`load_start` → first acceptance), sorted, per channel.
/// Empty when the report has no `load_start` event.
pub(crate) fn e2e_ms(report: &Report, ledger: &[LedgerEntry]) -> BTreeMap<&'static str, Vec<f64>> {
    let mut out: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let Some(t0) = load_start_ns(report) else {
        return out;
    };
    for (p, at) in first_acceptances(ledger) {
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

/// The figures the regression gate compares. The run calls it once the report is built:
/// `report.metrics = report::metrics(&report, &ledger)`.
///
/// Throughput ends at the last acceptance rather than at quiescence: quiescence adds the
/// harness's own settle window (lease + heartbeat), which would make short runs look slow.
pub fn metrics(report: &Report, ledger: &[LedgerEntry]) -> Metrics {
    let accepted = first_acceptances(ledger);
    let deliveries_per_s = match (load_start_ns(report), accepted.iter().map(|a| a.1).max()) {
        (Some(t0), Some(t1)) if t1 > t0 => accepted.len() as f64 / ((t1 - t0) as f64 / 1e9),
        _ => 0.0,
    };
    let e2e = merged(&e2e_ms(report, ledger));
    Metrics {
        deliveries_per_s: round3(deliveries_per_s),
        enqueue_p99_ms: report.load.enqueue_latency_ms.p99,
        e2e_p50_ms: round3(percentile(&e2e, 0.5)),
        e2e_p99_ms: round3(percentile(&e2e, 0.99)),
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
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
