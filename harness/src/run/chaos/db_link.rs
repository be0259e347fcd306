//! The database-link chaos actions (`db_partition`, `db_reset`, `db_latency`, `db_bandwidth`)
//! on the proxies of `crate::netchaos`, and the observation that each took effect: a partition
//! applied only when the target had a connection open through its proxy and bytes were held
//! back (counted), a reset with the connections it reset (0 is `no_target`), latency and a
//! bandwidth cap with the bytes they delayed. Each lands on the timeline as a span: its start
//! and its heal, per process whose link it is.
//!
//! A fault that lasts is cleared by a guard when its task ends, also when the run stops early
//! and aborts it: a link must never stay cut while the stack shuts down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{aim, Chaos};
use crate::check::{EventKind, Role};
use crate::netchaos::{Counters, Latency, Link, LinkOwner};
use crate::report::chaos_steps::ChaosOutcome;
use crate::scenario::{ChaosStep, DbLinkFault, Target};

/// One link a step acts on: whose it is, for the timeline, and the link.
struct Victim {
    slot: Option<u32>,
    pid: Option<u32>,
    owner: LinkOwner,
    link: Arc<Link>,
}

/// Runs database-link step `i`.
pub(super) async fn act(
    chaos: &Arc<Chaos>,
    i: usize,
    step: &ChaosStep,
    sender: Option<u32>,
    why: &str,
) {
    let Some(fault) = step.db_link else { return };
    let w = &chaos.world;
    let Some(links) = w.worker.db_links.clone() else {
        // `run` makes the links whenever a step needs them; kept for safety.
        chaos.log(i).decide(
            ChaosOutcome::Failed,
            format!("{why}: the run has no database-link proxies"),
        );
        return;
    };
    let mut victims: Vec<Victim> = Vec::new();
    if step.target == Target::All {
        let api = w
            .supervisor
            .records()
            .into_iter()
            .find(|r| r.role == Role::Api && w.supervisor.is_alive(r.pid))
            .map(|r| r.pid);
        if let Some(link) = links.link(LinkOwner::Api) {
            victims.push(Victim {
                slot: None,
                pid: api,
                owner: LinkOwner::Api,
                link,
            });
        }
    }
    for (slot, pid) in chaos.targets(step, sender) {
        if let Some(link) = links.link(LinkOwner::Worker(slot)) {
            victims.push(Victim {
                slot: Some(slot),
                pid: Some(pid),
                owner: LinkOwner::Worker(slot),
                link,
            });
        }
    }
    if victims.is_empty() {
        let reason = format!("{why}: no live worker matches {:?}", step.target);
        w.event(EventKind::ChaosNoTarget, None, None, reason.clone());
        chaos.log(i).decide(ChaosOutcome::NoTarget, reason);
        return;
    }
    // One chosen worker is caught with a send in flight, like a signal: the fault lands while
    // the fake holds its request.
    let aimed = matches!(
        step.target,
        Target::Worker(_) | Target::Busiest | Target::Random
    );
    let mut held = None;
    let mut why = why.to_string();
    if let (true, Some(pid)) = (aimed, victims[0].pid) {
        held = chaos.aims.catch(pid, aim::AIM_WITHIN).await;
        let how = match &held {
            Some(h) => format!(
                "caught pid {pid} with a {} send in flight",
                h.provider.as_str()
            ),
            None => format!(
                "pid {pid} sent nothing within {}: its link cut between sends",
                humantime::format_duration(aim::AIM_WITHIN)
            ),
        };
        chaos.log(i).aimed(&how);
        why = format!("{why}; {how}");
    }
    for v in &victims {
        if let Some(pid) = v.pid {
            chaos.log(i).target(pid, 0);
        }
    }
    match fault {
        DbLinkFault::Reset => {
            drop(held);
            reset(chaos, i, &victims, &why);
        }
        lasting => {
            let hold = step.duration.unwrap_or_default();
            let before: Vec<Counters> = victims.iter().map(|v| v.link.counters()).collect();
            let set = Setting::of(lasting);
            for v in &victims {
                set.apply(&v.link, true);
                let what = format!(
                    "{why}; {} of {} for {}",
                    set.words(),
                    v.owner,
                    humantime::format_duration(hold)
                );
                w.event(set.start_kind(), v.slot, v.pid, what);
            }
            drop(held);
            chaos.log(i).owe();
            let me = chaos.clone();
            let started = Instant::now();
            chaos.keep(tokio::spawn(async move {
                let guard = Heal {
                    links: victims.iter().map(|v| v.link.clone()).collect(),
                    set,
                };
                tokio::time::sleep_until((started + hold).into()).await;
                drop(guard);
                heal(&me, i, &victims, &before, set, hold);
            }));
        }
    }
}

/// `db_reset`: every connection of every victim's link reset now.
fn reset(chaos: &Chaos, i: usize, victims: &[Victim], why: &str) {
    let mut total = 0;
    for v in victims {
        let n = v.link.reset_all();
        total += n;
        chaos.world.event(
            EventKind::DbLinkReset,
            v.slot,
            v.pid,
            format!("{why}; reset {n} connections of {}", v.owner),
        );
    }
    let mut log = chaos.log(i);
    if total == 0 {
        log.decide(
            ChaosOutcome::NoTarget,
            format!("{why}: no connection was open through the link"),
        );
    } else {
        log.owe();
        log.count(total);
        log.observe(
            true,
            format!("reset {total} database connections (RST to both peers)"),
        );
    }
}

/// The end of a lasting fault: its heal on the timeline, and whether it took effect.
fn heal(
    chaos: &Chaos,
    i: usize,
    victims: &[Victim],
    before: &[Counters],
    set: Setting,
    hold: Duration,
) {
    let (mut open, mut bytes) = (0, 0);
    for (v, b) in victims.iter().zip(before) {
        let after = v.link.counters();
        let n = match set {
            Setting::Partition => after.held - b.held,
            _ => after.delayed - b.delayed,
        };
        open += b.open.max(after.accepted - b.accepted);
        bytes += n;
        chaos.world.event(
            set.end_kind(),
            v.slot,
            v.pid,
            format!(
                "{} of {} ended after {}; {n} bytes {}",
                set.words(),
                v.owner,
                humantime::format_duration(hold),
                set.bytes_words()
            ),
        );
    }
    let mut log = chaos.log(i);
    log.count(bytes);
    if open == 0 {
        log.decide(
            ChaosOutcome::NoTarget,
            "no connection was open through the link while it lasted",
        );
    } else if bytes == 0 {
        log.observe(
            false,
            format!(
                "{open} connections open, but no byte was {} (nothing crossed the link)",
                set.bytes_words()
            ),
        );
    } else {
        log.observe(
            true,
            format!("{bytes} bytes {} on {open} connections", set.bytes_words()),
        );
    }
}

/// A lasting fault, as set on and cleared from a link.
#[derive(Clone, Copy)]
enum Setting {
    Partition,
    Latency(Latency),
    Bandwidth(u64),
}

impl Setting {
    fn of(f: DbLinkFault) -> Setting {
        match f {
            DbLinkFault::Latency { delay, jitter } => Setting::Latency(Latency {
                base: delay,
                jitter,
            }),
            DbLinkFault::Bandwidth { bytes_per_s } => Setting::Bandwidth(bytes_per_s),
            DbLinkFault::Partition | DbLinkFault::Reset => Setting::Partition,
        }
    }

    fn apply(self, link: &Link, on: bool) {
        link.set(|f| match self {
            Setting::Partition => f.partitioned = on,
            Setting::Latency(l) => f.latency = on.then_some(l),
            Setting::Bandwidth(b) => f.bandwidth = on.then_some(b),
        });
    }

    fn start_kind(self) -> EventKind {
        match self {
            Setting::Partition => EventKind::DbLinkPartition,
            _ => EventKind::DbLinkSlow,
        }
    }

    fn end_kind(self) -> EventKind {
        match self {
            Setting::Partition => EventKind::DbLinkHeal,
            _ => EventKind::DbLinkSlowEnd,
        }
    }

    fn words(self) -> String {
        match self {
            Setting::Partition => "partition of the database link".into(),
            Setting::Latency(l) => format!(
                "{} (+ up to {}) added each way on the database link",
                humantime::format_duration(l.base),
                humantime::format_duration(l.jitter)
            ),
            Setting::Bandwidth(b) => format!("{b} bytes/s cap on the database link"),
        }
    }

    fn bytes_words(self) -> &'static str {
        match self {
            Setting::Partition => "held back until the heal",
            _ => "delayed",
        }
    }
}

/// Clears a lasting fault from its links when dropped: at the step's end, or when the run stops
/// and aborts the step's task.
struct Heal {
    links: Vec<Arc<Link>>,
    set: Setting,
}

impl Drop for Heal {
    fn drop(&mut self) {
        for l in &self.links {
            self.set.apply(l, false);
        }
    }
}
