//! `quiescence`: the run settled — every delivery reached a final outcome and no callback was
//! still due — before the `expect.quiescence` deadline.
//!
//! The harness decides quiescence while it runs (it polls the ledger and the callback queue);
//! this checker only reports that decision, with the open deliveries as counterexamples. Must
//! never re-derive it from the ledger: the other checkers already judge each delivery's end.
//! Judged: every expected delivery (needs one).

use serde_json::json;

use super::common::{figures, ms, Findings};
use super::{Input, Status, Verdict};

pub const NAME: &str = "quiescence";

pub fn check(input: &Input) -> Verdict {
    let q = input.quiescence;
    let mut findings = Findings::default();
    findings.judged("open_delivery", input.expected.len() as u64);
    let deadline_ms = input.scenario.expect.quiescence.as_millis() as u64;
    let figs = figures(json!({
        "reached": q.reached,
        "at_ms": ms(q.at_ns),
        "open": q.open.len(),
        "callbacks_pending": q.callbacks_pending,
        "deadline_ms": deadline_ms,
        "stopped_early": q.stopped_early,
    }));
    if let Some(why) = &q.stopped_early {
        let summary = format!(
            "not judged: the run was stopped at {} ms because {why} ({} deliveries open)",
            ms(q.at_ns),
            q.open.len()
        );
        return findings.verdict_with(NAME, Status::NotChecked, summary, figs);
    }
    if q.reached {
        let summary = format!(
            "settled at {} ms: all deliveries final, no callbacks due",
            ms(q.at_ns)
        );
        return findings.verdict(NAME, summary, figs);
    }
    for d in &q.open {
        findings.push(json!({"rule": "open_delivery", "delivery": d}));
    }
    if q.callbacks_pending > 0 {
        findings.push(json!({"rule": "callbacks_pending", "count": q.callbacks_pending}));
    }
    let summary = format!(
        "not settled within {deadline_ms} ms: {} deliveries open, {} callbacks pending",
        q.open.len(),
        q.callbacks_pending
    );
    findings.verdict_with(NAME, Status::Violated, summary, figs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;

    #[test]
    fn reached_holds_and_unsettled_lists_what_is_open() {
        let mut w = World::new();
        w.quiescence.at_ns = ns(1_234);
        assert_eq!(
            check(&w.input()).status,
            Status::Insufficient,
            "nothing expected"
        );
        w.expect("r1", crate::scenario::Channel::Line);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds);
        assert!(v.summary.contains("1234 ms"), "{}", v.summary);

        w.quiescence.reached = false;
        w.quiescence.open = (0..60).map(|i| format!("r{i}/sms")).collect();
        w.quiescence.callbacks_pending = 2;
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated);
        assert_eq!(v.total_counterexamples, 61);
        assert_eq!(v.counterexamples.len(), 50);
        assert_eq!(v.counterexamples[0]["delivery"], "r0/sms");
        assert_eq!(v.figures["callbacks_pending"], 2);
    }

    /// A run stopped early (a crash left nothing to make progress) is not judged here: the
    /// `crashes` checker names the cause, and the wait that did not happen proves nothing.
    #[test]
    fn a_run_stopped_early_is_not_judged() {
        let mut w = World::new();
        w.quiescence.reached = false;
        w.quiescence.open = vec!["r1/sms".into()];
        w.quiescence.stopped_early = Some("the API exited on its own".into());
        let v = check(&w.input());
        assert_eq!(v.status, Status::NotChecked);
        assert!(
            v.summary.contains("the API exited on its own"),
            "{}",
            v.summary
        );
    }

    #[test]
    fn unsettled_by_callbacks_alone_is_violated() {
        let mut w = World::new();
        w.quiescence.reached = false;
        w.quiescence.callbacks_pending = 1;
        let v = check(&w.input());
        assert_eq!(
            (v.status, rules(&v)),
            (Status::Violated, vec!["callbacks_pending".to_string()])
        );
    }
}
