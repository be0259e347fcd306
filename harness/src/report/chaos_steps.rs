//! What each chaos step of a run did (`report.json` `chaos`): applied only when its effect was
//! observed, otherwise why not. A required step (not `optional = true`) that was not applied
//! keeps the run from passing: the schedule the scenario was written to survive did not happen.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::scenario::ChaosAction;

/// How a chaos step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChaosOutcome {
    /// Its effect was observed (see `observed`).
    Applied,
    /// It fired but found nothing to act on (no live worker matched, no session to terminate,
    /// no row to lock).
    NoTarget,
    /// It fired but the harness could not perform it here (a `db_restart` without a throwaway
    /// cluster).
    Skipped,
    /// It was performed but its effect was not observed (the signal failed, the process did not
    /// exit or stop, the cluster did not come back, a replacement did not start).
    Failed,
    /// Its trigger never fired before the run settled.
    Unfired,
}

impl ChaosOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ChaosOutcome::Applied => "applied",
            ChaosOutcome::NoTarget => "no_target",
            ChaosOutcome::Skipped => "skipped",
            ChaosOutcome::Failed => "failed",
            ChaosOutcome::Unfired => "unfired",
        }
    }
}

/// One `[[chaos]]` step and what became of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChaosStepResult {
    /// Index into `scenario.chaos` (0-based; the file's `[[chaos]] #n` is `index + 1`).
    pub index: usize,
    pub action: ChaosAction,
    /// The step may be left unapplied without consequence (`optional = true`).
    pub optional: bool,
    pub outcome: ChaosOutcome,
    /// Why the step has this outcome (what fired it, or why it was not applied).
    pub reason: String,
    /// What the harness observed, one line per effect (a process exiting by signal 9, a state
    /// `T` in `/proc/<pid>/stat`, a replacement worker's pid, the cluster accepting connections).
    #[serde(default)]
    pub observed: Vec<String>,
    /// When the trigger fired, on the ledger clock; null when it never did.
    pub fired_ns: Option<u64>,
    /// The processes it acted on.
    #[serde(default)]
    pub pids: Vec<u32>,
    /// `db_terminate`: sessions terminated. `db_idle_tx`: row locks held. `provider_outage`:
    /// send requests the outage answered 503 or held unanswered. Provider-link actions: send
    /// requests the fault met.
    #[serde(default)]
    pub count: Option<u64>,
}

impl ChaosStepResult {
    /// `chaos[1] sigkill` for people.
    pub fn name(&self) -> String {
        format!("chaos[{}] {}", self.index, action_str(self.action))
    }

    /// One line for people: `chaos[0] sigkill: applied (pid 4242 exited by signal 9 …)`.
    pub fn line(&self) -> String {
        let detail = if self.outcome == ChaosOutcome::Applied {
            self.observed.join("; ")
        } else {
            self.reason.clone()
        };
        let optional = if self.optional { " (optional)" } else { "" };
        format!(
            "{}{optional}: {} — {detail}",
            self.name(),
            self.outcome.as_str()
        )
    }
}

pub fn action_str(a: ChaosAction) -> &'static str {
    match a {
        ChaosAction::Sigkill => "sigkill",
        ChaosAction::Sigterm => "sigterm",
        ChaosAction::Sigstop => "sigstop",
        ChaosAction::Restart => "restart",
        ChaosAction::DbRestart => "db_restart",
        ChaosAction::DbTerminate => "db_terminate",
        ChaosAction::DbIdleTx => "db_idle_tx",
        ChaosAction::DbPartition => "db_partition",
        ChaosAction::DbReset => "db_reset",
        ChaosAction::DbLatency => "db_latency",
        ChaosAction::DbBandwidth => "db_bandwidth",
        ChaosAction::ProviderOutage => "provider_outage",
        ChaosAction::ProviderPartition => "provider_partition",
        ChaosAction::ProviderRefuse => "provider_refuse",
        ChaosAction::ProviderReset => "provider_reset",
        ChaosAction::ProviderLatency => "provider_latency",
    }
}

/// The required steps that did not take effect, one line each: what keeps the run from passing
/// (the overall verdict's `not_applied`).
pub fn not_applied(steps: &[ChaosStepResult]) -> Vec<String> {
    steps
        .iter()
        .filter(|s| !s.optional && s.outcome != ChaosOutcome::Applied)
        .map(|s| format!("{} {}: {}", s.name(), s.outcome.as_str(), s.reason))
        .collect()
}

/// Indices of the steps whose trigger never fired (`report.json` `chaos_unfired`).
pub fn unfired(steps: &[ChaosStepResult]) -> Vec<usize> {
    steps
        .iter()
        .filter(|s| s.outcome == ChaosOutcome::Unfired)
        .map(|s| s.index)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(index: usize, outcome: ChaosOutcome, optional: bool) -> ChaosStepResult {
        ChaosStepResult {
            index,
            action: ChaosAction::Sigkill,
            optional,
            outcome,
            reason: "why".into(),
            observed: vec!["pid 7 exited by signal 9".into()],
            fired_ns: Some(1),
            pids: vec![7],
            count: None,
        }
    }

    #[test]
    fn only_required_steps_not_applied_count() {
        use ChaosOutcome::*;
        // (outcome, optional, keeps the run from passing)
        let cases = [
            (Applied, false, false),
            (Applied, true, false),
            (NoTarget, false, true),
            (NoTarget, true, false),
            (Skipped, false, true),
            (Failed, false, true),
            (Failed, true, false),
            (Unfired, false, true),
            (Unfired, true, false),
        ];
        for (i, (outcome, optional, blocks)) in cases.into_iter().enumerate() {
            let s = [step(i, outcome, optional)];
            assert_eq!(
                not_applied(&s).len(),
                usize::from(blocks),
                "{outcome:?} optional={optional}"
            );
            assert_eq!(unfired(&s).len(), usize::from(outcome == Unfired));
        }
        let s = [step(2, NoTarget, false)];
        assert_eq!(not_applied(&s), ["chaos[2] sigkill no_target: why"]);
        assert_eq!(
            step(0, Applied, false).line(),
            "chaos[0] sigkill: applied — pid 7 exited by signal 9"
        );
    }
}
