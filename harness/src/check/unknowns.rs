//! Why a delivery may end `unknown`: the one thing that excuses it is that its sender could not
//! learn how its last attempt ended. Used by `no_loss`.
//!
//! From first principles: a stack learns an attempt's outcome when the provider's answer reaches
//! the process that made the attempt and that process records it. An attempt is *in flight* from
//! the moment its sender starts it until that record; a correct stack can hold a delivery as
//! `unknown` only if something cut that span short:
//!
//! - **chaos on the holder**: the process that made the attempt was SIGKILLed, SIGSTOPped, or
//!   SIGTERMed and then killed when its grace period ran out (`grace_exceeded`); or its database
//!   went away under it (`db_terminate`, `db_restart`: every process at once);
//! - **the machine's wall clock jumped forward** by `lease − heartbeat` or more (`crate::jumps`)
//!   in that window: the lease the holder had, timed by that clock and renewed every heartbeat,
//!   lapsed at once and the row may have been rescued as `unknown` under a live sender;
//! - **the provider cut the answer**: it committed or dropped the attempt and closed the
//!   connection before answering (`accept_then_drop`, `drop_mid_data`), or the sender's link
//!   was reset under it (`link_refuse`, `link_reset`), or the sender hung up
//!   before the answer came (`client_hung_up`: its own timeout against a slow provider).
//!
//! The harness sees an attempt's arrival (`received_ns`) and answer (`mono_ns`) but neither its
//! start nor its record, so the window is widened on both sides by what a correct stack may take:
//! an event counts from one lease before the arrival (bytes written before a kill are read by the
//! provider later) to one lease plus one heartbeat after the answer (a live worker records within
//! its lease; a frozen or slow one loses the lease and the row is rescued as `unknown`).
//!
//! An attempt can also leave no ledger entry: an SMTP transaction abandoned before its final dot
//! is never recorded, nor an HTTP request the provider never read. When the recorded attempts'
//! holders explain nothing, the holder of such an attempt cannot be named, and any chaos event on
//! a worker or the database after the last recorded attempt arrived excuses it, named as such. An
//! `unknown` with no chaos and no cut answer after its last recorded attempt is unexplained.

use super::Entry;
use serde_json::{json, Value};

use super::common::ms;
use super::{EventKind, Input, TimelineEvent};

/// Provider faults that close the connection before the sender reads an answer.
const CUT_FAULTS: [&str; 2] = ["accept_then_drop", "drop_mid_data"];

/// Whether the provider fault `fault` closes the connection before the sender reads an answer:
/// a seeded drop, or a reset of the sender's link (`link_refuse`: before the provider read the
/// request, which the sender cannot tell from after; `link_reset`: after it served it).
pub fn cuts_answer(fault: &str) -> bool {
    use mock_providers::link::LinkFault;
    CUT_FAULTS.contains(&fault)
        || matches!(
            LinkFault::of_label(fault),
            Some(LinkFault::Refuse | LinkFault::Reset)
        )
}

/// What kind of thing excuses an `unknown` delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExcuseKind {
    /// A chaos event hit the sender of a recorded attempt while it was in flight.
    Chaos,
    /// A chaos event after the last recorded attempt: the attempt in flight left no entry, so
    /// its holder cannot be named.
    ChaosUnattributed,
    /// The provider cut the answer (dropped the connection), or the sender hung up before it.
    Provider,
    /// The machine's wall clock jumped forward while an attempt was in flight: the lease its
    /// sender held, timed by that clock, lapsed at once (`crate::jumps`).
    ClockJump,
}

impl ExcuseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ExcuseKind::Chaos => "chaos",
            ExcuseKind::ChaosUnattributed => "chaos_unattributed",
            ExcuseKind::Provider => "provider",
            ExcuseKind::ClockJump => "clock_jump",
        }
    }
}

/// What excuses an `unknown` delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct Excuse {
    pub kind: ExcuseKind,
    /// One sentence naming the event or fault and the attempt.
    pub because: String,
    /// The timeline event, when a chaos event is the reason.
    pub event: Option<Value>,
}

impl Excuse {
    pub fn to_json(&self) -> Value {
        json!({ "kind": self.kind.as_str(), "because": self.because, "event": self.event })
    }
}

/// Kinds of timeline events that cut an attempt short. Process events (a database-link partition
/// or reset among them) name the pid they hit; database events hit every process.
fn cuts(ev: &TimelineEvent) -> bool {
    use EventKind::*;
    matches!(
        ev.kind,
        Sigkill | Sigstop | GraceExceeded | DbTerminate | DbRestart
    ) || ev.kind.cuts_database_link()
}

fn hits(ev: &TimelineEvent, pid: Option<u32>) -> bool {
    match ev.pid {
        Some(p) => pid == Some(p),
        None => ev.kind.is_database(),
    }
}

fn event_json(ev: &TimelineEvent) -> Value {
    json!({ "kind": ev.kind, "pid": ev.pid, "at_ms": ms(ev.mono_ns), "detail": ev.detail })
}

fn event_words(ev: &TimelineEvent) -> String {
    let label = ev.kind.label();
    match ev.pid {
        Some(p) => format!("{label} of pid {p} at {:.1} ms", ms(ev.mono_ns)),
        None => format!("{label} at {:.1} ms", ms(ev.mono_ns)),
    }
}

/// Why the delivery whose send attempts are `attempts` (arrival order) may be `unknown`, or
/// `None` when nothing explains it.
pub fn excuse(input: &Input, attempts: &[&Entry]) -> Option<Excuse> {
    let lease = input.scenario.stack.lease.as_nanos() as u64;
    let heartbeat = input.scenario.stack.heartbeat.as_nanos() as u64;
    // When an event can have cut attempt `a` short: from a lease before it arrived to a lease
    // and a heartbeat after its answer.
    let window = |a: &Entry| {
        (
            a.received_ns.saturating_sub(lease),
            a.mono_ns + lease + heartbeat,
        )
    };
    // Latest attempt first: the one in flight last is the one the stack could not settle.
    for a in attempts.iter().rev() {
        let pid = input.pids.get(a.seq);
        let (from, to) = window(a);
        let hit = input
            .timeline
            .iter()
            .filter(|ev| cuts(ev) && hits(ev, pid) && (from..=to).contains(&ev.mono_ns))
            .min_by_key(|ev| ev.mono_ns.abs_diff(a.mono_ns));
        if let Some(ev) = hit {
            return Some(Excuse {
                kind: ExcuseKind::Chaos,
                because: format!(
                    "{} while attempt #{} (arrived {:.1} ms, answered {:.1} ms) was in flight",
                    event_words(ev),
                    a.attempt,
                    ms(a.received_ns),
                    ms(a.mono_ns)
                ),
                event: Some(event_json(ev)),
            });
        }
    }
    for a in attempts.iter().rev() {
        let (from, to) = window(a);
        let lapses = lease.saturating_sub(heartbeat);
        if let Some(j) = crate::jumps::lapsing(input.clock_jumps, from, to, lapses) {
            return Some(Excuse {
                kind: ExcuseKind::ClockJump,
                because: format!(
                    "the wall clock jumped {:+.0} ms at {:.1} ms while attempt #{} (arrived \
                     {:.1} ms, answered {:.1} ms) was in flight: the lease timed by it lapsed",
                    j.by_ns as f64 / 1e6,
                    ms(j.at_ns),
                    a.attempt,
                    ms(a.received_ns),
                    ms(a.mono_ns)
                ),
                event: None,
            });
        }
    }
    if let Some(a) = attempts.last() {
        if let Some(fault) = a.fault().filter(|f| cuts_answer(f)) {
            return Some(Excuse {
                kind: ExcuseKind::Provider,
                because: format!(
                    "the provider closed the connection before answering attempt #{} ({fault})",
                    a.attempt
                ),
                event: None,
            });
        }
        if a.client_hung_up {
            return Some(Excuse {
                kind: ExcuseKind::Provider,
                because: format!(
                    "the sender hung up before the provider answered attempt #{} ({:.1} ms after it arrived)",
                    a.attempt,
                    ms(a.mono_ns.saturating_sub(a.received_ns))
                ),
                event: None,
            });
        }
    }
    // An attempt that left no entry: any cutting event after the last recorded attempt arrived.
    let after = attempts.last().map_or(0, |a| a.received_ns);
    let ev = input
        .timeline
        .iter()
        .filter(|ev| cuts(ev) && (ev.pid.is_some() || ev.kind.is_database()))
        .find(|ev| ev.mono_ns >= after)?;
    let since = match attempts.last() {
        Some(a) => format!("after attempt #{} arrived", a.attempt),
        None => "before any attempt was recorded".to_string(),
    };
    Some(Excuse {
        kind: ExcuseKind::ChaosUnattributed,
        because: format!(
            "{} {since}: an attempt it cut short leaves no ledger entry (an SMTP transaction \
             before its final dot), so its holder cannot be named",
            event_words(ev)
        ),
        event: Some(event_json(ev)),
    })
}

#[cfg(test)]
mod tests {
    use mock_providers::ledger::Outcome::*;

    use super::*;
    use crate::check::testkit::*;
    use crate::scenario::Channel::*;

    /// (case, build the world, expected excuse kind, text the reason contains)
    type Case = (
        &'static str,
        fn(&mut World),
        Option<&'static str>,
        &'static str,
    );

    #[test]
    fn excuses_at_both_edges() {
        // Base lease 1 s, heartbeat 200 ms (testkit::BASE).
        let cases: [Case; 20] = [
            (
                "kill between request and answer",
                |w| {
                    w.send(Email, &addr("r1", Email), Accepted, 100)
                        .pid(7)
                        .latency(50);
                    w.event(EventKind::Sigkill, Some(7), 120);
                },
                Some("chaos"),
                "sigkill of pid 7 at 120.0 ms while attempt #1",
            ),
            (
                "stop after the answer, before the record",
                |w| {
                    w.send(Email, &addr("r1", Email), Transient, 100).pid(7);
                    w.event(EventKind::Sigstop, Some(7), 900);
                },
                Some("chaos"),
                "sigstop of pid 7",
            ),
            (
                "grace ran out",
                |w| {
                    w.send(Email, &addr("r1", Email), Transient, 100).pid(7);
                    w.event(EventKind::GraceExceeded, Some(7), 600);
                },
                Some("chaos"),
                "grace_exceeded of pid 7",
            ),
            (
                "database restarted under every process",
                |w| {
                    w.send(Email, &addr("r1", Email), Transient, 100).pid(7);
                    w.event(EventKind::DbRestart, None, 300);
                },
                Some("chaos"),
                "db_restart at 300.0 ms",
            ),
            (
                "kill of the holder after its attempt left no entry",
                |w| {
                    w.send(Email, &addr("r1", Email), Transient, 100).pid(7);
                    w.event(EventKind::Sigkill, Some(8), 5_000);
                },
                Some("chaos_unattributed"),
                "sigkill of pid 8 at 5000.0 ms after attempt #1 arrived",
            ),
            (
                "provider dropped the connection",
                |w| {
                    w.send(Email, &addr("r1", Email), Accepted, 100)
                        .pid(7)
                        .entry
                        .fault = Some("accept_then_drop".into());
                },
                Some("provider"),
                "(accept_then_drop)",
            ),
            (
                "the holder's database link partitioned after its answer",
                |w| {
                    w.send(Email, &addr("r1", Email), Accepted, 100)
                        .pid(7)
                        .latency(50);
                    w.event(EventKind::DbLinkPartition, Some(7), 130);
                },
                Some("chaos"),
                "db_link_partition of pid 7 at 130.0 ms",
            ),
            (
                "a partition after the last attempt, which may have left no entry",
                |w| {
                    w.send(Email, &addr("r1", Email), Transient, 100).pid(7);
                    w.event(EventKind::DbLinkPartition, Some(8), 5_000);
                    w.event(EventKind::DbLinkHeal, Some(8), 9_000);
                },
                Some("chaos_unattributed"),
                "db_link_partition of pid 8 at 5000.0 ms after attempt #1 arrived",
            ),
            (
                "a slow link cuts nothing",
                |w| {
                    w.send(Email, &addr("r1", Email), Accepted, 100)
                        .pid(7)
                        .latency(50);
                    w.event(EventKind::DbLinkSlow, Some(7), 130);
                },
                None,
                "",
            ),
            (
                "the sender's link to the provider reset before the answer",
                |w| {
                    w.send(Sms, &addr("r1", Sms), Accepted, 100)
                        .pid(7)
                        .fault("link_reset");
                },
                Some("provider"),
                "(link_reset)",
            ),
            (
                "the sender's link to the provider reset before the request was read",
                |w| {
                    w.send(Sms, &addr("r1", Sms), Transient, 100)
                        .pid(7)
                        .fault("link_refuse");
                },
                Some("provider"),
                "(link_refuse)",
            ),
            (
                "held by a partition until the sender hung up",
                |w| {
                    w.send(Sms, &addr("r1", Sms), Transient, 100)
                        .pid(7)
                        .fault("link_partition")
                        .hung_up();
                },
                Some("provider"),
                "the sender hung up",
            ),
            (
                "a slowed provider link the sender waited out cuts nothing",
                |w| {
                    w.send(Sms, &addr("r1", Sms), Accepted, 100)
                        .pid(7)
                        .latency(2_000);
                    w.event(EventKind::ProviderLinkSlow, Some(7), 50);
                    w.event(EventKind::ProviderLinkHeal, Some(7), 3_000);
                },
                None,
                "",
            ),
            ("no chaos at all", |_| {}, None, ""),
            (
                "a SIGTERM that drained is no excuse",
                |w| {
                    w.send(Email, &addr("r1", Email), Transient, 100).pid(7);
                    w.event(EventKind::Sigterm, Some(7), 150);
                },
                None,
                "",
            ),
            (
                "a kill long before the last attempt",
                |w| {
                    w.event(EventKind::Sigkill, Some(8), 50);
                    w.send(Email, &addr("r1", Email), Transient, 2_000).pid(7);
                },
                None,
                "",
            ),
            (
                "the wall clock jumped forward while the attempt was in flight",
                |w| {
                    w.send(Email, &addr("r1", Email), Accepted, 100).pid(7);
                    w.clock_jump(400, 8_300);
                },
                Some("clock_jump"),
                "the wall clock jumped +8300 ms at 400.0 ms while attempt #1",
            ),
            (
                "a forward jump long before the attempt",
                |w| {
                    w.send(Email, &addr("r1", Email), Accepted, 2_000).pid(7);
                    w.clock_jump(500, 8_300);
                },
                None,
                "",
            ),
            (
                "a forward jump too small to lapse a lease renewed every heartbeat",
                |w| {
                    w.send(Email, &addr("r1", Email), Accepted, 100).pid(7);
                    w.clock_jump(400, 700);
                },
                None,
                "",
            ),
            (
                "a backward jump while it was in flight",
                |w| {
                    w.send(Email, &addr("r1", Email), Accepted, 100).pid(7);
                    w.clock_jump(400, -8_300);
                },
                None,
                "",
            ),
        ];
        for (case, build, kind, text) in cases {
            let mut w = World::new();
            w.expect("r1", Email);
            w.expect("r1", Sms);
            build(&mut w);
            let attempts: Vec<&Entry> = w.entries().iter().collect();
            let got = excuse(&w.input(), &attempts);
            assert_eq!(
                got.as_ref().map(|e| e.kind.as_str()),
                kind,
                "{case}: {got:?}"
            );
            if let Some(e) = got {
                assert!(e.because.contains(text), "{case}: {}", e.because);
            }
        }
    }
}
