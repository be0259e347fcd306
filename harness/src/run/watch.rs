//! Watches the stack's processes while the run goes on: a process that exits on its own is
//! reported at once (timeline and progress line, with its exit status and last log line), and
//! the run is stopped early when such a crash leaves nothing that could make progress.
//!
//! "Nothing could make progress" is decided from the processes alone: the API is gone (no batch
//! can be taken, no callback answered), or no worker is alive and no chaos action is under way
//! that would start one. A crash that leaves other workers running is reported, and the run goes
//! on: the other checkers still judge what the rest of the stack did. Must never stop a run for
//! a process the harness itself stopped.

use std::collections::HashSet;
use std::sync::Arc;

use super::chaos::Chaos;
use super::world::World;
use crate::check::{crashes, EventKind, Role};

pub struct CrashWatch {
    world: Arc<World>,
    chaos: Arc<Chaos>,
    reported: HashSet<u32>,
}

impl CrashWatch {
    pub fn new(world: Arc<World>, chaos: Arc<Chaos>) -> CrashWatch {
        CrashWatch {
            world,
            chaos,
            reported: HashSet::new(),
        }
    }

    /// Reports every process that exited unasked since the last call; returns why the run
    /// cannot go on, when a crash left nothing that could make progress.
    pub fn poll(&mut self) -> Option<String> {
        let records = self.world.supervisor.records();
        for p in records.iter().filter(|p| p.exited_unasked) {
            if !self.reported.insert(p.pid) {
                continue;
            }
            let last = p
                .log_tail
                .as_deref()
                .and_then(|t| t.lines().rev().find(|l| !l.trim().is_empty()))
                .unwrap_or("(empty log)");
            self.world.event(
                EventKind::Crashed,
                p.slot,
                Some(p.pid),
                format!(
                    "{}exited on its own with {}; logs/{}: {last}",
                    p.worker_id
                        .as_deref()
                        .map(|id| format!("({id}) "))
                        .unwrap_or_default(),
                    crashes::exit_status(p),
                    p.log
                ),
            );
        }
        if self.reported.is_empty() {
            return None;
        }
        let api_crashed = records
            .iter()
            .any(|p| p.role == Role::Api && p.exited_unasked);
        if api_crashed {
            return Some("the API exited on its own".into());
        }
        if self.world.live_workers().is_empty() && !self.chaos.busy() {
            return Some("no worker is alive and none is due to restart".into());
        }
        None
    }
}
