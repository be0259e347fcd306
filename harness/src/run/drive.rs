//! The run's third phase: the load and the chaos schedule, side by side. The batches are enqueued
//! with the scenario's pacing, the trickle's orders start beside them, and the chaos schedule
//! runs from the load's first instant; a crash that leaves nothing able to make progress ends the
//! load at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mock_providers::ledger::Ledger;

use super::infra;
use super::start::{Stack, Workload};
use super::watch::CrashWatch;
use crate::check::EventKind;
use crate::load::{self, Enqueued, TrickleRun};
use crate::scenario::Scenario;

/// What the load phase leaves for the wait for quiescence.
pub(super) struct Driven {
    pub enqueue: Enqueued,
    /// Why the run stopped before its load was done (a crash nothing can recover from).
    pub stopped_early: Option<String>,
    /// The trickle's orders, still under way.
    pub trickle: Option<TrickleRun>,
    pub watch: CrashWatch,
}

/// Enqueues the batches (and starts the trickle) while the chaos schedule runs.
pub(super) async fn load_and_chaos(
    scenario: &Scenario,
    ledger: &Ledger,
    stack: &Stack,
    work: &mut Workload,
) -> anyhow::Result<Driven> {
    let world = &stack.world;
    let load_start = Instant::now();
    world.event(
        EventKind::LoadStart,
        None,
        None,
        format!(
            "{} recipients × {} channels in {} batches",
            work.people.len(),
            scenario.load.channels.len(),
            work.plan.batches.len()
        ),
    );
    stack.chaos.start(load_start);
    let clock = {
        let ledger = ledger.clone();
        Arc::new(move || ledger.now_ns()) as load::Clock
    };
    let poster = load::Poster::new(scenario, &stack.api_base, clock)
        .on_accepted(world.enqueue_answered.clone());
    let trickle_people = std::mem::take(&mut work.trickle_people);
    let trickle = scenario
        .load
        .trickle
        .as_ref()
        .map(|t| TrickleRun::start(t, poster.clone(), trickle_people));
    // A crash is reported the moment it is seen, during the load too; a crash that leaves nothing
    // able to make progress ends the load and the wait for quiescence.
    let mut watch = CrashWatch::new(world.clone(), stack.chaos.clone());
    let loaded = {
        let watching = async {
            loop {
                if let Some(why) = watch.poll() {
                    break why;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            r = load::enqueue(&poster, &work.people, &work.plan) => Ok(r),
            why = watching => Err(why),
        }
    };
    let (enqueue, stopped_early) = match loaded {
        Ok(Ok(e)) => (e, None),
        // An enqueue that failed because the API crashed is the stack's failure, not ours.
        Ok(Err(e)) => {
            stack
                .supervisor
                .wait_exit(stack.api_pid, Duration::from_secs(1))
                .await;
            match watch.poll() {
                Some(why) => (Enqueued::new(), Some(why)),
                None => return Err(infra(format!("{e}"))),
            }
        }
        Err(why) => (Enqueued::new(), Some(why)),
    };
    // The batches are sent: their recipients' data is not needed again (the checkers that read
    // it generate their own), and at 100,000 recipients it is a hundred megabytes.
    work.people = Vec::new();
    // A batch the stack never accepted within the retry window is judged by `responsiveness`;
    // its deliveries were never the stack's to send.
    let never = &enqueue.failures.not_accepted;
    work.forget_batches(never.iter().map(|b| b.batch_id.as_str()));
    world.event(
        EventKind::LoadDone,
        None,
        None,
        format!(
            "{} batches enqueued, {} never accepted",
            work.plan.batches.len() - never.len(),
            never.len()
        ),
    );
    Ok(Driven {
        enqueue,
        stopped_early,
        trickle,
        watch,
    })
}
