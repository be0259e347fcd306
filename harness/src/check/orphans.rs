//! Channels the chaos left without a worker that serves them.
//!
//! A stack may give each channel workers of its own (a pool per channel is a design, not a flaw:
//! docs/stack-contract.md). When chaos steps stop every worker that ever sent on a channel and
//! none is replaced, what is still open on that channel when the wait ends proves nothing about
//! recovery: no process that sends it was left. `no_loss`, `quiescence` and `recovery` leave those
//! deliveries unjudged (insufficient, never holds, never violated) and say which workers the run
//! took away.
//!
//! A channel is orphaned when every one of these holds:
//! - some worker sent on it, and every send on it has a known sender (an unattributed send could
//!   have come from a worker still alive);
//! - every worker slot that sent on it had no process alive when the wait ended: a slot whose
//!   replacement was alive is never orphaned, since a replacement serves what its slot served, so
//!   a restarted worker that never takes its channel's rows is still a stuck stack;
//! - each process of those slots was stopped by the harness, not by itself (a crash is
//!   `crashes`' violation, and is never an excuse).
//!
//! So no worker alive at the end had ever sent on the channel. A stack whose every worker sends
//! every channel has survivors that sent it too, and is judged as before. A run that settled
//! has nothing open, and no orphaned channel.

use std::collections::{BTreeMap, BTreeSet};

use mock_providers::ledger::EntryKind;

use super::common::channel_of;
use super::{Input, ProcessRecord, Role};
use crate::scenario::Channel;

/// The channels the chaos left without a worker, each with the worker ids (or pids) that sent it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Orphans(BTreeMap<Channel, Vec<String>>);

impl Orphans {
    pub fn of(input: &Input) -> Orphans {
        if input.quiescence.reached {
            return Orphans::default();
        }
        let end = input.quiescence.at_ns;
        let mut slots: BTreeMap<Channel, BTreeSet<u32>> = BTreeMap::new();
        let mut unknown_sender: BTreeSet<Channel> = BTreeSet::new();
        for e in input.ledger.iter().filter(|e| e.kind == EntryKind::Send) {
            let channel = channel_of(e.provider);
            let slot = input
                .pids
                .get(e.seq)
                .and_then(|pid| input.processes.iter().find(|p| p.pid == pid))
                .filter(|p| p.role == Role::Worker)
                .and_then(|p| p.slot);
            match slot {
                Some(s) => {
                    slots.entry(channel).or_default().insert(s);
                }
                None => {
                    unknown_sender.insert(channel);
                }
            }
        }
        let workers = |slot: u32| {
            input
                .processes
                .iter()
                .filter(move |p| p.role == Role::Worker && p.slot == Some(slot))
        };
        let gone = |p: &ProcessRecord| p.exited_ns.is_some_and(|x| x <= end) && !p.exited_unasked;
        let mut out = BTreeMap::new();
        for (channel, slots) in slots {
            if unknown_sender.contains(&channel) || !slots.iter().all(|&s| workers(s).all(gone)) {
                continue;
            }
            let names = slots
                .iter()
                .flat_map(|&s| workers(s))
                .map(|p| {
                    p.worker_id
                        .clone()
                        .unwrap_or_else(|| format!("pid {}", p.pid))
                })
                .collect();
            out.insert(channel, names);
        }
        Orphans(out)
    }

    pub fn contains(&self, channel: Channel) -> bool {
        self.0.contains_key(&channel)
    }

    /// `line (worker w2)`, `line (workers w2, w2-r1); sms (worker w1)`.
    pub fn describe(&self) -> String {
        self.0
            .iter()
            .map(|(c, ws)| {
                let s = if ws.len() == 1 { "" } else { "s" };
                format!("{} (worker{s} {})", c.as_str(), ws.join(", "))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Why a delivery still open on an orphaned channel is not judged.
    pub fn why(&self) -> String {
        format!(
            "open on a channel whose every sender the chaos stopped and nothing replaced: {}; no \
             worker alive at the end had sent on it (a stack with workers per channel needs more \
             than one per channel here, or a restart)",
            self.describe()
        )
    }
}

/// A run in which worker 2 (pid 200) sent LINE only, once, failing, and was killed at 50 ms with
/// no replacement; worker 1 (pid 100) sent SMS and lived on; the wait ended at 1 s unsettled
/// (`r1/line` open).
#[cfg(test)]
pub fn line_orphaned() -> crate::check::testkit::World {
    use crate::check::testkit::*;
    use mock_providers::ledger::Outcome;
    let mut w = World::new();
    w.worker(100, 0, None);
    w.worker(200, 0, Some(50)).signal = Some(9);
    let line = w.expect("r1", Channel::Line);
    let sms = w.expect("r1", Channel::Sms);
    w.send(Channel::Line, &line, Outcome::Transient, 10)
        .pid(200);
    w.send(Channel::Sms, &sms, Outcome::Accepted, 10).pid(100);
    w.quiescence.reached = false;
    w.quiescence.at_ns = ns(1_000);
    w.quiescence.open = vec!["r1/line".into()];
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;
    use mock_providers::ledger::Outcome;

    fn world() -> World {
        line_orphaned()
    }

    #[test]
    fn a_channel_only_a_stopped_worker_sent_is_orphaned() {
        let w = world();
        let o = Orphans::of(&w.input());
        assert!(o.contains(Channel::Line));
        assert!(!o.contains(Channel::Sms));
        assert_eq!(o.describe(), "line (worker pid 200)");
    }

    #[test]
    fn a_surviving_sender_a_live_replacement_a_crash_or_an_unknown_sender_is_not() {
        // A worker alive at the end sent LINE too.
        let mut w = world();
        let line = w.expect("r2", Channel::Line);
        w.send(Channel::Line, &line, Outcome::Accepted, 20).pid(100);
        assert_eq!(Orphans::of(&w.input()), Orphans::default());

        // Slot 2 was restarted and its replacement is alive (it need not have sent anything).
        let mut w = world();
        w.worker(201, 60, None).slot = Some(2);
        assert_eq!(Orphans::of(&w.input()), Orphans::default());

        // Worker 2 died on its own.
        let mut w = world();
        w.processes[1].exited_unasked = true;
        assert_eq!(Orphans::of(&w.input()), Orphans::default());

        // A LINE send nobody owns could have been the survivor's.
        let mut w = world();
        let line = w.expect("r3", Channel::Line);
        w.send(Channel::Line, &line, Outcome::Accepted, 20);
        w.pids.remove(w.ledger.len() as u64 - 1);
        assert_eq!(Orphans::of(&w.input()), Orphans::default());

        // Worker 2 was still alive when the wait ended (stopped in teardown).
        let mut w = world();
        w.processes[1].exited_ns = Some(ns(2_000));
        assert_eq!(Orphans::of(&w.input()), Orphans::default());

        // The run settled: nothing open, nothing to excuse.
        let mut w = world();
        w.quiescence.reached = true;
        assert_eq!(Orphans::of(&w.input()), Orphans::default());
    }
}
