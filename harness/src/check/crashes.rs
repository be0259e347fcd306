//! `crashes`: no stack process exited before the harness asked it to stop.
//!
//! The contract asks the API to serve and every worker to claim and send until SIGTERM; neither
//! may end on its own (a crash at startup, a panic, a crash loop, an exit 0 out of turn). Rule
//! **process_crashed**: a process whose record says it exited unasked — the supervisor sets that
//! when it reaps a process the harness had sent no signal (SIGCONT aside) and that was not being
//! torn down; `migrate` is meant to exit and is never judged. Each counterexample names the process
//! (role, slot, worker id, pid), its exit status and the tail of its log. The harness also stops the
//! run early when such a crash leaves nothing to make progress (the API is gone, or no worker is
//! alive and none is due to restart): a run waiting out its deadline for a dead stack proves
//! nothing more. Judged: the stack processes started (migrate aside; needs one). Must never judge
//! from the log's content: only from how the process ended.

use serde_json::json;

use super::common::{figures, ms, Findings};
use super::{Input, ProcessRecord, Verdict};

pub const NAME: &str = "crashes";

pub fn check(input: &Input) -> Verdict {
    let judged: Vec<&ProcessRecord> = input
        .processes
        .iter()
        .filter(|p| p.role != super::Role::Migrate)
        .collect();
    let mut findings = Findings::default();
    for p in judged.iter().filter(|p| p.exited_unasked) {
        findings.push(json!({
            "rule": "process_crashed",
            "process": describe(p),
            "role": p.role,
            "slot": p.slot,
            "worker_id": p.worker_id,
            "pid": p.pid,
            "exit_code": p.exit_code,
            "signal": p.signal,
            "started_ms": ms(p.started_ns),
            "exited_ms": p.exited_ns.map(ms),
            "log": p.log,
            "log_tail": p.log_tail,
        }));
    }
    let crashed = findings.total();
    let summary = match judged.iter().find(|p| p.exited_unasked) {
        None => format!("{} stack processes, none exited on its own", judged.len()),
        Some(first) => format!(
            "{crashed} of {} stack processes exited on their own; first: {} with {}",
            judged.len(),
            describe(first),
            exit_status(first)
        ),
    };
    let figs = figures(json!({ "processes": judged.len(), "crashed": crashed }));
    findings.judged("process_crashed", judged.len() as u64);
    findings.verdict(NAME, summary, figs)
}

/// `worker 2 (w2, pid 4242)`, `api (pid 4240)`.
pub fn describe(p: &ProcessRecord) -> String {
    let slot = p.slot.map(|s| format!(" {s}")).unwrap_or_default();
    let id = p
        .worker_id
        .as_deref()
        .map(|id| format!("{id}, "))
        .unwrap_or_default();
    format!("{}{slot} ({id}pid {})", p.role, p.pid)
}

/// `exit 3`, `signal 6`, or `an unknown status`.
pub fn exit_status(p: &ProcessRecord) -> String {
    match (p.exit_code, p.signal) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(s)) => format!("signal {s}"),
        (None, None) => "an unknown status".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;
    use crate::check::Status;

    #[test]
    fn a_worker_that_exits_unasked_is_named_with_its_status_and_log() {
        let mut w = World::new();
        let p = w.worker(41, 0, Some(300));
        p.exit_code = Some(3);
        p.worker_id = Some("w1".into());
        p.exited_unasked = true;
        p.log_tail = Some("error: cannot connect\nbye".into());
        w.worker(42, 0, None);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated);
        assert_eq!(rules(&v), ["process_crashed"]);
        let c = &v.counterexamples[0];
        assert_eq!(c["process"], "worker 1 (w1, pid 41)");
        assert_eq!(c["exit_code"], 3);
        assert_eq!(c["log_tail"], "error: cannot connect\nbye");
        assert!(
            v.summary.contains("worker 1 (w1, pid 41) with exit 3"),
            "{}",
            v.summary
        );
    }

    /// Processes the harness stopped (chaos SIGKILL, SIGTERM, teardown) and a migration that
    /// finished are not crashes, whatever their status.
    #[test]
    fn exits_the_harness_asked_for_are_not_crashes() {
        let mut w = World::new();
        let killed = w.worker(41, 0, Some(300));
        killed.signal = Some(9);
        w.worker(42, 0, Some(900)).sigterm_ns = Some(ns(800));
        let migrate = w.worker(40, 0, Some(10));
        migrate.role = crate::check::Role::Migrate;
        migrate.exit_code = Some(1);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        assert_eq!(v.figures["processes"], 2);
    }
}
