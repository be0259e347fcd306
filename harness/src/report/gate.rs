//! The regression gate, k6-style: a run fails when its performance falls behind a baseline run by
//! more than a tolerance, or breaks an absolute threshold (`deliveries_per_s >= 400`,
//! `e2e_p99 <= 3s`).
//!
//! It compares [`Metrics`] only — never invariants, which the checkers own. A metric a baseline
//! does not have (null, or zero: a report written before metrics existed) is never compared, so
//! an old baseline cannot fail a run by accident. A metric *this* run has no data for is never a
//! pass: its gate is insufficient (`no data`), which makes the run inconclusive.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::Metrics;

/// A figure the gate can judge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    DeliveriesPerS,
    EnqueueP99,
    E2eP50,
    E2eP99,
}

impl Metric {
    pub const ALL: [Metric; 4] = [
        Metric::DeliveriesPerS,
        Metric::EnqueueP99,
        Metric::E2eP50,
        Metric::E2eP99,
    ];
    /// The metrics a baseline comparison looks at: throughput and the tail latencies.
    pub const COMPARED: [Metric; 3] = [Metric::DeliveriesPerS, Metric::EnqueueP99, Metric::E2eP99];

    /// The field name in `report.json` `metrics`.
    pub fn name(self) -> &'static str {
        match self {
            Metric::DeliveriesPerS => "deliveries_per_s",
            Metric::EnqueueP99 => "enqueue_p99_ms",
            Metric::E2eP50 => "e2e_p50_ms",
            Metric::E2eP99 => "e2e_p99_ms",
        }
    }

    /// The name used in thresholds (no unit suffix: the value carries its unit).
    pub fn threshold_name(self) -> &'static str {
        self.name().trim_end_matches("_ms")
    }

    fn parse(name: &str) -> Option<Metric> {
        Metric::ALL
            .into_iter()
            .find(|m| name == m.name() || name == m.threshold_name())
    }

    /// Latencies are better low; throughput is better high.
    pub fn is_latency(self) -> bool {
        self != Metric::DeliveriesPerS
    }

    /// This metric's value in `m`; `None` when the run had no data for it.
    pub fn of(self, m: &Metrics) -> Option<f64> {
        match self {
            Metric::DeliveriesPerS => m.deliveries_per_s,
            Metric::EnqueueP99 => m.enqueue_p99_ms,
            Metric::E2eP50 => m.e2e_p50_ms,
            Metric::E2eP99 => m.e2e_p99_ms,
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn metric_list() -> String {
    Metric::ALL.map(Metric::threshold_name).join(", ")
}

/// Why a threshold or tolerance could not be parsed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GateError {
    #[error("threshold {0:?}: expected `METRIC OP VALUE` with OP one of >=, >, <=, < (e.g. \"deliveries_per_s >= 400\", \"e2e_p99 <= 3s\"); metrics: {list}", list = metric_list())]
    Syntax(String),
    #[error("threshold {input:?}: unknown metric {name:?}; metrics: {list}", list = metric_list())]
    UnknownMetric { input: String, name: String },
    #[error("threshold {input:?}: {value:?} is not {expected}")]
    BadValue {
        input: String,
        value: String,
        expected: &'static str,
    },
    #[error("tolerance {0:?}: expected a percentage like 15% or a share from 0 to 1 like 0.15")]
    Tolerance(String),
    #[error("tolerance {0:?}: a bare number is a share from 0 to 1; write {0}% for {0} percent")]
    ToleranceShare(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Ge,
    Gt,
    Le,
    Lt,
}

impl Op {
    fn holds(self, value: f64, limit: f64) -> bool {
        match self {
            Op::Ge => value >= limit,
            Op::Gt => value > limit,
            Op::Le => value <= limit,
            Op::Lt => value < limit,
        }
    }
}

/// An absolute limit on one metric, parsed from `"deliveries_per_s >= 400"`,
/// `"enqueue_p99 <= 50ms"`, `"e2e_p99 <= 3s"`. Latency values take a unit (`ms`, `s`, … via
/// humantime; a bare number is milliseconds); throughput values are deliveries per second.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Threshold {
    pub metric: Metric,
    pub op: Op,
    /// Milliseconds for latencies, deliveries per second for throughput.
    pub limit: f64,
    text: String,
}

impl Threshold {
    /// The threshold as written (trimmed).
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl FromStr for Threshold {
    type Err = GateError;

    fn from_str(s: &str) -> Result<Threshold, GateError> {
        let text = s.trim().to_string();
        let ops = [(">=", Op::Ge), ("<=", Op::Le), (">", Op::Gt), ("<", Op::Lt)];
        let (at, sym, op) = ops
            .iter()
            .find_map(|(sym, op)| text.find(sym).map(|at| (at, *sym, *op)))
            .ok_or_else(|| GateError::Syntax(text.clone()))?;
        let name = text[..at].trim();
        let raw = text[at + sym.len()..]
            .trim()
            .trim_matches(|c| c == '"' || c == '\'');
        if name.is_empty() || raw.is_empty() {
            return Err(GateError::Syntax(text));
        }
        let metric = Metric::parse(name).ok_or_else(|| GateError::UnknownMetric {
            input: text.clone(),
            name: name.to_string(),
        })?;
        let bad = |expected| GateError::BadValue {
            input: text.clone(),
            value: raw.to_string(),
            expected,
        };
        let limit = if metric.is_latency() {
            match raw.parse::<f64>() {
                Ok(ms) => ms,
                Err(_) => {
                    humantime::parse_duration(raw)
                        .map_err(|_| bad("a duration like 50ms or 3s"))?
                        .as_secs_f64()
                        * 1000.0
                }
            }
        } else {
            raw.trim_end_matches("/s")
                .trim()
                .parse::<f64>()
                .map_err(|_| bad("a number of deliveries per second"))?
        };
        if !limit.is_finite() || limit < 0.0 {
            return Err(bad("a finite, non-negative value"));
        }
        Ok(Threshold {
            metric,
            op,
            limit,
            text,
        })
    }
}

impl TryFrom<String> for Threshold {
    type Error = GateError;
    fn try_from(s: String) -> Result<Threshold, GateError> {
        s.parse()
    }
}

impl From<Threshold> for String {
    fn from(t: Threshold) -> String {
        t.text
    }
}

impl schemars::JsonSchema for Threshold {
    fn schema_name() -> String {
        "Threshold".into()
    }
    fn json_schema(gen: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        String::json_schema(gen)
    }
}

/// Parses `--tolerance`: `15%` or `0.15`.
pub fn parse_tolerance(s: &str) -> Result<f64, GateError> {
    let t = s.trim();
    let share = match t.strip_suffix('%') {
        Some(pct) => pct.trim().parse::<f64>().map(|p| p / 100.0),
        None => t.parse::<f64>(),
    };
    match share {
        // A bare number is a share: `15` would be 1500%, which nobody means (write `15%`).
        Ok(v) if !t.ends_with('%') && v > 1.0 && v.is_finite() => {
            Err(GateError::ToleranceShare(t.to_string()))
        }
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(GateError::Tolerance(s.to_string())),
    }
}

/// A metric that fell behind its baseline or broke a threshold.
#[derive(Debug, Clone, PartialEq)]
pub struct Regression {
    pub metric: Metric,
    /// The baseline's value, or the threshold's limit.
    pub baseline: f64,
    pub new: f64,
    /// Allowed share of change (0.15 = 15%); 0 for a threshold.
    pub tolerance: f64,
    /// Set when an absolute threshold, not a baseline, was broken.
    pub threshold: Option<Threshold>,
}

/// `15` for 0.15, `12.5` for 0.125.
fn pct(share: f64) -> String {
    let s = format!("{:.2}", share * 100.0);
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

impl fmt::Display for Regression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(t) = &self.threshold {
            let side = if matches!(t.op, Op::Ge | Op::Gt) {
                "under"
            } else {
                "over"
            };
            return write!(
                f,
                "{} {side} threshold: this run {:.1} (threshold {})",
                self.metric,
                self.new,
                t.as_str()
            );
        }
        let change = (self.new - self.baseline) / self.baseline * 100.0;
        let sign = if change < 0.0 { "−" } else { "+" };
        write!(
            f,
            "{} regressed: baseline {:.1} → this run {:.1} ({sign}{:.1}%, tolerance {}%)",
            self.metric,
            self.baseline,
            self.new,
            change.abs(),
            pct(self.tolerance)
        )
    }
}

/// A baseline's value for `metric`, when it has a usable one (not null, not zero).
fn baseline_value(metric: Metric, baseline: &Metrics) -> Option<f64> {
    metric.of(baseline).filter(|b| b.is_finite() && *b > 0.0)
}

/// Compares two runs' metrics: throughput below `baseline × (1 − tolerance)` or a tail latency
/// above `baseline × (1 + tolerance)` is a regression. A metric either run lacks is not compared
/// here ([`evaluate`] makes a missing one of the new run insufficient).
pub fn compare_metrics(baseline: &Metrics, new: &Metrics, tolerance: f64) -> Vec<Regression> {
    Metric::COMPARED
        .into_iter()
        .filter_map(|metric| {
            let b = baseline_value(metric, baseline)?;
            let n = metric.of(new)?;
            let regressed = if metric.is_latency() {
                n > b * (1.0 + tolerance)
            } else {
                n < b * (1.0 - tolerance)
            };
            regressed.then_some(Regression {
                metric,
                baseline: b,
                new: n,
                tolerance,
                threshold: None,
            })
        })
        .collect()
}

/// One performance gate and how the run fared against it (`report.json` `gates`): an absolute
/// threshold from `[expect]`, or one metric compared with `--baseline`. CI shows each as a test
/// case (`junit.xml`), failing with `message`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GateResult {
    /// `threshold` or `baseline`.
    pub kind: String,
    /// What was checked: the threshold as written (`deliveries_per_s >= 400`), or
    /// `deliveries_per_s within 15% of baseline`.
    pub name: String,
    /// The metric's name in `metrics` (`deliveries_per_s`, `e2e_p99_ms`, …).
    pub metric: String,
    /// The threshold's limit, or the baseline's value (ms for latencies, deliveries/s).
    pub limit: f64,
    /// This run's value; null when the run has no data for the metric.
    pub value: Option<f64>,
    pub passed: bool,
    /// The run has no data for the metric (no e2e latency, too few enqueues): the gate could not
    /// judge, which is never a pass (`passed` is false and the run is inconclusive).
    #[serde(default)]
    pub insufficient: bool,
    /// Why it failed, naming the metric, the threshold or baseline and the new value; empty when
    /// it passed.
    pub message: String,
}

/// Every gate of a run: each threshold, then each compared metric of a baseline (a metric the
/// baseline lacks is not compared; see the module doc). Failed ones carry the [`Regression`] line.
pub fn evaluate(
    metrics: &Metrics,
    thresholds: &[Threshold],
    baseline: Option<(&Metrics, f64)>,
) -> Vec<GateResult> {
    let mut out: Vec<GateResult> = thresholds
        .iter()
        .map(|t| {
            let value = t.metric.of(metrics);
            let failed = check_thresholds(metrics, std::slice::from_ref(t));
            GateResult {
                kind: "threshold".into(),
                name: t.as_str().to_string(),
                metric: t.metric.name().into(),
                limit: t.limit,
                value,
                passed: value.is_some() && failed.is_empty(),
                insufficient: value.is_none(),
                message: match value {
                    None => no_data(t.metric),
                    Some(_) => failed.first().map(ToString::to_string).unwrap_or_default(),
                },
            }
        })
        .collect();
    if let Some((base, tolerance)) = baseline {
        let failed = compare_metrics(base, metrics, tolerance);
        for metric in Metric::COMPARED {
            let Some(b) = baseline_value(metric, base) else {
                continue;
            };
            let hit = failed.iter().find(|r| r.metric == metric);
            let value = metric.of(metrics);
            out.push(GateResult {
                kind: "baseline".into(),
                name: format!("{} within {}% of baseline", metric.name(), pct(tolerance)),
                metric: metric.name().into(),
                limit: b,
                value,
                passed: value.is_some() && hit.is_none(),
                insufficient: value.is_none(),
                message: match value {
                    None => no_data(metric),
                    Some(_) => hit.map(ToString::to_string).unwrap_or_default(),
                },
            });
        }
    }
    out
}

/// Why a gate on `metric` could not be judged.
fn no_data(metric: Metric) -> String {
    format!("{metric}: no data in this run (nothing measured), so the gate cannot pass")
}

/// Every threshold the metrics break (a metric without data breaks none: see [`evaluate`]).
pub fn check_thresholds(metrics: &Metrics, thresholds: &[Threshold]) -> Vec<Regression> {
    thresholds
        .iter()
        .filter_map(|t| {
            let value = t.metric.of(metrics)?;
            (!t.op.holds(value, t.limit)).then(|| Regression {
                metric: t.metric,
                baseline: t.limit,
                new: value,
                tolerance: 0.0,
                threshold: Some(t.clone()),
            })
        })
        .collect()
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
