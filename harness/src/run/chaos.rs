//! The chaos schedule: triggers (elapsed time, progress, the Nth accepted send) and actions on
//! workers (signals, restarts). Every action lands on the timeline with its time and pid, and a
//! step counts as applied only once its effect is observed ([`log`]): the process exited by the
//! signal, `/proc` showed it stopped and then running again, the replacement started. A signal
//! for one chosen worker is aimed at a moment it has a send in flight ([`aim`]). The database
//! actions live in [`db`], those on one process's database link in [`db_link`], the provider
//! outage in [`provider`], those on workers' links to a provider in [`provider_link`], the
//! actions on the API process in [`api`].

mod aim;
mod api;
mod db;
mod db_link;
mod log;
mod provider;
mod provider_link;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mock_providers::ledger::{LedgerEntry, Provider};
use nix::sys::signal::Signal;
use rand::seq::SliceRandom;
use rand::SeedableRng;

pub use api::ApiProcess;
pub use db::DbHandle;
use log::StepLog;

use super::world::World;
use crate::check::EventKind;
use crate::report::chaos_steps::{ChaosOutcome, ChaosStepResult};
use crate::scenario::{Channel, ChaosAction, ChaosStep, Target, Trigger};

/// How long a signalled process or the restarted cluster has to show the action's effect.
const OBSERVE_WITHIN: Duration = Duration::from_secs(10);

/// How long a step whose only matching workers are another step's waits for them to be free.
const CHOOSE_WITHIN: Duration = Duration::from_secs(30);

pub struct Chaos {
    world: Arc<World>,
    steps: Vec<ChaosStep>,
    fired: Vec<AtomicBool>,
    /// Steps that fired and are still choosing, aiming or signalling ([`Chaos::execute`]).
    executing: AtomicUsize,
    /// What each step did, for the report.
    logs: Vec<Mutex<StepLog>>,
    /// ledger seq of the triggering accept → step index (`on_accept`).
    armed: Mutex<HashMap<u64, usize>>,
    rng: Mutex<rand_chacha::ChaCha8Rng>,
    db: DbHandle,
    /// Deliveries the providers can accept, per channel (progress denominators).
    acceptable: BTreeMap<Channel, u64>,
    /// Trigger tasks (time, progress), aborted when the run settles.
    triggers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Tasks started by actions (stop-then-continue, delayed restarts, held transactions).
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Workers a step waits to catch with a send in flight.
    aims: aim::Aims,
    /// Workers a step has chosen to signal and is still acting on ([`Acting`]), with how many
    /// steps are (a `sender` step may name one another step holds): no other step chooses them.
    acting: Arc<Mutex<HashMap<u32, usize>>>,
    /// The API process (`target = "api"`), once it runs.
    api: Mutex<Option<ApiProcess>>,
    /// Held by a step on the API from its signal until its replacement is ready: the next step
    /// on the API waits for it ([`api::act`]).
    api_turn: Arc<tokio::sync::Mutex<()>>,
    /// The fakes' shared state (`provider_outage`), once they run.
    hub: Mutex<Option<Arc<mock_providers::hub::Hub>>>,
    /// Faults on workers' links to a provider in force, looked up for every send request.
    links: provider_link::Links,
}

impl Chaos {
    pub fn new(world: Arc<World>, db: DbHandle, acceptable: BTreeMap<Channel, u64>) -> Arc<Chaos> {
        let steps = world.scenario.chaos.clone();
        let seed = world.scenario.seed;
        Arc::new(Chaos {
            fired: steps.iter().map(|_| AtomicBool::new(false)).collect(),
            executing: AtomicUsize::new(0),
            logs: steps.iter().map(|_| Mutex::default()).collect(),
            steps,
            world,
            armed: Mutex::default(),
            rng: Mutex::new(rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0xC4A0_5EED)),
            db,
            acceptable,
            triggers: Mutex::default(),
            tasks: Mutex::default(),
            aims: aim::Aims::default(),
            acting: Arc::default(),
            api: Mutex::default(),
            api_turn: Arc::default(),
            hub: Mutex::default(),
            links: provider_link::Links::default(),
        })
    }

    /// The API process a `target = "api"` step acts on (and its replacements after it).
    pub fn set_api(&self, api: ApiProcess) {
        *self.api.lock().unwrap() = Some(api);
    }

    /// The fakes a `provider_outage` step fails.
    pub fn set_hub(&self, hub: Arc<mock_providers::hub::Hub>) {
        *self.hub.lock().unwrap() = Some(hub);
    }

    /// Lets go of the fakes (they have stopped): their stores are freed once nothing holds them.
    pub fn forget_hub(&self) {
        self.hub.lock().unwrap().take();
    }

    fn hub(&self) -> Option<Arc<mock_providers::hub::Hub>> {
        self.hub.lock().unwrap().clone()
    }

    /// Called for the `n`th accepted send on `e.provider`: arms matching `on_accept` steps.
    pub fn note_accept(&self, e: &LedgerEntry, n: u64) {
        for (i, s) in self.steps.iter().enumerate() {
            if let Trigger::OnAccept { channel, nth } = s.trigger {
                if channel.provider() == e.provider && nth as u64 == n {
                    self.armed.lock().unwrap().insert(e.seq, i);
                }
            }
        }
    }

    /// Runs the armed step for this accepted send, before the provider answers the sender.
    pub async fn fire_on_accept(self: &Arc<Self>, e: &LedgerEntry) {
        let step = self.armed.lock().unwrap().remove(&e.seq);
        if let Some(i) = step {
            let sender = self.world.sender_of(e.seq, e.peer);
            let why = format!(
                "on_accept: {} #{} to {}",
                e.provider.as_str(),
                e.seq,
                e.recipient
            );
            self.execute(i, sender, &why).await;
        }
    }

    /// A send request from `peer` has arrived at `provider`'s fake: held while a step aimed at its
    /// sender signals it; then what a fault on its sender's link to `provider` makes of it.
    pub async fn on_request(
        &self,
        provider: Provider,
        peer: std::net::SocketAddr,
    ) -> mock_providers::link::LinkFate {
        let attributor = &self.world.attributor;
        self.aims
            .arrived(provider, || attributor.sender(peer))
            .await;
        self.links.fate(provider, || attributor.sender(peer))
    }

    /// Whether `peer`'s link to `provider` is down for the SMTP command it just sent.
    pub fn refuses(&self, provider: Provider, peer: std::net::SocketAddr) -> bool {
        let attributor = &self.world.attributor;
        self.links.refuses(provider, || attributor.sender(peer))
    }

    /// Starts the time and progress triggers; `load_start` is when enqueueing began.
    pub fn start(self: &Arc<Self>, load_start: Instant) {
        for (i, s) in self.steps.iter().enumerate() {
            let me = self.clone();
            let trigger = s.trigger.clone();
            let task = tokio::spawn(async move {
                match trigger {
                    Trigger::At(d) => {
                        tokio::time::sleep_until((load_start + d).into()).await;
                        me.execute(i, None, &format!("at {}", humantime::format_duration(d)))
                            .await;
                    }
                    Trigger::Progress(p) => {
                        let of = me.steps[i].provider();
                        let goal = (p * me.progress_of(of).1 as f64).ceil() as u64;
                        loop {
                            let notified = me.world.progress.notified();
                            if me.progress_of(of).0 >= goal {
                                break;
                            }
                            let _ =
                                tokio::time::timeout(Duration::from_millis(100), notified).await;
                        }
                        let whose = of.map_or(String::new(), |p| format!(" of {}", p.as_str()));
                        let why = format!("progress {:.0}%{whose} ({goal} accepted)", p * 100.0);
                        me.execute(i, None, &why).await;
                    }
                    Trigger::OnAccept { .. } => {}
                }
            });
            self.triggers.lock().unwrap().push(task);
        }
    }

    /// (accepted, acceptable) so far: of `provider`'s own channel for a provider action, so that
    /// an outage "at 50%" meets that provider's sends in whatever order a stack works through its
    /// channels (a stack that sends every e-mail first has none left at 50% of all deliveries);
    /// of every delivery otherwise.
    fn progress_of(&self, provider: Option<Provider>) -> (u64, u64) {
        match provider {
            Some(p) => {
                let channel = Channel::ALL.into_iter().find(|c| c.provider() == p);
                let acceptable = channel.and_then(|c| self.acceptable.get(&c)).copied();
                (self.world.accepted_on(p), acceptable.unwrap_or(0))
            }
            None => (
                self.world.accepted_total(),
                self.acceptable.values().sum::<u64>().max(1),
            ),
        }
    }

    /// True while an action is still under way (a step that fired still choosing its worker or
    /// waiting to catch it mid-send, a stopped worker not yet continued, a restart not yet done,
    /// a transaction still held): the run cannot be quiescent before it ends.
    pub fn busy(&self) -> bool {
        self.executing.load(Ordering::SeqCst) > 0
            || self.tasks.lock().unwrap().iter().any(|t| !t.is_finished())
    }

    /// Aborts triggers that have not fired and actions still running.
    pub fn stop(&self) {
        for t in self.triggers.lock().unwrap().drain(..) {
            t.abort();
        }
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    /// What every step did (`report.json` `chaos`): a schedule that did not happen proves
    /// nothing, so each step says whether its effect was observed.
    pub fn results(&self) -> Vec<ChaosStepResult> {
        self.steps
            .iter()
            .enumerate()
            .map(|(i, s)| self.logs[i].lock().unwrap().result(i, s))
            .collect()
    }

    fn log(&self, i: usize) -> std::sync::MutexGuard<'_, StepLog> {
        self.logs[i].lock().unwrap()
    }

    /// Keeps `task` so the run is not quiescent before it ends, and aborts it on [`Chaos::stop`].
    fn keep(&self, task: tokio::task::JoinHandle<()>) {
        self.tasks.lock().unwrap().push(task);
    }

    /// The live workers `step`'s target names now: `busiest` is the one that has sent the most
    /// to the step's provider for a provider action (a worker that never sends to it could not
    /// meet its fault), the most in all otherwise; for a link fault, preferably one no other
    /// link fault holds (`World::busiest_for_link`).
    ///
    /// A worker another step is signalling is never named: the two steps' effects would be one.
    fn targets(&self, step: &ChaosStep, sender: Option<u32>) -> Vec<(u32, u32)> {
        let acting = self.acting.lock().unwrap();
        self.targets_among(step, sender, self.free_workers(&acting))
    }

    /// The live workers no step is acting on.
    fn free_workers(&self, acting: &HashMap<u32, usize>) -> Vec<(u32, u32)> {
        let mut live = self.world.live_workers();
        live.retain(|(_, pid)| !acting.contains_key(pid));
        live
    }

    /// [`Chaos::targets`] among `live`.
    fn targets_among(
        &self,
        step: &ChaosStep,
        sender: Option<u32>,
        live: Vec<(u32, u32)>,
    ) -> Vec<(u32, u32)> {
        match &step.target {
            Target::Worker(slot) => live.into_iter().filter(|(s, _)| s == slot).collect(),
            Target::All => live,
            Target::Busiest => match (step.provider_link, step.provider()) {
                (Some(_), Some(p)) => {
                    let held_any = self.links.faulted(None);
                    let held_here = self.links.faulted(Some(p));
                    self.world
                        .busiest_for_link(&live, p, &held_any, &held_here)
                        .into_iter()
                        .collect()
                }
                _ => self
                    .world
                    .busiest_of(&live, step.provider())
                    .into_iter()
                    .collect(),
            },
            Target::Random => live
                .choose(&mut *self.rng.lock().unwrap())
                .copied()
                .into_iter()
                .collect(),
            Target::Sender => sender
                .and_then(|pid| self.world.slot_of(pid).map(|s| (s, pid)))
                .into_iter()
                .collect(),
            // Not a worker: acted on by `api::act` before workers are looked for.
            Target::Api => Vec::new(),
        }
    }

    /// The workers a signal step acts on, each [`Acting`] until the step is done with it: chosen
    /// among those no other step is acting on. When the only ones that match are another step's
    /// (its `target = 2` is being restarted, every worker is), waits up to [`CHOOSE_WITHIN`] for
    /// that step to finish and chooses again (the replacement, the continued worker). Two steps
    /// that fire together (a progress step that waited to catch its worker mid-send while the
    /// next one's progress came) never signal the same process: a SIGTERM to a worker another
    /// step is SIGKILLing would judge its drain from a death it did not choose. A `sender` step
    /// is about the one process caught sending, whatever other steps do, and never waits: the
    /// provider holds that send's answer meanwhile.
    async fn choose(&self, step: &ChaosStep, sender: Option<u32>) -> Vec<(u32, u32, Acting)> {
        let deadline = Instant::now() + CHOOSE_WITHIN;
        let may_wait = step.target != Target::Sender;
        loop {
            {
                let mut acting = self.acting.lock().unwrap();
                let chosen = self.targets_among(step, sender, self.free_workers(&acting));
                let give_up = !may_wait || acting.is_empty() || Instant::now() >= deadline;
                if !chosen.is_empty() || give_up {
                    return chosen
                        .into_iter()
                        .map(|(slot, pid)| {
                            *acting.entry(pid).or_default() += 1;
                            let guard = Acting {
                                set: Arc::clone(&self.acting),
                                pid,
                            };
                            (slot, pid, guard)
                        })
                        .collect();
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn execute(self: &Arc<Self>, i: usize, sender: Option<u32>, why: &str) {
        if self.fired[i].swap(true, Ordering::SeqCst) {
            return;
        }
        self.executing.fetch_add(1, Ordering::SeqCst);
        let _executing = Executing(&self.executing);
        self.log(i).fire(self.world.now_ns(), why);
        let step = self.steps[i].clone();
        match step.action {
            ChaosAction::DbRestart => return db::restart(self, i, why).await,
            ChaosAction::DbTerminate => return db::terminate(self, i, why).await,
            ChaosAction::DbIdleTx => return db::idle_tx(self, i, &step, why),
            ChaosAction::DbPartition
            | ChaosAction::DbReset
            | ChaosAction::DbLatency
            | ChaosAction::DbBandwidth => return db_link::act(self, i, &step, sender, why).await,
            ChaosAction::ProviderOutage => return provider::outage(self, i, &step, why),
            ChaosAction::ProviderPartition
            | ChaosAction::ProviderRefuse
            | ChaosAction::ProviderReset
            | ChaosAction::ProviderLatency => {
                return provider_link::act(self, i, &step, sender, why)
            }
            _ => {}
        }
        if step.target == Target::Api {
            return api::act(self, i, &step, why).await;
        }
        let targets = self.choose(&step, sender).await;
        if targets.is_empty() {
            let reason = format!("{why}: no live worker matches {:?}", step.target);
            self.world
                .event(EventKind::ChaosNoTarget, None, None, reason.clone());
            self.log(i).decide(ChaosOutcome::NoTarget, reason);
            return;
        }
        let aimed = matches!(
            step.target,
            Target::Worker(_) | Target::Busiest | Target::Random
        );
        for (slot, pid, acting) in targets {
            if !aimed {
                self.act_on_worker(i, &step, slot, pid, why, acting).await;
                continue;
            }
            let held = self.aims.catch(pid, aim::AIM_WITHIN).await;
            let how = match &held {
                Some(h) => format!(
                    "caught pid {pid} with a {} send in flight",
                    h.provider.as_str()
                ),
                None => format!(
                    "pid {pid} sent nothing within {}: signalled between sends",
                    humantime::format_duration(aim::AIM_WITHIN)
                ),
            };
            self.log(i).aimed(&how);
            self.act_on_worker(i, &step, slot, pid, &format!("{why}; {how}"), acting)
                .await;
            drop(held);
        }
    }

    /// Signals one worker and starts the task that observes the signal's effect (and starts the
    /// replacement the step asks for); the worker stays `acting` until that task ends.
    async fn act_on_worker(
        self: &Arc<Self>,
        i: usize,
        step: &ChaosStep,
        slot: u32,
        pid: u32,
        why: &str,
        acting: Acting,
    ) {
        let w = &self.world;
        let sup = &w.supervisor;
        let replace_after = match step.action {
            ChaosAction::Restart => Some(Duration::ZERO),
            _ => step.restart_after,
        };
        let (signal, kind) = match step.action {
            ChaosAction::Sigkill => (Signal::SIGKILL, EventKind::Sigkill),
            ChaosAction::Sigterm => (Signal::SIGTERM, EventKind::Sigterm),
            ChaosAction::Restart => (Signal::SIGTERM, EventKind::RestartBegin),
            ChaosAction::Sigstop => (Signal::SIGSTOP, EventKind::Sigstop),
            _ => unreachable!("database and provider actions return earlier"),
        };
        let stop_and_continue = usize::from(step.action == ChaosAction::Sigstop);
        self.log(i).target(
            pid,
            1 + stop_and_continue + usize::from(replace_after.is_some()),
        );
        let sent_at = Instant::now();
        // A SIGTERM's event comes first: the worker may act on it before `signal` returns.
        if signal == Signal::SIGTERM {
            w.event(kind, Some(slot), Some(pid), why);
        }
        let sent = sup.signal(pid, signal);
        if signal != Signal::SIGTERM {
            w.event(kind, Some(slot), Some(pid), why);
        }
        if let Err(e) = sent {
            self.log(i)
                .observe(false, format!("{signal} to pid {pid}: {e:#}"));
            return;
        }
        if signal == Signal::SIGKILL {
            // Inside an on_accept window the provider must not answer before the sender is dead.
            sup.wait_exit(pid, Duration::from_secs(2)).await;
        }
        let me = self.clone();
        let hold = step.duration.unwrap_or_default();
        let task = tokio::spawn(async move {
            let _acting = acting;
            if let Some(d) = replace_after.filter(|_| signal == Signal::SIGSTOP) {
                // A stopped worker stays stopped while its replacement runs.
                let again = me.clone();
                me.keep(tokio::spawn(async move {
                    tokio::time::sleep_until((sent_at + d).into()).await;
                    again.replace(i, slot).await;
                }));
            }
            match signal {
                Signal::SIGSTOP => {
                    me.observe_stop_and_continue(i, slot, pid, sent_at, hold)
                        .await
                }
                Signal::SIGTERM => me.observe_termination(i, slot, pid).await,
                _ => me.observe_exit(i, pid, signal).await,
            }
            if let Some(d) = replace_after.filter(|_| signal != Signal::SIGSTOP) {
                tokio::time::sleep(d).await;
                me.replace(i, slot).await;
            }
        });
        self.keep(task);
    }

    /// Waits for `pid` to exit and records how it ended against what `by` should have done.
    async fn observe_exit(&self, i: usize, pid: u32, by: Signal) {
        let sup = &self.world.supervisor;
        let exited = sup.wait_exit(pid, OBSERVE_WITHIN).await;
        let (ok, what) = match sup.record(pid) {
            Some(r) if exited && r.exited_ns.is_some() => exit_effect(&r, by),
            _ => (
                false,
                format!(
                    "pid {pid} still running {} after {by}",
                    humantime::format_duration(OBSERVE_WITHIN)
                ),
            ),
        };
        self.log(i).observe(ok, what);
    }

    /// After SIGTERM: the grace period, then SIGKILL (a graceful-shutdown violation the checker
    /// reports); either way the step took effect once the process is gone.
    async fn observe_termination(&self, i: usize, slot: u32, pid: u32) {
        let w = &self.world;
        let grace = w.scenario.stack.shutdown_grace;
        if w.supervisor.wait_exit(pid, grace).await {
            let rec = w.supervisor.record(pid);
            w.event(
                EventKind::Exit,
                Some(slot),
                Some(pid),
                format!("{:?}", rec.map(|r| (r.exit_code, r.signal))),
            );
        } else {
            w.event(
                EventKind::GraceExceeded,
                Some(slot),
                Some(pid),
                format!(
                    "still running {} after SIGTERM; SIGKILL",
                    humantime::format_duration(grace)
                ),
            );
            w.supervisor.terminate(pid, Duration::ZERO).await;
        }
        self.observe_exit(i, pid, Signal::SIGTERM).await;
    }

    /// SIGSTOP took effect when `/proc/<pid>/stat` shows state `T`; after `hold`, SIGCONT took
    /// effect when it shows anything else while the process still lives.
    async fn observe_stop_and_continue(
        &self,
        i: usize,
        slot: u32,
        pid: u32,
        sent_at: Instant,
        hold: Duration,
    ) {
        let sup = &self.world.supervisor;
        let (state, stopped) = sup.wait_state(pid, |s| s == 'T', OBSERVE_WITHIN).await;
        self.log(i).observe(
            stopped,
            if stopped {
                format!("pid {pid} stopped (state T in /proc/{pid}/stat)")
            } else {
                format!("pid {pid} never showed state T after SIGSTOP (last state {state:?})")
            },
        );
        tokio::time::sleep_until((sent_at + hold).into()).await;
        let sent = sup.signal(pid, Signal::SIGCONT);
        self.world.event(
            EventKind::Sigcont,
            Some(slot),
            Some(pid),
            format!("after {}", humantime::format_duration(hold)),
        );
        let (state, running) = match sent {
            Ok(()) => {
                sup.wait_state(pid, |s| s != 'T' && s != 't', OBSERVE_WITHIN)
                    .await
            }
            Err(_) => (None, false),
        };
        self.log(i).observe(
            running,
            if running {
                format!(
                    "pid {pid} running again after SIGCONT (state {})",
                    state.unwrap_or('?')
                )
            } else {
                format!("pid {pid} did not run again after SIGCONT (last state {state:?})")
            },
        );
    }

    /// Starts the replacement worker of `slot`: the step's `restart` (or `restart_after`) took
    /// effect when a new worker process is running.
    async fn replace(&self, i: usize, slot: u32) {
        let w = &self.world;
        let seen = match w.start_worker(slot).await {
            Ok(pid) if w.supervisor.is_alive(pid) => (
                true,
                format!("replacement worker pid {pid} started in slot {slot}"),
            ),
            Ok(pid) => (
                false,
                format!("replacement worker pid {pid} exited at once"),
            ),
            Err(e) => {
                w.event(EventKind::RestartFailed, Some(slot), None, e.to_string());
                (
                    false,
                    format!("replacement for slot {slot} did not start: {e:#}"),
                )
            }
        };
        self.log(i).observe(seen.0, seen.1);
    }
}

/// Whether a process that ended as `r` shows the effect of `by`, and what was seen. SIGKILL took
/// effect only when the process ended by signal 9; SIGTERM once the process ended at all
/// (exited, or killed when the grace period ran out).
/// One step in [`Chaos::execute`], counted in [`Chaos::busy`] until dropped.
struct Executing<'a>(&'a AtomicUsize);

impl Drop for Executing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A worker a step has chosen to signal, free for the other steps again once dropped.
struct Acting {
    set: Arc<Mutex<HashMap<u32, usize>>>,
    pid: u32,
}

impl Drop for Acting {
    fn drop(&mut self) {
        let mut acting = self.set.lock().unwrap();
        if let Some(n) = acting.get_mut(&self.pid) {
            *n -= 1;
            if *n == 0 {
                acting.remove(&self.pid);
            }
        }
    }
}

fn exit_effect(r: &crate::check::ProcessRecord, by: Signal) -> (bool, String) {
    let pid = r.pid;
    let how = match (r.exit_code, r.signal) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("ended by signal {s}"),
        (None, None) => "ended".to_string(),
    };
    match by {
        Signal::SIGKILL if r.signal == Some(Signal::SIGKILL as i32) => {
            (true, format!("pid {pid} exited by signal 9 (SIGKILL)"))
        }
        Signal::SIGKILL => (false, format!("pid {pid} {how}, not by SIGKILL")),
        _ if r.killed_after_grace => (
            true,
            format!("pid {pid} still running when the grace period ran out; {how} (SIGKILL)"),
        ),
        _ => (true, format!("pid {pid} {how} after {by}")),
    }
}
