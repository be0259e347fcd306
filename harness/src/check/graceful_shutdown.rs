//! `graceful_shutdown`: a process sent SIGTERM finishes in-flight sends, starts no new ones, and
//! exits 0 within `stack.shutdown_grace`.
//!
//! Rules per process the harness sent SIGTERM: **not_clean_exit** (no exit, a non-zero code, a
//! signal, or the harness had to SIGKILL it after the grace period), **over_grace** (exited later
//! than `sigterm + shutdown_grace`) and **sent_after_sigterm** (a send attempt attributed to its
//! pid began at a provider more than `expect.in_flight_allowance` (default 1 s) after SIGTERM:
//! its request arrived, or for SMTP its transaction's `MAIL FROM` — the final dot of a message
//! begun in time may come later on a loaded machine).
//! The allowance covers sends the worker had started when the signal landed (waiting for a
//! connection from its pool, an SMTP transaction between RCPT and DATA) on a loaded machine; it is
//! far below the grace period, so a worker that keeps claiming new work after SIGTERM still shows
//! up. It grows by the machine's stalls after the signal (`crate::stalls`): a send delayed by a
//! machine that stopped running processes is not a new one. Rule **abandoned_in_flight**: a send of the process that arrived before it exited but that
//! it hung up on before the provider answered (`client_hung_up`, answered after SIGTERM): it
//! dropped a send in flight instead of finishing it, leaving its outcome unknowable to itself.
//! A request the harness itself held with no answer to give (a provider outage in `hang` mode,
//! a partitioned link: its `fault`) is not one: no grace period can finish it, so hanging up
//! is all a draining sender can do. Attempts are
//! attributed by ledger seq → pid, and only within the process's lifetime, so a reused pid does not
//! blame the wrong process; a hung-up request whose socket was already closed when the provider
//! recorded it is attributed through another request on the same TCP connection (same local
//! address) that was attributed to the process while it lived. Must never judge from the
//! process's own log.
//!
//! Judged: processes sent SIGTERM (`not_clean_exit`, `over_grace`; none sent means not checked)
//! and the sends that arrived after a terminated process's allowance while it lived
//! (`sent_after_sigterm`): those with no known sender pid cannot be blamed or cleared, and more
//! than 1% of them makes the verdict insufficient.

use std::collections::HashMap;
use std::net::SocketAddr;

use super::Entry;
use mock_providers::ledger::EntryKind;
use mock_providers::link::LinkFault;
use mock_providers::outage::OutageMode;
use serde_json::{json, Value};

use super::common::{attempt_json, figures, gap_ms, ms, not_checked, Findings};
use super::{Input, ProcessRecord, Verdict};

pub const NAME: &str = "graceful_shutdown";

/// Whether the harness held `e` with no answer ever to come (an outage in `hang` mode, a
/// partitioned provider link): hanging up on it is not abandoning a send that could finish.
fn held_unanswered(e: &Entry) -> bool {
    e.fault().is_some_and(|f| {
        OutageMode::of_label(f) == Some(OutageMode::Hang)
            || LinkFault::of_label(f) == Some(LinkFault::Partition)
    })
}

pub fn check(input: &Input) -> Verdict {
    let termed: Vec<&ProcessRecord> = input
        .processes
        .iter()
        .filter(|p| p.sigterm_ns.is_some())
        .collect();
    if termed.is_empty() {
        return not_checked(NAME, "no process was sent SIGTERM");
    }
    let grace = input.scenario.stack.shutdown_grace;
    let mut findings = Findings::default();
    let (mut clean, mut late_sends, mut abandoned_sends) = (0u64, 0u64, 0u64);
    // Sends that arrived after a terminated process's allowance while it lived: the ones
    // `sent_after_sigterm` had to attribute, and those with no known sender.
    let (mut window_sends, mut window_unattributed) = (0u64, 0u64);
    // TCP peer → (arrival, pid) of the attributed sends it carried.
    let mut by_peer: HashMap<SocketAddr, Vec<(u64, u32)>> = HashMap::new();
    for e in input.ledger.iter().filter(|e| e.kind == EntryKind::Send) {
        if let (Some(peer), Some(pid)) = (e.peer(), input.pids.get(e.seq)) {
            by_peer.entry(peer).or_default().push((e.received_ns, pid));
        }
    }

    for p in &termed {
        let term = p.sigterm_ns.unwrap_or_default();
        let before = findings.total();
        let exited_ms = p.exited_ns.map(ms);
        let took_ms = p.exited_ns.map(|x| gap_ms(x, term));
        if p.exit_code != Some(0)
            || p.killed_after_grace
            || p.signal.is_some()
            || p.exited_ns.is_none()
        {
            findings.push(proc_json(
                p,
                "not_clean_exit",
                json!({
                    "exit_code": p.exit_code,
                    "signal": p.signal,
                    "killed_after_grace": p.killed_after_grace,
                    "exited_ms": exited_ms,
                    "took_ms": took_ms,
                }),
            ));
        } else if p
            .exited_ns
            .is_some_and(|x| x > term + grace.as_nanos() as u64)
        {
            findings.push(proc_json(
                p,
                "over_grace",
                json!({
                    "took_ms": took_ms,
                    "grace_ms": grace.as_millis() as u64,
                }),
            ));
        }

        let allowance = input.scenario.expect.in_flight_allowance;
        // The machine's stalls after the signal delay a send already in flight as much as a
        // slow sender would: the allowance grows by them.
        let limit = crate::stalls::extended(input.stalls, term, term + allowance.as_nanos() as u64);
        let alive = p.started_ns..=p.exited_ns.unwrap_or(u64::MAX);
        // A send began when its request (SMTP: its transaction) reached the provider.
        let began = |e: &Entry| e.started_ns().unwrap_or(e.received_ns);
        for e in input.ledger.iter().filter(|e| {
            e.kind == EntryKind::Send && began(e) > limit && alive.contains(&e.received_ns)
        }) {
            window_sends += 1;
            window_unattributed += u64::from(!input.pids.contains(e.seq));
        }
        let late: Vec<Value> = input
            .ledger
            .iter()
            .filter(|e| {
                e.kind == EntryKind::Send && began(e) > limit && alive.contains(&e.received_ns)
            })
            .filter(|e| input.pids.get(e.seq) == Some(p.pid))
            .map(|e| {
                let mut a = attempt_json(e, input);
                a["address"] = json!(e.recipient);
                a["after_sigterm_ms"] = json!(gap_ms(e.received_ns, term));
                a
            })
            .collect();
        if !late.is_empty() {
            late_sends += late.len() as u64;
            findings.push(proc_json(
                p,
                "sent_after_sigterm",
                json!({
                    "allowance_ms": input.scenario.expect.in_flight_allowance.as_millis() as u64,
                    "allowance_with_stalls_ms": gap_ms(limit, term),
                    "count": late.len(),
                    "sends": late.into_iter().take(20).collect::<Vec<_>>(),
                }),
            ));
        }
        let sent_by_p = |e: &Entry| match input.pids.get(e.seq) {
            Some(pid) => pid == p.pid,
            None => e
                .peer()
                .and_then(|peer| by_peer.get(&peer))
                .is_some_and(|v| {
                    v.iter()
                        .any(|(at, pid)| *pid == p.pid && alive.contains(at))
                }),
        };
        let abandoned: Vec<Value> = input
            .ledger
            .iter()
            .filter(|e| {
                e.kind == EntryKind::Send
                    && e.client_hung_up
                    && e.mono_ns >= term
                    && alive.contains(&e.received_ns)
                    && !held_unanswered(e)
            })
            .filter(|e| sent_by_p(e))
            .map(|e| {
                let mut a = attempt_json(e, input);
                a["address"] = json!(e.recipient);
                a["pid"] = json!(p.pid);
                a["answered_after_sigterm_ms"] = json!(gap_ms(e.mono_ns, term));
                a
            })
            .collect();
        if !abandoned.is_empty() {
            abandoned_sends += abandoned.len() as u64;
            findings.push(proc_json(
                p,
                "abandoned_in_flight",
                json!({
                    "count": abandoned.len(),
                    "exited_ms": exited_ms,
                    "sends": abandoned.into_iter().take(20).collect::<Vec<_>>(),
                }),
            ));
        }
        if findings.total() == before {
            clean += 1;
        }
    }

    let summary = format!(
        "{} processes sent SIGTERM: {clean} stopped cleanly within {} ms; {late_sends} sends after SIGTERM, \
         {abandoned_sends} in-flight sends abandoned",
        termed.len(),
        grace.as_millis()
    );
    let figs = figures(json!({
        "sigtermed": termed.len(),
        "clean": clean,
        "sends_after_sigterm": late_sends,
        "abandoned_in_flight": abandoned_sends,
        "grace_ms": grace.as_millis() as u64,
        "allowance_ms": input.scenario.expect.in_flight_allowance.as_millis() as u64,
    }));
    findings.judged("not_clean_exit", termed.len() as u64);
    // No send after the allowance at all is a definite "none late", not too little judged.
    findings.judged_at_least("sent_after_sigterm", window_sends - window_unattributed, 0);
    findings.unattributed("sent_after_sigterm", window_sends, window_unattributed);
    findings.verdict(NAME, summary, figs)
}

fn proc_json(p: &ProcessRecord, rule: &str, detail: Value) -> Value {
    json!({
        "rule": rule,
        "role": p.role,
        "slot": p.slot,
        "worker_id": p.worker_id,
        "pid": p.pid,
        "sigterm_ms": p.sigterm_ns.map(ms),
        "detail": detail,
    })
}

#[cfg(test)]
mod tests {
    use mock_providers::ledger::Outcome::*;

    use super::*;
    use crate::check::testkit::*;
    use crate::check::Status;
    use crate::scenario::Channel::*;

    /// Worker 7 gets SIGTERM at 1000 ms and exits 0 at 1500 ms (grace 2 s); worker 8 runs on.
    fn world() -> World {
        let mut w = World::new();
        w.scenario.expect.in_flight_allowance = std::time::Duration::from_millis(200);
        w.worker(7, 0, Some(1_500)).sigterm_ns = Some(ns(1_000));
        w.worker(8, 0, None);
        let a = w.expect("r1", Line);
        w.send(Line, &a, Transient, 900).pid(7);
        w.send(Line, &a, Transient, 1_150).pid(7); // on the wire when SIGTERM landed
        w.send(Line, &a, Accepted, 1_600).pid(8); // another worker carries on
        w
    }

    #[test]
    fn clean_stop_holds() {
        let v = check(&world().input());
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        assert_eq!(v.figures["clean"], 1);
    }

    #[test]
    fn hang_ups_that_are_not_an_abandoned_drain_hold() {
        // (case, tweak): none of these is the terminated worker dropping a send in flight.
        type Tweak = fn(&mut World);
        let cases: [(&str, Tweak); 5] = [
            // The harness held them with no answer to come: hanging up is all a drain can do.
            ("held by a provider outage in hang mode", |w| {
                let a = addr("r5", Sms);
                w.send(Sms, &a, Transient, 950)
                    .pid(7)
                    .latency(10_000)
                    .fault("outage_hang")
                    .hung_up();
            }),
            ("held by a partitioned provider link", |w| {
                let a = addr("r5", Line);
                w.send(Line, &a, Transient, 950)
                    .pid(7)
                    .latency(4_000)
                    .fault("link_partition")
                    .hung_up();
            }),
            ("another worker's timeout", |w| {
                let a = addr("r5", Sms);
                w.send(Sms, &a, Transient, 950)
                    .pid(8)
                    .latency(100)
                    .hung_up();
            }),
            ("hung up and answered before SIGTERM", |w| {
                let a = addr("r5", Sms);
                w.send(Sms, &a, Transient, 500).pid(7).hung_up();
            }),
            (
                "unattributed, its connection belonged to another worker",
                |w| {
                    let (a, b) = (addr("r5", Sms), addr("r6", Sms));
                    w.send(Sms, &a, Accepted, 200).pid(8).peer(40_002);
                    w.send(Sms, &b, Accepted, 950)
                        .unattributed()
                        .peer(40_002)
                        .latency(100)
                        .hung_up();
                },
            ),
        ];
        for (case, tweak) in cases {
            let mut w = world();
            tweak(&mut w);
            let v = check(&w.input());
            assert_eq!(v.status, Status::Holds, "{case}: {v:#?}");
        }
    }

    #[test]
    fn a_send_held_up_by_a_stalled_machine_is_not_a_new_one() {
        // A send 450 ms after SIGTERM, past the 200 ms allowance: a new send on a quiet machine,
        // but the machine stalled 300 ms right after the signal, so it is within the allowance
        // on this machine. A stall before the signal gives nothing.
        let late = |w: &mut World| {
            let a = addr("r9", Sms);
            w.send(Sms, &a, Accepted, 1_450).pid(7);
        };
        let stall = |from_ms: u64, to_ms: u64| crate::stalls::Stall {
            from_ns: ns(from_ms),
            to_ns: ns(to_ms),
        };
        let mut w = world();
        late(&mut w);
        assert_eq!(check(&w.input()).status, Status::Violated);
        w.stalls = vec![stall(400, 700)];
        assert_eq!(
            check(&w.input()).status,
            Status::Violated,
            "stall before SIGTERM"
        );
        w.stalls = vec![stall(1_050, 1_350)];
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        // The stall covers only part of the delay: still too late.
        w.stalls = vec![stall(1_050, 1_100)];
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated, "{v:#?}");
        let c = &v.counterexamples[0];
        assert_eq!(c["detail"]["allowance_with_stalls_ms"], 250.0, "{c}");
    }

    #[test]
    fn an_smtp_send_begun_in_time_whose_dot_came_late_is_in_flight() {
        // MAIL FROM at 1100 ms (100 ms after SIGTERM, within the 200 ms allowance), the final
        // dot at 1900 ms on a slow machine: a send begun in time. Begun at 1300: a new one.
        for (began, status) in [(1_100, Status::Holds), (1_300, Status::Violated)] {
            let mut w = world();
            let a = addr("r9", Email);
            w.send(Email, &a, Accepted, 1_450).pid(7).entry.started_ns = Some(ns(began));
            let v = check(&w.input());
            assert_eq!(v.status, status, "began at {began}: {v:#?}");
        }
    }

    #[test]
    fn not_checked_without_sigterm() {
        let mut w = world();
        w.processes[0].sigterm_ns = None;
        assert_eq!(check(&w.input()).status, Status::NotChecked);
    }

    #[test]
    fn each_rule_can_be_broken() {
        type Tweak = fn(&mut World);
        let cases: [(&str, Tweak, &str); 8] = [
            (
                "killed",
                |w| {
                    let p = &mut w.processes[0];
                    (p.exit_code, p.signal, p.killed_after_grace) = (None, Some(9), true);
                },
                "not_clean_exit",
            ),
            (
                "exit 1",
                |w| w.processes[0].exit_code = Some(1),
                "not_clean_exit",
            ),
            (
                "never exited",
                |w| w.processes[0].exited_ns = None,
                "not_clean_exit",
            ),
            (
                "slow",
                |w| w.processes[0].exited_ns = Some(ns(3_100)),
                "over_grace",
            ),
            (
                "new send",
                |w| {
                    let a = addr("r2", Sms);
                    w.send(Sms, &a, Accepted, 1_300).pid(7);
                },
                "sent_after_sigterm",
            ),
            (
                "abandoned, attributed",
                |w| {
                    let a = addr("r3", Sms);
                    w.send(Sms, &a, Accepted, 950).pid(7).latency(100).hung_up();
                },
                "abandoned_in_flight",
            ),
            (
                "abandoned while a seeded fault was answering",
                |w| {
                    let a = addr("r3", Sms);
                    w.send(Sms, &a, Transient, 950)
                        .pid(7)
                        .latency(100)
                        .fault("http 503")
                        .hung_up();
                },
                "abandoned_in_flight",
            ),
            (
                "abandoned, socket gone: attributed through its connection",
                |w| {
                    let (a, b) = (addr("r3", Sms), addr("r4", Sms));
                    w.send(Sms, &a, Accepted, 200).pid(7).peer(40_001);
                    w.send(Sms, &b, Accepted, 950)
                        .unattributed()
                        .peer(40_001)
                        .latency(100)
                        .hung_up();
                },
                "abandoned_in_flight",
            ),
        ];
        for (case, tweak, rule) in cases {
            let mut w = world();
            tweak(&mut w);
            let v = check(&w.input());
            assert_eq!(v.status, Status::Violated, "{case}: {v:#?}");
            assert_eq!(rules(&v), [rule], "{case}");
            let c = &v.counterexamples[0];
            assert_eq!(c["pid"], 7, "{case}");
            if rule == "abandoned_in_flight" {
                assert_eq!(c["detail"]["sends"][0]["pid"], 7, "{case}");
                assert_eq!(c["detail"]["sends"][0]["answered_after_sigterm_ms"], 50.0);
            }
            if rule == "sent_after_sigterm" {
                assert_eq!(c["detail"]["sends"][0]["after_sigterm_ms"], 300.0);
                assert_eq!(c["detail"]["sends"][0]["address"], addr("r2", Sms));
            }
        }
    }

    #[test]
    fn sends_after_sigterm_without_a_known_sender_are_insufficient() {
        // A send 300 ms after SIGTERM (past the 200 ms allowance) whose sender is unknown: it
        // may have been worker 7's, so "none sent after SIGTERM" cannot be claimed.
        let mut w = world();
        let b = w.expect("r2", Sms);
        w.send(Sms, &b, Accepted, 1_300).unattributed();
        let v = check(&w.input());
        assert_eq!(v.status, Status::Insufficient, "{v:#?}");
        assert!(v.summary.contains("no known sender pid"), "{}", v.summary);
        // One unknown among more than a hundred attributed sends is within the 1% tolerated.
        for i in 0..120 {
            let c = w.expect(&format!("r{}", 100 + i), Line);
            w.send(Line, &c, Accepted, 1_300).pid(8);
        }
        assert_eq!(check(&w.input()).status, Status::Holds);
    }
}
