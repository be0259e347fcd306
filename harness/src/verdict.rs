//! The run's overall verdict — pass, fail, inconclusive — from its checkers' verdicts, its
//! performance gates and the chaos steps that did not take effect.
//!
//! One function decides it ([`overall`]) so the terminal, `report.json`, JUnit and the exit code
//! can never disagree. A pass must mean the harness looked: anything it could not judge makes the
//! run inconclusive (exit 4), never a pass; a violation or a failed gate makes it fail (exit 1)
//! whatever else happened.

use serde::{Deserialize, Serialize};

use crate::check::{Status, Verdict};
use crate::exit;
use crate::report::gate::GateResult;

/// The run's overall verdict (`report.json` `verdict`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunVerdict {
    Pass,
    Fail,
    Inconclusive,
    Error,
}

impl RunVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            RunVerdict::Pass => "pass",
            RunVerdict::Fail => "fail",
            RunVerdict::Inconclusive => "inconclusive",
            RunVerdict::Error => "error",
        }
    }

    pub fn exit_code(self) -> i32 {
        match self {
            RunVerdict::Pass => exit::OK,
            RunVerdict::Fail => exit::VIOLATION,
            RunVerdict::Inconclusive => exit::INCONCLUSIVE,
            RunVerdict::Error => exit::INFRA,
        }
    }
}

/// The overall verdict and why it is not a pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Overall {
    pub verdict: RunVerdict,
    /// One line per reason: a violated checker, a failed gate, an insufficient checker, a gate
    /// without data, a chaos step not applied. Empty for a pass.
    pub reasons: Vec<String>,
}

impl Overall {
    pub fn exit_code(&self) -> i32 {
        self.verdict.exit_code()
    }
}

/// Pass only when every switched-on checker holds with enough judged, every gate passed with
/// data, and `not_applied` (chaos steps that did not take effect, described) is empty. A violation
/// or failed gate is a fail; otherwise anything short is inconclusive.
pub fn overall(checks: &[Verdict], gates: &[GateResult], not_applied: &[String]) -> Overall {
    let mut failed = Vec::new();
    let mut short = Vec::new();
    for v in checks {
        match v.status {
            Status::Violated => failed.push(format!("{} violated", v.checker)),
            Status::Insufficient => short.push(format!(
                "{} insufficient: {}",
                v.checker,
                v.shortfalls().join("; ")
            )),
            Status::Holds | Status::NotChecked => {}
        }
    }
    for g in gates {
        if g.insufficient {
            short.push(format!("gate {} insufficient: {}", g.name, g.message));
        } else if !g.passed {
            failed.push(format!("gate failed: {}", g.message));
        }
    }
    short.extend(not_applied.iter().cloned());
    let verdict = if !failed.is_empty() {
        RunVerdict::Fail
    } else if !short.is_empty() {
        RunVerdict::Inconclusive
    } else {
        RunVerdict::Pass
    };
    failed.extend(short);
    Overall {
        verdict,
        reasons: failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Population;

    fn verdict(status: Status) -> Verdict {
        let mut v = Verdict {
            checker: "callbacks".into(),
            status,
            summary: String::new(),
            counterexamples: Vec::new(),
            total_counterexamples: 0,
            figures: Default::default(),
            judged: Default::default(),
            main_rule: None,
            violations_by_rule: Default::default(),
        };
        let judged = if status == Status::Insufficient { 0 } else { 5 };
        v.judged.insert(
            "disagrees".into(),
            Population {
                judged,
                min: 1,
                ..Default::default()
            },
        );
        v
    }

    fn gate(passed: bool, insufficient: bool) -> GateResult {
        GateResult {
            kind: "threshold".into(),
            name: "e2e_p99 <= 3s".into(),
            metric: "e2e_p99_ms".into(),
            limit: 3000.0,
            value: None,
            passed,
            insufficient,
            message: "no data".into(),
        }
    }

    /// (checker statuses, gates (passed, insufficient), not applied, verdict)
    type Case = (
        &'static [Status],
        &'static [(bool, bool)],
        &'static [&'static str],
        RunVerdict,
    );

    #[test]
    fn verdict_table() {
        use RunVerdict::*;
        use Status::*;
        let cases: [Case; 8] = [
            (&[Holds, NotChecked], &[(true, false)], &[], Pass),
            (&[Holds, Insufficient], &[], &[], Inconclusive),
            (&[Holds, Violated, Insufficient], &[], &[], Fail),
            (&[Holds], &[(false, true)], &[], Inconclusive),
            (&[Holds], &[(false, false)], &[], Fail),
            (&[Holds], &[(false, false), (false, true)], &[], Fail),
            (&[Holds], &[], &["chaos[0] no_target"], Inconclusive),
            (&[Violated], &[], &["chaos[0] no_target"], Fail),
        ];
        for (i, (statuses, gates, not_applied, want)) in cases.into_iter().enumerate() {
            let checks: Vec<_> = statuses.iter().map(|s| verdict(*s)).collect();
            let gates: Vec<_> = gates.iter().map(|(p, n)| gate(*p, *n)).collect();
            let na: Vec<String> = not_applied.iter().map(|s| s.to_string()).collect();
            let o = overall(&checks, &gates, &na);
            assert_eq!(o.verdict, want, "case {i}: {o:?}");
            assert_eq!(o.reasons.is_empty(), want == Pass, "case {i}");
        }
        let o = overall(&[verdict(Status::Insufficient)], &[], &[]);
        assert_eq!(o.exit_code(), exit::INCONCLUSIVE);
        assert_eq!(
            o.reasons,
            ["callbacks insufficient: disagrees judged 0 of the 1 it needs"]
        );
    }

    #[test]
    fn worst_exit_code_prefers_the_bigger_news() {
        use exit::*;
        assert_eq!(worst(OK, INCONCLUSIVE), INCONCLUSIVE);
        assert_eq!(worst(INCONCLUSIVE, VIOLATION), VIOLATION);
        assert_eq!(worst(VIOLATION, INCONCLUSIVE), VIOLATION);
        assert_eq!(worst(VIOLATION, INFRA), INFRA);
    }
}
