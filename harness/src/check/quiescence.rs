//! `quiescence`: the run settled — every delivery reached a final outcome and no callback was
//! still due — before the `expect.quiescence` deadline.
//!
//! The harness decides quiescence while it runs (it polls the ledger and the callback queue);
//! this checker only reports that decision, with the open deliveries as counterexamples. Must
//! never re-derive it from the ledger: the other checkers already judge each delivery's end.
//! Judged: every expected delivery (needs one).
//!
//! Past the deadline the harness waits on while deliveries keep settling (a slow stack is not a
//! stuck one), at most twice the deadline more: settling then holds, and says how late. The
//! deadline counts from the wait's start, or from the fakes' last planned delivery report or the
//! end of the last chaos action when a scenario schedules those later (`deadline_ms`): until
//! then the stack could not have settled what they hold up.
//!
//! A run still settling when the wait ends at its hard deadline (some delivery settled, the
//! stack answered a delivery report, or a hung provider held its requests — it waits for its own
//! timeout — within the last 10 s) is a slow stack the run did not see
//! finish, not a stuck one: `insufficient`, with how many deliveries were still open and reports
//! still due — never `holds`, never `violated` (a correct stack that is slower than the scenario
//! assumed, e.g. one that sheds a flood of reports with 503 and takes them as it can, must not
//! fail it). A stack that stops settling and stops taking reports is still a stall.
//!
//! A row open at the deadline only because it is `submitted` and waits for a delivery report the
//! fakes no longer had to send (the stack answered every try with an error or not at all, and
//! they gave up) is not a stuck stack: it never learned the outcome. Those rows are unjudged
//! (`awaiting_report`): with nothing else open the verdict is insufficient, and `callbacks`
//! judges the reports (a report the stack acknowledged and did not apply is its violation).
//!
//! Nor is a delivery open on a channel the chaos left with no worker that had ever sent it
//! ([`super::orphans`]): stopped for good, the only workers that served that channel could not
//! settle it. Those rows are unjudged (`orphaned`), and with nothing else open the verdict is
//! insufficient, naming the workers the run took away.

use serde_json::json;

use super::common::{figures, ms, Findings};
use super::{Input, Status, Verdict};
use crate::scenario::Channel;

pub const NAME: &str = "quiescence";

pub fn check(input: &Input) -> Verdict {
    let q = input.quiescence;
    let mut findings = Findings::default();
    findings.judged("open_delivery", input.expected.len() as u64);
    // The deadline the wait applied: `expect.quiescence`, or counted from the fakes' last
    // planned delivery report or the last chaos action when those came later (the harness's
    // schedule, not the stack's).
    let deadline_ms = q
        .deadline_ms
        .unwrap_or(input.scenario.expect.quiescence.as_millis() as u64);
    let mut figs = figures(json!({
        "reached": q.reached,
        "at_ms": ms(q.at_ns),
        "open": q.open.len(),
        "callbacks_pending": q.callbacks_pending,
        "awaiting_report": q.awaiting_report.len(),
        "past_deadline_ms": q.past_deadline_ms,
        "deadline_ms": deadline_ms,
        "stopped_early": q.stopped_early,
        "still_settling": q.still_settling,
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
        let late = q
            .past_deadline_ms
            .map(|l| {
                format!(" ({l} ms past the {deadline_ms} ms deadline, still settling deliveries)")
            })
            .unwrap_or_default();
        let summary = format!(
            "settled at {} ms{late}: all deliveries final, no callbacks due",
            ms(q.at_ns)
        );
        return findings.verdict(NAME, summary, figs);
    }
    if q.still_settling {
        let summary = format!(
            "not judged: still settling when the wait ended {} ms past the {deadline_ms} ms \
             deadline ({} deliveries open, {} callbacks due; a delivery settled, a callback \
             was answered or a provider held the stack's requests within 10 s): slow, not \
             stuck; raise expect.quiescence to see it finish",
            q.past_deadline_ms.unwrap_or(0),
            q.open.len(),
            q.callbacks_pending
        );
        return findings.verdict_with(NAME, Status::Insufficient, summary, figs);
    }
    let awaiting: std::collections::HashSet<&String> = q.awaiting_report.iter().collect();
    let orphans = input.orphans();
    let orphaned = |d: &str| {
        d.rsplit_once('/')
            .and_then(|(_, c)| Channel::ALL.into_iter().find(|ch| ch.as_str() == c))
            .is_some_and(|c| orphans.contains(c))
    };
    let mut unjudged = (0usize, 0usize);
    for d in &q.open {
        if awaiting.contains(d) {
            unjudged.0 += 1;
        } else if orphaned(d) {
            unjudged.1 += 1;
        } else {
            findings.push(json!({"rule": "open_delivery", "delivery": d}));
        }
    }
    figs.insert("orphaned".into(), json!(unjudged.1));
    if findings.total() == 0 && q.callbacks_pending == 0 && unjudged != (0, 0) {
        let mut why = Vec::new();
        if unjudged.0 > 0 {
            why.push(format!(
                "{} submitted rows whose delivery report the fakes had given up on (see callbacks)",
                unjudged.0
            ));
        }
        if unjudged.1 > 0 {
            why.push(format!("{} rows {}", unjudged.1, orphans.why()));
        }
        let summary = format!(
            "not settled within {deadline_ms} ms only by {}: not judged",
            why.join(", and ")
        );
        return findings.verdict_with(NAME, Status::Insufficient, summary, figs);
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
    fn rows_waiting_for_a_report_the_fakes_gave_up_on_are_not_judged() {
        let mut w = World::new();
        w.expect("r1", crate::scenario::Channel::Sms);
        w.quiescence.reached = false;
        w.quiescence.open = vec!["r1/sms".into(), "r2/sms".into()];
        w.quiescence.awaiting_report = vec!["r1/sms".into(), "r2/sms".into()];
        let v = check(&w.input());
        assert_eq!(v.status, Status::Insufficient, "{v:#?}");
        assert_eq!(v.figures["awaiting_report"], 2);
        // Nothing awaiting and nothing open, yet not settled (chaos still under way at the
        // deadline): the old verdict, not an excuse.
        let mut idle = World::new();
        idle.expect("r1", crate::scenario::Channel::Sms);
        idle.quiescence.reached = false;
        assert_eq!(check(&idle.input()).status, Status::Violated);
        // Anything else open is still a stuck stack.
        w.quiescence.open.push("r3/line".into());
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated);
        assert_eq!(v.total_counterexamples, 1);
        assert_eq!(v.counterexamples[0]["delivery"], "r3/line");
    }

    #[test]
    fn settling_past_the_deadline_while_progressing_holds_and_says_so() {
        let mut w = World::new();
        w.expect("r1", crate::scenario::Channel::Line);
        w.quiescence.past_deadline_ms = Some(4_200);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds);
        assert!(v.summary.contains("4200 ms past the"), "{}", v.summary);
        assert_eq!(v.figures["past_deadline_ms"], 4_200);
    }

    /// The deadline the wait applied, moved by the fakes' own late reports, is the one named.
    #[test]
    fn a_deadline_moved_by_late_reports_is_the_one_judged_and_named() {
        let mut w = World::new();
        w.expect("r1", crate::scenario::Channel::Sms);
        w.quiescence.reached = false;
        w.quiescence.open = vec!["r1/sms".into()];
        w.quiescence.deadline_ms = Some(16_000);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated);
        assert!(
            v.summary.contains("not settled within 16000 ms"),
            "{}",
            v.summary
        );
        assert_eq!(v.figures["deadline_ms"], 16_000);
    }

    /// A slow stack still settling at the hard deadline is inconclusive, also while it still has
    /// callbacks due that it is taking in; one that stopped settling is violated.
    #[test]
    fn still_settling_at_the_hard_deadline_is_insufficient_not_violated() {
        let mut w = World::new();
        w.expect("r1", crate::scenario::Channel::Line);
        w.quiescence.reached = false;
        w.quiescence.open = vec!["r1/line".into()];
        w.quiescence.past_deadline_ms = Some(120_000);
        w.quiescence.still_settling = true;
        let v = check(&w.input());
        assert_eq!(v.status, Status::Insufficient, "{v:#?}");
        assert!(v.summary.contains("slow, not stuck"), "{}", v.summary);
        assert_eq!(v.figures["still_settling"], true);
        w.quiescence.callbacks_pending = 9_099;
        let v = check(&w.input());
        assert_eq!(v.status, Status::Insufficient, "{v:#?}");
        assert!(v.summary.contains("9099 callbacks due"), "{}", v.summary);
        w.quiescence.still_settling = false;
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated);
        assert_eq!(
            rules(&v),
            vec!["open_delivery".to_string(), "callbacks_pending".to_string()]
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

    /// Open only on a channel the chaos left with no worker that had sent it: unjudged. Anything
    /// else open beside it is still a stuck stack, and only that is listed.
    #[test]
    fn rows_open_on_a_channel_the_chaos_left_without_a_sender_are_not_judged() {
        let mut w = crate::check::orphans::line_orphaned();
        let v = check(&w.input());
        assert_eq!(v.status, Status::Insufficient, "{v:#?}");
        assert_eq!(v.figures["orphaned"], 1);
        assert!(
            v.summary
                .contains("the chaos stopped and nothing replaced: line (worker pid 200)"),
            "{}",
            v.summary
        );
        w.quiescence.open.push("r1/sms".into());
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated);
        assert_eq!(v.total_counterexamples, 1);
        assert_eq!(v.counterexamples[0]["delivery"], "r1/sms");
    }
}
