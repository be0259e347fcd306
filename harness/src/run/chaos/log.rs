//! What each chaos step did, as the run observes it: when it fired, what it acted on, and every
//! effect seen (or not) afterwards. [`StepLog::result`] turns it into the report's
//! [`ChaosStepResult`]; a step counts as applied only when every effect it owes was observed.

use crate::report::chaos_steps::{ChaosOutcome, ChaosStepResult};
use crate::scenario::{ChaosStep, Trigger};

/// One step's record, filled in while the run goes on.
#[derive(Debug, Default)]
pub struct StepLog {
    /// When the trigger fired (ledger clock) and what fired it.
    fired: Option<(u64, String)>,
    /// An outcome decided at once (no target, skipped, failed to start), with its reason.
    decided: Option<(ChaosOutcome, String)>,
    /// Effects still to be observed (a process to exit, a replacement to start…).
    owed: usize,
    /// Every effect observed so far: whether it took effect, and what was seen.
    seen: Vec<(bool, String)>,
    pids: Vec<u32>,
    count: Option<u64>,
}

impl StepLog {
    pub fn fire(&mut self, at_ns: u64, why: &str) {
        self.fired = Some((at_ns, why.to_string()));
    }

    /// Adds how the step was aimed ("caught pid 7 with an SMS send in flight") to what fired it.
    pub fn aimed(&mut self, what: &str) {
        if let Some((_, why)) = &mut self.fired {
            why.push_str("; ");
            why.push_str(what);
        }
    }

    /// Decides the outcome now (nothing more will be observed).
    pub fn decide(&mut self, outcome: ChaosOutcome, reason: impl Into<String>) {
        self.decided = Some((outcome, reason.into()));
    }

    /// The step acts on `pid` and owes `effects` observations about it.
    pub fn target(&mut self, pid: u32, effects: usize) {
        self.pids.push(pid);
        self.owed += effects;
    }

    /// The step owes one more observation (a replacement worker to start).
    pub fn owe(&mut self) {
        self.owed += 1;
    }

    /// One owed effect was observed: `took_effect` and what was seen.
    pub fn observe(&mut self, took_effect: bool, what: impl Into<String>) {
        self.owed = self.owed.saturating_sub(1);
        self.seen.push((took_effect, what.into()));
    }

    pub fn count(&mut self, n: u64) {
        self.count = Some(n);
    }

    /// The report's view of step `index`.
    pub fn result(&self, index: usize, step: &ChaosStep) -> ChaosStepResult {
        let observed: Vec<String> = self.seen.iter().map(|(_, w)| w.clone()).collect();
        let failed: Vec<&str> = self
            .seen
            .iter()
            .filter(|(ok, _)| !ok)
            .map(|(_, w)| w.as_str())
            .collect();
        let (outcome, reason) = match (&self.fired, &self.decided) {
            (None, _) => (
                ChaosOutcome::Unfired,
                format!("its trigger ({}) never fired", describe(&step.trigger)),
            ),
            (Some(_), Some((o, why))) => (*o, why.clone()),
            (Some((_, why)), None) if !failed.is_empty() => (
                ChaosOutcome::Failed,
                format!("{why}: {}", failed.join("; ")),
            ),
            (Some((_, why)), None) if self.owed > 0 || self.seen.is_empty() => (
                ChaosOutcome::Failed,
                format!("{why}: its effect was not observed before the run ended"),
            ),
            (Some((_, why)), None) => (ChaosOutcome::Applied, why.clone()),
        };
        ChaosStepResult {
            index,
            action: step.action,
            optional: step.optional,
            outcome,
            reason,
            observed,
            fired_ns: self.fired.as_ref().map(|(at, _)| *at),
            pids: self.pids.clone(),
            count: self.count,
        }
    }
}

/// A trigger for people: `progress 40%`, `at 2s`, `on_accept email #120`.
pub fn describe(t: &Trigger) -> String {
    match t {
        Trigger::At(d) => format!("at {}", humantime::format_duration(*d)),
        Trigger::Progress(p) => format!("progress {:.0}%", p * 100.0),
        Trigger::OnAccept { channel, nth } => format!("on_accept {} #{nth}", channel.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::scenario::{ChaosAction, Target};

    fn step() -> ChaosStep {
        ChaosStep {
            trigger: Trigger::Progress(0.4),
            action: ChaosAction::Restart,
            target: Target::Random,
            duration: None,
            restart_after: None,
            optional: false,
            db_link: None,
            provider_fault: None,
            provider_link: None,
        }
    }

    #[test]
    fn applied_only_when_every_owed_effect_was_seen() {
        use ChaosOutcome::*;
        let s = step();
        // (what happened, outcome, reason starts with)
        type Case = (&'static str, fn(&mut StepLog), ChaosOutcome, &'static str);
        let cases: [Case; 6] = [
            (
                "never fired",
                |_| {},
                Unfired,
                "its trigger (progress 40%) never fired",
            ),
            (
                "no target",
                |l| {
                    l.fire(5, "progress 40%");
                    l.decide(NoTarget, "no live worker");
                },
                NoTarget,
                "no live worker",
            ),
            (
                "exit seen, replacement not yet",
                |l| {
                    l.fire(5, "progress 40%");
                    l.target(7, 2);
                    l.observe(true, "pid 7 exited with code 0");
                },
                Failed,
                "progress 40%: its effect was not observed",
            ),
            (
                "replacement failed",
                |l| {
                    l.fire(5, "progress 40%");
                    l.target(7, 2);
                    l.observe(true, "pid 7 exited with code 0");
                    l.observe(false, "replacement did not start");
                },
                Failed,
                "progress 40%: replacement did not start",
            ),
            (
                "fired, nothing owed, nothing seen",
                |l| l.fire(5, "progress 40%"),
                Failed,
                "progress 40%: its effect was not observed",
            ),
            (
                "both seen",
                |l| {
                    l.fire(5, "progress 40%");
                    l.target(7, 2);
                    l.observe(true, "pid 7 exited with code 0");
                    l.observe(true, "replacement pid 8 started");
                },
                Applied,
                "progress 40%",
            ),
        ];
        for (case, act, outcome, reason) in cases {
            let mut log = StepLog::default();
            act(&mut log);
            let r = log.result(3, &s);
            assert_eq!(r.outcome, outcome, "{case}: {r:?}");
            assert!(r.reason.starts_with(reason), "{case}: {}", r.reason);
            assert_eq!(r.index, 3);
        }
        assert_eq!(
            describe(&Trigger::At(Duration::from_secs(2))),
            "at 2s".to_string()
        );
    }
}
