//! The shared state of one run: the stack's processes by worker slot, the ledger clock, the
//! timeline, and per-process send counts. Chaos actions and ledger hooks act through it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mock_providers::ledger::{EntryKind, Hook, Ledger, LedgerEntry, Outcome, Provider};

use crate::attribution::{Attributor, Found};
use crate::check::{EventKind, Name, Pids, Role, TimelineEvent};
use crate::scenario::Scenario;
use crate::supervise::{Spec, Supervisor};

/// How to start one worker.
#[derive(Clone)]
pub struct WorkerCommand {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// The database-link proxies, when the scenario has a step on them: each slot's worker
    /// (its replacements too) reaches PostgreSQL through its slot's own.
    pub db_links: Option<Arc<crate::netchaos::Links>>,
}

pub struct World {
    pub scenario: Scenario,
    pub ledger: Ledger,
    /// The ledger as it is recorded: `ledger.jsonl` and the checkers' entries.
    pub journal: super::journal::Journal,
    pub supervisor: Supervisor,
    pub attributor: Attributor,
    pub worker: WorkerCommand,
    /// slot (1-based) → current pid.
    slots: Mutex<BTreeMap<u32, u32>>,
    restarts: Mutex<HashMap<u32, u32>>,
    timeline: Mutex<Vec<TimelineEvent>>,
    /// ledger seq → pid of the sender.
    pids: Mutex<Pids>,
    /// Sends whose connection was not resolved on accept (seq, peer), resolved in batches.
    unresolved: Mutex<Vec<(u64, Provider, SocketAddr)>>,
    /// pid → sends attributed to it, per provider ([`Provider::index`]).
    sends_by_pid: Mutex<HashMap<u32, [u64; 3]>>,
    /// See [`World::sends_sender_gone`].
    sender_gone: AtomicU64,
    accepted: [AtomicU64; 3],
    accepted_total: AtomicU64,
    faults: AtomicU64,
    /// Where timeline events are echoed live (None: quiet).
    pub printer: Mutex<Option<super::progress::Printer>>,
    /// Notified on every accepted send (progress triggers wait on it).
    pub progress: tokio::sync::Notify,
    /// Notified each time the API answers a batch 2xx (a step on the API aims right after one).
    pub enqueue_answered: Arc<tokio::sync::Notify>,
}

impl World {
    pub fn new(
        scenario: Scenario,
        (ledger, journal): (Ledger, super::journal::Journal),
        supervisor: Supervisor,
        attributor: Attributor,
        worker: WorkerCommand,
    ) -> Arc<World> {
        Arc::new(World {
            scenario,
            ledger,
            journal,
            supervisor,
            attributor,
            worker,
            slots: Mutex::default(),
            restarts: Mutex::default(),
            timeline: Mutex::default(),
            pids: Mutex::default(),
            unresolved: Mutex::default(),
            sends_by_pid: Mutex::default(),
            sender_gone: AtomicU64::new(0),
            accepted: Default::default(),
            accepted_total: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            progress: tokio::sync::Notify::new(),
            enqueue_answered: Arc::default(),
            printer: Mutex::new(None),
        })
    }

    pub fn now_ns(&self) -> u64 {
        self.ledger.now_ns()
    }

    pub fn event(
        &self,
        kind: EventKind,
        slot: Option<u32>,
        pid: Option<u32>,
        detail: impl Into<String>,
    ) {
        self.record_event(kind, None, slot, pid, detail.into());
    }

    /// An event of a provider action: like [`World::event`], naming the provider.
    pub fn provider_event(
        &self,
        kind: EventKind,
        provider: Provider,
        slot: Option<u32>,
        pid: Option<u32>,
        detail: impl Into<String>,
    ) {
        self.record_event(kind, Some(provider), slot, pid, detail.into());
    }

    fn record_event(
        &self,
        kind: EventKind,
        provider: Option<Provider>,
        slot: Option<u32>,
        pid: Option<u32>,
        detail: String,
    ) {
        let ev = TimelineEvent {
            mono_ns: self.now_ns(),
            kind,
            slot,
            pid,
            provider,
            detail,
        };
        tracing::info!(kind = kind.as_str(), ?slot, ?pid, detail = %ev.detail, "event");
        if let Some(p) = self.printer.lock().unwrap().as_ref() {
            let who = match (slot, pid) {
                (Some(s), Some(p)) => format!(" worker {s} (pid {p})"),
                (None, Some(p)) => format!(" pid {p}"),
                _ => String::new(),
            };
            let shown = kind.label();
            p.line(&format!(
                "[{:>5.1}s] {shown}{who} {}",
                ev.mono_ns as f64 / 1e9,
                ev.detail
            ));
        }
        self.timeline.lock().unwrap().push(ev);
    }

    pub fn timeline(&self) -> Vec<TimelineEvent> {
        self.timeline.lock().unwrap().clone()
    }

    /// When the latest event of a kind `pick` chooses happened (ledger clock), if any did.
    pub fn last_event_ns(&self, pick: impl Fn(EventKind) -> bool) -> Option<u64> {
        let timeline = self.timeline.lock().unwrap();
        timeline
            .iter()
            .rev()
            .find(|e| pick(e.kind))
            .map(|e| e.mono_ns)
    }

    /// Takes the attribution of every send (ledger seq → pid), leaving none: for judging, once
    /// the stack has stopped and nothing sends any more (a copy would be a second map as big).
    pub fn take_pids(&self) -> Pids {
        std::mem::take(&mut *self.pids.lock().unwrap())
    }

    /// Attributes send `seq` from `peer`: at once from the connection table when its connection
    /// was resolved on accept (the normal case), else queued for [`World::resolve_pending`].
    fn attribute(&self, seq: u64, provider: Provider, peer: SocketAddr) {
        match self.attributor.connection(peer) {
            Some(Found::Sender(pid)) => self.record_sender(seq, provider, pid),
            // No process held the socket any more when the connection was accepted.
            Some(Found::Closed) => {
                self.sender_gone.fetch_add(1, Ordering::Relaxed);
            }
            Some(Found::Unknown) | None => {
                self.unresolved.lock().unwrap().push((seq, provider, peer));
            }
        }
    }

    /// Sends on connections whose client socket was already closed when the provider accepted
    /// the connection: their sender hung up or died (a SIGKILL) between its `connect` and the
    /// accept, so no lookup can name it. They are among the unattributed sends.
    pub fn sends_sender_gone(&self) -> u64 {
        self.sender_gone.load(Ordering::Relaxed)
    }

    fn record_sender(&self, seq: u64, provider: Provider, pid: u32) {
        self.pids.lock().unwrap().insert(seq, pid);
        self.sends_by_pid.lock().unwrap().entry(pid).or_default()[provider.index()] += 1;
    }

    /// Attributes every queued send to its sender (one read of the socket tables for all): the
    /// fallback for sends whose connection was not resolved when it was accepted.
    pub fn resolve_pending(&self) {
        let batch: Vec<(u64, Provider, SocketAddr)> =
            std::mem::take(&mut *self.unresolved.lock().unwrap());
        if batch.is_empty() {
            return;
        }
        let peers: Vec<_> = batch.iter().map(|(_, _, p)| *p).collect();
        let found = self.attributor.resolve_many(&peers);
        for ((seq, provider, _), pid) in batch.iter().zip(found) {
            if let Some(pid) = pid {
                self.record_sender(*seq, *provider, pid);
            }
        }
    }

    /// The sender of ledger entry `seq`, looked up now if still queued (for `target = "sender"`).
    pub fn sender_of(&self, seq: u64, peer: Option<SocketAddr>) -> Option<u32> {
        if let Some(pid) = self.pids.lock().unwrap().get(seq) {
            return Some(pid);
        }
        peer.and_then(|p| {
            self.attributor
                .sender(p)
                .or_else(|| self.attributor.resolve(p))
        })
    }

    /// Resolves queued senders every few milliseconds until the world is dropped: the fallback
    /// must run while the connections are open, but never on a provider's request path.
    pub fn spawn_resolver(self: &Arc<World>) {
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("ting-attribution".into())
            .spawn(move || {
                while let Some(w) = weak.upgrade() {
                    w.resolve_pending();
                    drop(w);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            })
            .expect("spawn the attribution thread");
    }

    pub fn accepted_total(&self) -> u64 {
        self.accepted_total.load(Ordering::Relaxed)
    }

    /// Sends `provider` accepted so far (new deliveries; idempotent repeats are not counted).
    pub fn accepted_on(&self, provider: Provider) -> u64 {
        self.accepted[provider.index()].load(Ordering::Relaxed)
    }

    pub fn faults_injected(&self) -> u64 {
        self.faults.load(Ordering::Relaxed)
    }

    /// Starts the worker for `slot` (a restart when the slot had one before).
    pub async fn start_worker(&self, slot: u32) -> anyhow::Result<u32> {
        let n = {
            let mut r = self.restarts.lock().unwrap();
            let n = r.entry(slot).or_insert(0);
            let cur = *n;
            *n += 1;
            cur
        };
        let worker_id = if n == 0 {
            format!("w{slot}")
        } else {
            format!("w{slot}-r{n}")
        };
        let mut env = self.worker.env.clone();
        env.insert("TING_WORKER_ID".into(), worker_id.clone());
        let owner = crate::netchaos::LinkOwner::Worker(slot);
        super::db_links::route(&self.worker.db_links, owner, &mut env).await?;
        let pid = self
            .supervisor
            .spawn(Spec {
                role: Role::Worker,
                slot: Some(slot),
                worker_id: Some(worker_id.clone()),
                argv: self.worker.argv.clone(),
                env,
                cwd: self.worker.cwd.clone(),
            })
            .await?;
        self.attributor.add_candidate(pid);
        self.slots.lock().unwrap().insert(slot, pid);
        self.event(
            if n == 0 {
                EventKind::Spawn
            } else {
                EventKind::Restart
            },
            Some(slot),
            Some(pid),
            worker_id,
        );
        Ok(pid)
    }

    /// (slot, pid) of every worker slot whose process is alive.
    pub fn live_workers(&self) -> Vec<(u32, u32)> {
        self.slots
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, pid)| self.supervisor.is_alive(**pid))
            .map(|(s, p)| (*s, *p))
            .collect()
    }

    pub fn slot_of(&self, pid: u32) -> Option<u32> {
        self.slots
            .lock()
            .unwrap()
            .iter()
            .find(|(_, p)| **p == pid)
            .map(|(s, _)| *s)
    }

    /// Of `candidates` (live (slot, pid) pairs), the worker that has sent the most so far: to
    /// `provider`, or to all three. Ties go to the lowest slot.
    pub fn busiest_of(
        &self,
        candidates: &[(u32, u32)],
        provider: Option<Provider>,
    ) -> Option<(u32, u32)> {
        let sends = self.sends_by_pid.lock().unwrap().clone();
        busiest_of(candidates, &sends, provider)
    }

    /// Of `live`, the worker a `busiest` fault on the link to `provider` is aimed at
    /// ([`busiest_for_link`]), given the workers another step's link fault holds now: on any
    /// link (`held_any`) and on the link to `provider` (`held_here`).
    pub fn busiest_for_link(
        &self,
        live: &[(u32, u32)],
        provider: Provider,
        held_any: &HashSet<u32>,
        held_here: &HashSet<u32>,
    ) -> Option<(u32, u32)> {
        let sends = self.sends_by_pid.lock().unwrap().clone();
        busiest_for_link(live, &sends, provider, held_any, held_here)
    }
}

/// The target of a `busiest` fault on the link to `provider`: the busiest sender to it among the
/// `live` workers that have sent to it and whose links no other fault holds (`held_any`);
/// failing those, the busiest among the workers whose link to `provider` none holds
/// (`held_here`). A process whose link to another provider is faulted may have every sender of
/// its own stuck there (a thread pool waiting on slowed e-mails sends no SMS), so a second fault
/// aimed at it can meet nothing; a fault on the same link meets nothing the first one does not
/// already take.
fn busiest_for_link(
    live: &[(u32, u32)],
    sends: &HashMap<u32, [u64; 3]>,
    provider: Provider,
    held_any: &HashSet<u32>,
    held_here: &HashSet<u32>,
) -> Option<(u32, u32)> {
    let sent = |pid: &u32| sends.get(pid).is_some_and(|s| s[provider.index()] > 0);
    let fresh: Vec<_> = live
        .iter()
        .filter(|(_, pid)| !held_any.contains(pid) && sent(pid))
        .copied()
        .collect();
    if !fresh.is_empty() {
        return busiest_of(&fresh, sends, Some(provider));
    }
    let open: Vec<_> = live
        .iter()
        .filter(|(_, pid)| !held_here.contains(pid))
        .copied()
        .collect();
    busiest_of(&open, sends, Some(provider))
}

/// Of the `live` (slot, pid) pairs, the one with the most sends to `provider` (to all three
/// without one) in `sends`; ties go to the lowest slot.
fn busiest_of(
    live: &[(u32, u32)],
    sends: &HashMap<u32, [u64; 3]>,
    provider: Option<Provider>,
) -> Option<(u32, u32)> {
    let count = |pid: &u32| {
        let by_provider = sends.get(pid).copied().unwrap_or_default();
        match provider {
            Some(p) => by_provider[p.index()],
            None => by_provider.iter().sum(),
        }
    };
    live.iter()
        .copied()
        .max_by_key(|(slot, pid)| (count(pid), u32::MAX - slot))
}

/// The ledger hook: attributes each request to its sender and counts progress. Register it before
/// the stack starts, so that it sees every connection the stack opens.
pub struct Observer {
    pub world: Arc<World>,
    pub chaos: Arc<super::chaos::Chaos>,
    /// The batches' addresses per provider: only their accepts count as progress (the
    /// trickle's orders are not part of the campaign a `progress` trigger or bar is about).
    pub campaign: [std::collections::HashSet<Name>; 3],
}

impl Observer {
    /// `campaign` holds the batches' (provider, address) pairs.
    pub fn new(
        world: Arc<World>,
        chaos: Arc<super::chaos::Chaos>,
        campaign: impl IntoIterator<Item = (Provider, Name)>,
    ) -> Observer {
        let mut by_provider: [std::collections::HashSet<Name>; 3] = Default::default();
        for (p, address) in campaign {
            by_provider[p.index()].insert(address);
        }
        Observer {
            world,
            chaos,
            campaign: by_provider,
        }
    }
}

impl Hook for Observer {
    /// Resolves the connection's sender while the client waits for our first byte, so its sends
    /// are attributed even if it closes the connection right after them.
    fn on_connect<'a>(&'a self, peer: SocketAddr) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(async move {
            self.world.attributor.connected(peer).await;
        })
    }

    fn on_entry(&self, e: &LedgerEntry) {
        let w = &self.world;
        if e.kind == EntryKind::Send {
            if let Some(peer) = e.peer {
                w.attribute(e.seq, e.provider, peer);
            }
            if e.fault.is_some() {
                w.faults.fetch_add(1, Ordering::Relaxed);
            }
            let campaign = self.campaign[e.provider.index()].contains(e.recipient.as_str());
            if e.outcome == Outcome::Accepted && campaign {
                let n = w.accepted[e.provider.index()].fetch_add(1, Ordering::Relaxed) + 1;
                w.accepted_total.fetch_add(1, Ordering::Relaxed);
                self.chaos.note_accept(e, n);
                w.progress.notify_waiters();
            }
        }
    }

    fn on_request<'a>(
        &'a self,
        provider: Provider,
        peer: SocketAddr,
    ) -> futures::future::BoxFuture<'a, mock_providers::link::LinkFate> {
        Box::pin(self.chaos.on_request(provider, peer))
    }

    fn refuses(&self, provider: Provider, peer: SocketAddr) -> bool {
        self.chaos.refuses(provider, peer)
    }

    fn before_response<'a>(&'a self, e: &'a LedgerEntry) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(self.chaos.fire_on_accept(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider action's `busiest` is the worker busiest with that provider: in a stack whose
    /// workers each keep to a channel, the busiest worker in all may never send to it.
    #[test]
    fn busiest_counts_the_provider_asked_about() {
        let live = [(1, 101), (2, 102), (3, 103)];
        // Worker 1 sends SMS only, worker 2 LINE only, worker 3 e-mail only.
        let sends = HashMap::from([(101, [0, 0, 900]), (102, [300, 0, 0]), (103, [0, 200, 0])]);
        assert_eq!(busiest_of(&live, &sends, None), Some((1, 101)));
        assert_eq!(
            busiest_of(&live, &sends, Some(Provider::Line)),
            Some((2, 102))
        );
        assert_eq!(
            busiest_of(&live, &sends, Some(Provider::Smtp)),
            Some((3, 103))
        );
        assert_eq!(
            busiest_of(&live, &sends, Some(Provider::Sms)),
            Some((1, 101))
        );
        // Nothing sent yet (or a dead worker's sends only): the lowest live slot.
        let dead_only = HashMap::from([(999, [5, 5, 5])]);
        assert_eq!(
            busiest_of(&live, &dead_only, Some(Provider::Line)),
            Some((1, 101))
        );
        assert_eq!(busiest_of(&[], &sends, None), None);
    }

    /// A link fault's `busiest` passes over a worker another link fault holds: the busiest SMS
    /// sender, its e-mails slowed, may have every sender stuck on them (py-stack's thread pool
    /// on `provider-links`: the SMS partition met nothing in 2 seeds of 10, INCONCLUSIVE).
    /// Falls back to it when no other worker sends SMS, and never takes a worker whose link to
    /// the same provider is held.
    #[test]
    fn a_link_faults_busiest_passes_over_a_worker_another_link_fault_holds() {
        let live = [(1, 101), (2, 102), (3, 103)];
        let sends = HashMap::from([(101, [50, 50, 50]), (102, [40, 40, 40]), (103, [30, 0, 30])]);
        let none = HashSet::new();
        let sms = Provider::Sms;
        let pick = |held_any: &HashSet<u32>, held_here: &HashSet<u32>, sends| {
            busiest_for_link(&live, sends, sms, held_any, held_here)
        };
        assert_eq!(pick(&none, &none, &sends), Some((1, 101)));
        let smtp_slowed_on_1 = HashSet::from([101]);
        assert_eq!(pick(&smtp_slowed_on_1, &none, &sends), Some((2, 102)));
        // Workers 2 and 3 held too: worker 1 after all (its SMS link is free).
        let all = HashSet::from([101, 102, 103]);
        assert_eq!(pick(&all, &none, &sends), Some((1, 101)));
        // Worker 1's SMS link held: never worker 1.
        assert_eq!(pick(&all, &smtp_slowed_on_1, &sends), Some((2, 102)));
        // A free worker that never sent SMS is no better target than a held one that does.
        let only_1_sends_sms = HashMap::from([(101, [0, 0, 50]), (102, [40, 40, 0])]);
        assert_eq!(
            pick(&smtp_slowed_on_1, &none, &only_1_sends_sms),
            Some((1, 101))
        );
    }
}
