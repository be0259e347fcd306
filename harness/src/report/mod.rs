//! `report.json`: the contract between a run and everything that reads it (people, CI, the
//! re-renderers). Written atomically (temporary file, then rename), so a run that dies mid-write
//! never leaves a half-written report.

use std::collections::BTreeMap;
use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::check::{ProcessRecord, Quiescence, Role, Status, TimelineEvent, Verdict};

pub mod atomic;
pub mod chaos_steps;
mod charts;
mod enqueue_failures;
pub mod gate;
pub mod html;
mod html_parts;
pub mod junit;
pub mod markdown;
pub mod phases;
mod read;
mod render;
pub(crate) mod stats;

pub use enqueue_failures::{EnqueueFailures, FailedEnqueue, NotAccepted};
pub use read::{read_report, ReadError};
pub use render::{
    read_entries, read_ledger, rerender, step_summary_path, write_all, write_rendered,
    RerenderError,
};
pub use stats::{
    enqueue_times, latency, metrics, sends_by_pid, sends_unattributed, uncertain, Bucket,
    EnqueueTimes, Latency, Metrics, Uncertain,
};

/// Version of the report format; bump on incompatible changes (and the schema with it).
pub const FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Report {
    pub format: u32,
    pub tool: Tool,
    pub scenario_name: String,
    pub seed: u64,
    /// The scenario as resolved (defaults filled in, validated).
    pub scenario: serde_json::Value,
    pub started_at: String,
    pub duration_ms: u64,
    /// 0 = every checked invariant held with enough judged and every gate passed, 1 = violation
    /// or failed performance gate, 3 = infrastructure failure (including renderings that could
    /// not be written), 4 = inconclusive (nothing violated, but a checker judged too little, a
    /// gate had no data, or a required chaos step was not applied: see `chaos_steps`).
    pub exit_code: i32,
    /// `pass`, `fail`, `inconclusive` or `error` (see `exit_code`).
    pub verdict: String,
    /// Why the run could not complete, when it could not.
    pub error: Option<String>,
    pub database: DatabaseInfo,
    pub load: LoadSummary,
    /// provider → outcome → count, over send attempts.
    pub ledger_summary: BTreeMap<String, BTreeMap<String, u64>>,
    pub callbacks_sent: u64,
    pub checks: Vec<Verdict>,
    pub quiescence: Option<Quiescence>,
    pub timeline: Vec<TimelineEvent>,
    pub processes: Vec<ProcessRecord>,
    /// Chaos steps (index into `scenario.chaos`) whose trigger never fired (the steps of
    /// `chaos_steps` with outcome `unfired`).
    pub chaos_unfired: Vec<usize>,
    /// What every chaos step did: `applied` only when its effect was observed, else why not. A
    /// required step not applied keeps the run from passing. Empty in reports written before it
    /// existed.
    #[serde(default)]
    pub chaos_steps: Vec<chaos_steps::ChaosStepResult>,
    /// Files beside this report.
    pub files: BTreeMap<String, String>,
    /// Performance gates that failed (thresholds in `[expect]`, or `--baseline` comparisons): the
    /// `message` of every failed entry of `gates`.
    #[serde(default)]
    pub regressions: Vec<String>,
    /// Every performance gate the run was held to, passed or failed. Empty when the scenario has
    /// no thresholds and no `--baseline` was given (and in reports written before it existed).
    #[serde(default)]
    pub gates: Vec<gate::GateResult>,
    /// pid → send attempts the providers saw from that process (`report::sends_by_pid`); label the
    /// pids with `processes`. Empty in reports written before it existed.
    #[serde(default)]
    pub sends_by_pid: BTreeMap<u32, u64>,
    /// Send attempts the harness could not attribute to a process (left out of `sends_by_pid`;
    /// `report::sends_unattributed`). Null when the run stopped before its verdict; absent in
    /// reports written before it existed.
    #[serde(default)]
    pub sends_unattributed: Option<u64>,
    /// Of `sends_unattributed`, the sends whose connection's client socket was already closed when
    /// the provider accepted the connection: their sender hung up or was killed between its
    /// `connect` and the accept, so no process held the socket to look up. Null and absent as
    /// `sends_unattributed`.
    #[serde(default)]
    pub sends_sender_gone: Option<u64>,
    /// The machine's stalls during the run (`crate::stalls`): how long, in all and at worst, it
    /// stopped running processes on time. Null when the run stopped before its verdict.
    #[serde(default)]
    pub machine: Option<crate::stalls::StallSummary>,
    /// The harness process's own CPU share of the run (`crate::cpu`). Null when the run stopped
    /// before its verdict or `/proc` was unreadable; absent in reports written before it existed.
    #[serde(default)]
    pub harness: Option<crate::cpu::HarnessUsage>,
    /// Wall seconds of each phase of the run (`report::phases`). Null when the run stopped before
    /// its verdict; absent in reports written before it existed.
    #[serde(default)]
    pub phases: Option<phases::Phases>,
    /// Performance figures the regression gate compares (`report::metrics`). All zero in reports
    /// written before it existed.
    #[serde(default)]
    pub metrics: Metrics,
    /// Latency distributions (enqueue and end-to-end histograms, end-to-end percentiles). Null when
    /// the run stopped before its verdict; absent in reports written before it existed.
    #[serde(default)]
    pub latency: Option<Latency>,
    /// How sends whose outcome their sender could not know were settled, per channel. Null when
    /// the run stopped before its verdict; absent in reports written before it existed.
    #[serde(default)]
    pub uncertain: Option<Uncertain>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Tool {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DatabaseInfo {
    /// `throwaway` or `server`.
    pub kind: String,
    pub server_version: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct LoadSummary {
    pub recipients: u32,
    pub channels: Vec<String>,
    pub batches: u32,
    pub expected_deliveries: u64,
    /// Deliveries to seeded permanently bad addresses.
    pub bad_address_deliveries: u64,
    pub enqueue_latency_ms: Percentiles,
    /// Every batch's enqueue request, in order. Empty in reports written before it existed.
    #[serde(default)]
    pub batch_enqueues: Vec<BatchEnqueue>,
    /// The batches POSTed again (`[load] repeat`) and the answers.
    #[serde(default)]
    pub repeats: Vec<RepeatRecord>,
    /// Every enqueue attempt that failed (5xx, 429, no answer) and the batches never accepted.
    /// Empty in reports written before it existed.
    #[serde(default)]
    pub enqueue_failures: EnqueueFailures,
}

/// One `POST /v1/batches` of the load, on the ledger clock (the timeline's `mono_ns`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BatchEnqueue {
    pub batch_id: String,
    /// When the request was sent: the enqueue time of every delivery in the batch (end-to-end
    /// latency starts here).
    pub sent_ns: u64,
    /// When the stack's answer had been read.
    pub acked_ns: u64,
    /// One of the trickle's small orders (`[load] trickle`), not one of the batches.
    #[serde(default)]
    pub trickle: bool,
    /// The enqueue latency measured (µs), ending at `acked_ns`: from the first POST the stack
    /// was asked to answer, so shorter than `acked_ns - sent_ns` when the harness itself hung up
    /// on the first answer (`[load] repeat` `lost_answer`). 0 in reports written before it.
    #[serde(default)]
    pub latency_us: u64,
}

/// A batch POSTed again with the same `batch_id` (`[load] repeat`), and what the stack answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RepeatRecord {
    pub batch_id: String,
    pub mode: crate::load::RepeatMode,
    /// Deliveries the batch holds (recipients × channels).
    pub expected_deliveries: u64,
    /// When the original request was sent (ledger clock).
    pub original_sent_ns: u64,
    /// When its answer was read; `None` for `lost_answer` (never read).
    pub original_acked_ns: Option<u64>,
    pub original_status: Option<u16>,
    /// When the repeat was sent.
    pub sent_ns: u64,
    /// When its answer was read; `None` when it got none.
    pub acked_ns: Option<u64>,
    /// The repeat's HTTP status; `None` when it got no answer (`error` says why).
    pub status: Option<u16>,
    /// `deliveries` of the repeat's answer body, when it had one.
    pub deliveries: Option<u64>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Percentiles {
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    /// From a histogram of microseconds, in milliseconds.
    pub fn from_us(h: &hdrhistogram::Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        let ms = |v: u64| v as f64 / 1000.0;
        Percentiles {
            count: h.len(),
            p50: ms(h.value_at_quantile(0.5)),
            p90: ms(h.value_at_quantile(0.9)),
            p99: ms(h.value_at_quantile(0.99)),
            max: ms(h.max()),
        }
    }
}

impl Report {
    pub fn violated(&self) -> impl Iterator<Item = &Verdict> {
        self.checks.iter().filter(|v| v.status == Status::Violated)
    }
}

/// The JSON Schema of `report.json` (committed as `docs/report.schema.json`).
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Report)).expect("schema serializes")
}

/// Writes `value` as pretty JSON to `path` atomically.
pub fn write_json_atomic(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    atomic::write_atomic(path, |w| {
        serde_json::to_writer_pretty(w, value).map_err(std::io::Error::other)
    })
}

/// One sentence on sends the harness could not tie to a process, when there were any.
pub fn attribution_note(r: &Report) -> Option<String> {
    let n = r.sends_unattributed.filter(|n| *n > 0)?;
    let gone = r.sends_sender_gone.unwrap_or(0);
    Some(format!(
        "{n} send(s) not attributed to a process ({gone} whose sender was already gone when the \
         provider accepted its connection)"
    ))
}

/// The verdict table printed at the end of a run.
pub fn summary_text(r: &Report) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "\n{} (seed {}) — {} in {:.1}s\n",
        r.scenario_name,
        r.seed,
        r.verdict.to_uppercase(),
        r.duration_ms as f64 / 1000.0
    ));
    if let Some(e) = &r.error {
        out.push_str(&format!("  error: {e}\n"));
    }
    for v in &r.checks {
        let mark = match v.status {
            Status::Holds => "holds       ",
            Status::Insufficient => "INSUFFICIENT",
            Status::Violated => "VIOLATED    ",
            Status::NotChecked => "not checked ",
        };
        out.push_str(&format!("  {mark}  {:<18} {}\n", v.checker, v.summary));
        if v.status == Status::Violated {
            for c in v.counterexamples.iter().take(3) {
                out.push_str(&format!("               e.g. {c}\n"));
            }
            if v.total_counterexamples > 3 || v.violations_by_rule.len() > 1 {
                out.push_str(&format!(
                    "               … {} in all{} (see report.json)\n",
                    v.total_counterexamples,
                    by_rule(v)
                ));
            }
        }
    }
    for g in &r.gates {
        if g.insufficient {
            out.push_str(&format!("  GATE NO DATA {:<18} {}\n", g.kind, g.message));
        } else if g.passed {
            out.push_str(&format!(
                "  gate ok      {:<18} {} (this run {:.1})\n",
                g.kind,
                g.name,
                g.value.unwrap_or_default()
            ));
        } else {
            out.push_str(&format!("  GATE FAILED  {:<18} {}\n", g.kind, g.message));
        }
    }
    // Regressions of a report written before `gates` existed.
    if r.gates.is_empty() {
        for msg in &r.regressions {
            out.push_str(&format!("  GATE FAILED  {msg}\n"));
        }
    }
    for s in &r.chaos_steps {
        let mark = match (s.outcome, s.optional) {
            (chaos_steps::ChaosOutcome::Applied, _) => "chaos ok    ",
            (_, true) => "chaos (opt.)",
            (_, false) => "CHAOS NOT APPLIED",
        };
        out.push_str(&format!("  {mark} {}\n", s.line()));
    }
    if let Some(u) = r.uncertain.as_ref().filter(|u| !u.is_empty()) {
        out.push_str(&format!("  uncertain sends: {}\n", u.line()));
    }
    if let Some(note) = attribution_note(r) {
        out.push_str(&format!("  senders: {note}\n"));
    }
    if let Some(line) = r.machine.as_ref().and_then(|m| m.line()) {
        out.push_str(&format!("  machine: {line}\n"));
    }
    if let Some(h) = &r.harness {
        out.push_str(&format!("  harness: {}\n", h.line()));
        if let Some(warning) = h.warning() {
            out.push_str(&format!("  warning: {warning}\n"));
        }
    }
    if let Some(line) = stack_memory(&r.processes) {
        out.push_str(&format!("  stack: {line}\n"));
    }
    if let Some(p) = &r.phases {
        out.push_str(&format!("  phases: {}\n", p.line()));
    }
    out
}

/// "api peak RSS 31 MB, workers up to 58 MB (6 worker processes)": the stack processes' peak
/// resident memory, per role; `None` when none was read.
pub fn stack_memory(processes: &[ProcessRecord]) -> Option<String> {
    let peak = |role: Role| {
        let of_role = processes.iter().filter(|p| p.role == role);
        let read: Vec<u64> = of_role.filter_map(|p| p.peak_rss_kib).collect();
        Some((*read.iter().max()?, read.len()))
    };
    let mb = |kib: u64| kib.div_ceil(1024);
    let parts: Vec<String> = [
        peak(Role::Api).map(|(k, _)| format!("api peak RSS {} MB", mb(k))),
        peak(Role::Worker)
            .map(|(k, n)| format!("workers up to {} MB ({n} worker processes)", mb(k))),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// One line naming why the verdict is FAIL when no invariant was violated: the failed gates.
/// ": 55 disagrees, 55 regression" when a verdict broke more than one rule, else "".
pub fn by_rule(v: &Verdict) -> String {
    if v.violations_by_rule.len() < 2 {
        return String::new();
    }
    let parts: Vec<String> = v
        .violations_by_rule
        .iter()
        .map(|(rule, n)| format!("{n} {rule}"))
        .collect();
    format!(": {}", parts.join(", "))
}

pub fn gate_failure_line(r: &Report) -> Option<String> {
    if r.regressions.is_empty() {
        return None;
    }
    Some(format!(
        "performance gate failed: {}",
        r.regressions.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(role: Role, pid: u32, peak_rss_kib: Option<u64>) -> ProcessRecord {
        ProcessRecord {
            role,
            slot: None,
            worker_id: None,
            pid,
            started_ns: 0,
            exited_ns: None,
            exit_code: None,
            signal: None,
            sigterm_ns: None,
            killed_after_grace: false,
            log: String::new(),
            exited_unasked: false,
            log_tail: None,
            peak_rss_kib,
        }
    }

    #[test]
    fn the_stack_memory_line_names_each_roles_peak() {
        let procs = [
            process(Role::Migrate, 1, Some(9_000)),
            process(Role::Api, 2, Some(31_000)),
            process(Role::Worker, 3, Some(50_000)),
            process(Role::Worker, 4, Some(59_000)),
            process(Role::Worker, 5, None),
        ];
        assert_eq!(
            stack_memory(&procs).as_deref(),
            Some("api peak RSS 31 MB, workers up to 58 MB (2 worker processes)")
        );
        assert_eq!(stack_memory(&[process(Role::Worker, 3, None)]), None);
    }
}
