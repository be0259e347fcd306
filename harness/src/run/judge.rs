//! The run's fifth phase: stop the stack, then judge. The stack is stopped before anything is
//! read, so that no send can land after the ledger was read; every checker then judges the same
//! frozen record (`check::run_all`).

use std::time::Duration;

use super::quiesce::Settled;
use super::start::{Stack, Workload};
use super::Resources;
use crate::check::{self, Entry, Pids, ProcessRecord, TimelineEvent, Verdict};
use crate::report::phases::PhaseClock;
use crate::scenario::Scenario;
use crate::stalls::{Seen, StallProbe};

/// The frozen record of the run and what the checkers made of it.
pub(super) struct Judged {
    /// The ledger's entries when the stack had stopped, as the checkers read them.
    pub entries: Vec<Entry>,
    /// Ledger `seq` → pid of the sender.
    pub pids: Pids,
    pub timeline: Vec<TimelineEvent>,
    pub processes: Vec<ProcessRecord>,
    /// The machine's stalls and the wall clock's jumps over the run.
    pub seen: Seen,
    /// What other work took from the machine over the run (`crate::others`).
    pub others: Option<crate::others::Others>,
    pub checks: Vec<Verdict>,
}

/// Stops every stack process (SIGTERM, then SIGKILL past the grace), freezes the record and runs
/// every checker over it.
pub(super) async fn stop_and_judge(
    scenario: &Scenario,
    probe: StallProbe,
    stack: &Stack,
    work: &Workload,
    settled: &Settled,
    res: &mut Resources,
    clock: &mut PhaseClock,
) -> anyhow::Result<Judged> {
    stack
        .supervisor
        .shutdown_all(scenario.stack.shutdown_grace.max(Duration::from_secs(1)))
        .await;
    res.supervisor = None;
    // Nothing the fakes do from here on can reach a checker (the stack is stopped; a report
    // still due could only meet a closed port): they stop too, and their stores (every SMS, LINE
    // retry key and attempt counter of the run) are freed before judging builds its indexes.
    if let Some(providers) = res.providers.take() {
        providers.shutdown().await;
    }
    stack.chaos.forget_hub();
    stack.world.ledger.forget_attempts();
    clock.lap(|p| &mut p.stop_s);
    // What the wait freed (the status view replaced, answers parsed) goes back before judging
    // builds its indexes: the run's peak is here.
    crate::malloc::trim();
    let world = &stack.world;
    world.resolve_pending();
    let entries = world.journal.freeze()?;
    let pids = world.take_pids();
    let timeline = world.timeline();
    let processes = stack.supervisor.records();
    let others = probe.others();
    let seen = probe.finish();
    let input = check::Input {
        scenario,
        expected: &work.expected,
        ledger: &entries,
        pids: &pids,
        status: settled.status.as_deref(),
        timeline: &timeline,
        processes: &processes,
        enqueue_us: &settled.enqueue.latency_us,
        batches: &settled.enqueue.batches,
        repeats: &settled.enqueue.repeats,
        enqueue_failures: &settled.enqueue.failures,
        quiescence: &settled.quiescence,
        lost_batches: &settled.lost_batches,
        status_answers: &settled.status_answers,
        stalls: &seen.stalls,
        clock_jumps: &seen.jumps,
        sends: Default::default(),
        status_rows: Default::default(),
        worker_boot: Default::default(),
        orphans: Default::default(),
    };
    // Each checker's indexes go back before the next builds its own.
    let checks = check::run_all_then(&input, crate::malloc::trim);
    clock.lap(|p| &mut p.judge_s);
    Ok(Judged {
        entries,
        pids,
        timeline,
        processes,
        seen,
        others,
        checks,
    })
}
