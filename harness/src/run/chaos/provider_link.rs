//! The chaos actions on one process's link to one provider (`provider_partition`,
//! `provider_refuse`, `provider_reset`, `provider_latency`): while a step lasts, every send
//! request its target workers make to that provider meets the fault, decided per request in the
//! fakes' `on_request` hook from the sender's pid ([`Links::fate`]) and carried out by the fakes
//! (`mock_providers::link`): held until the heal, reset unread, served then reset before the
//! answer, or delayed. The SMTP fake asks about a refuse before each command instead
//! ([`Links::refuses`]) and closes the connection there, before any of a message is sent. A step is applied once at least one request met it (counted as they
//! arrive); each lands on the timeline as a span per target process, from its start to its heal.
//!
//! The targets are the workers the step names when it fires; a replacement started during the
//! step has a link of its own and is not hit. A guard ends the fault when the step's task ends,
//! also when the run stops early and aborts it: a link must never stay cut while the stack
//! shuts down.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mock_providers::ledger::Provider;
use mock_providers::link::{LinkFate, Partition};
use rand::{Rng, SeedableRng};

use super::Chaos;
use crate::check::EventKind;
use crate::report::chaos_steps::ChaosOutcome;
use crate::scenario::{ChaosStep, ProviderLinkFault, ProviderLinkKind};

/// The link faults in force, looked up for every send request while any is.
#[derive(Default)]
pub struct Links {
    rules: Mutex<Vec<Arc<Rule>>>,
}

/// One step's fault on its targets' links to one provider.
struct Rule {
    step: usize,
    provider: Provider,
    pids: HashSet<u32>,
    fate: Fate,
    /// Requests that met it.
    met: AtomicU64,
}

/// What a rule makes of each request it meets.
enum Fate {
    Hold(mock_providers::link::Heal),
    Refuse,
    Reset,
    /// The delay, and the jitter drawn per request from the run's seed.
    Delay {
        base: Duration,
        jitter: Duration,
        rng: Box<Mutex<rand_chacha::ChaCha8Rng>>,
    },
}

impl Links {
    /// The rule in force on `provider` for `sender` that `applies`, counted as met.
    fn meet(
        &self,
        provider: Provider,
        sender: impl FnOnce() -> Option<u32>,
        applies: impl Fn(&Fate) -> bool,
    ) -> Option<Arc<Rule>> {
        let rules = {
            let rules = self.rules.lock().unwrap();
            if rules.is_empty() {
                return None;
            }
            rules.clone()
        };
        let pid = sender()?;
        let rule = rules
            .into_iter()
            .find(|r| r.provider == provider && r.pids.contains(&pid) && applies(&r.fate))?;
        rule.met.fetch_add(1, Ordering::Relaxed);
        Some(rule)
    }

    /// The workers whose link to `provider` (to any provider with `None`) a step's fault holds
    /// now (see `World::busiest_for_link`).
    pub fn faulted(&self, provider: Option<Provider>) -> HashSet<u32> {
        let rules = self.rules.lock().unwrap();
        rules
            .iter()
            .filter(|r| provider.is_none_or(|p| r.provider == p))
            .flat_map(|r| r.pids.iter().copied())
            .collect()
    }

    /// Whether `sender`'s link to `provider` is down for an SMTP command (`provider_refuse`,
    /// asked before each command outside a message; counted as met).
    pub fn refuses(&self, provider: Provider, sender: impl FnOnce() -> Option<u32>) -> bool {
        self.meet(provider, sender, |f| matches!(f, Fate::Refuse))
            .is_some()
    }

    /// The fate of a send request to `provider` from `sender`: the first rule on that provider
    /// and pid, counted as met. An SMTP refuse acts before each command ([`Links::refuses`]),
    /// never at the final dot, where a reset would leave the sender unsure what was sent.
    pub fn fate(&self, provider: Provider, sender: impl FnOnce() -> Option<u32>) -> LinkFate {
        let at_dot = |f: &Fate| !(provider == Provider::Smtp && matches!(f, Fate::Refuse));
        let Some(rule) = self.meet(provider, sender, at_dot) else {
            return LinkFate::Pass;
        };
        match &rule.fate {
            Fate::Hold(heal) => LinkFate::Hold(heal.clone()),
            Fate::Refuse => LinkFate::Refuse,
            Fate::Reset => LinkFate::Reset,
            Fate::Delay { base, jitter, rng } => {
                let extra = if jitter.is_zero() {
                    Duration::ZERO
                } else {
                    let nanos = rng.lock().unwrap().gen_range(0..=jitter.as_nanos() as u64);
                    Duration::from_nanos(nanos)
                };
                LinkFate::Delay(*base + extra)
            }
        }
    }

    fn add(&self, rule: Arc<Rule>) {
        self.rules.lock().unwrap().push(rule);
    }

    fn remove(&self, step: usize) {
        self.rules.lock().unwrap().retain(|r| r.step != step);
    }
}

/// Ends a step's fault when dropped: the rule removed, a partition healed (its held requests
/// go on), the fakes told one link fault fewer is in force.
struct Lift {
    chaos: Arc<Chaos>,
    step: usize,
    partition: Option<Partition>,
    hub: Arc<mock_providers::hub::Hub>,
}

impl Drop for Lift {
    fn drop(&mut self) {
        self.chaos.links.remove(self.step);
        if let Some(p) = self.partition.take() {
            p.heal();
        }
        self.hub.arm_link_fault(false);
    }
}

fn words(f: &ProviderLinkFault) -> String {
    let p = f.provider.as_str();
    match f.kind {
        ProviderLinkKind::Partition => format!("partition of the link to {p}"),
        ProviderLinkKind::Refuse => format!("link to {p} down (requests cut unread)"),
        ProviderLinkKind::Reset => format!("answers from {p} reset"),
        ProviderLinkKind::Latency { delay, jitter } => format!(
            "{} (+ up to {}) added to every send to {p}",
            humantime::format_duration(delay),
            humantime::format_duration(jitter)
        ),
    }
}

fn start_kind(k: ProviderLinkKind) -> EventKind {
    match k {
        ProviderLinkKind::Partition => EventKind::ProviderLinkPartition,
        ProviderLinkKind::Refuse => EventKind::ProviderLinkRefuse,
        ProviderLinkKind::Reset => EventKind::ProviderLinkReset,
        ProviderLinkKind::Latency { .. } => EventKind::ProviderLinkSlow,
    }
}

fn met_words(k: ProviderLinkKind) -> &'static str {
    match k {
        ProviderLinkKind::Partition => "held until the heal or their sender's hang-up",
        ProviderLinkKind::Refuse => "cut before the provider read them",
        ProviderLinkKind::Reset => "served, then reset before the answer",
        ProviderLinkKind::Latency { .. } => "delayed",
    }
}

/// Runs provider-link step `i`: the fault on its targets' links now, lifted after `for`.
pub(super) fn act(chaos: &Arc<Chaos>, i: usize, step: &ChaosStep, sender: Option<u32>, why: &str) {
    let Some(fault) = step.provider_link else {
        return;
    };
    let Some(hub) = chaos.hub() else {
        chaos.log(i).decide(
            ChaosOutcome::Skipped,
            format!("{why}: no provider link to cut (the fakes are not running)"),
        );
        return;
    };
    let w = &chaos.world;
    let targets = chaos.targets(step, sender);
    if targets.is_empty() {
        let reason = format!("{why}: no live worker matches {:?}", step.target);
        w.event(EventKind::ChaosNoTarget, None, None, reason.clone());
        chaos.log(i).decide(ChaosOutcome::NoTarget, reason);
        return;
    }
    let (partition, fate) = match fault.kind {
        ProviderLinkKind::Partition => {
            let (p, heal) = Partition::new();
            (Some(p), Fate::Hold(heal))
        }
        ProviderLinkKind::Refuse => (None, Fate::Refuse),
        ProviderLinkKind::Reset => (None, Fate::Reset),
        ProviderLinkKind::Latency { delay, jitter } => {
            let seed = w.scenario.seed ^ 0x11E7_0000 ^ i as u64;
            let rng = Box::new(Mutex::new(rand_chacha::ChaCha8Rng::seed_from_u64(seed)));
            (
                None,
                Fate::Delay {
                    base: delay,
                    jitter,
                    rng,
                },
            )
        }
    };
    let rule = Arc::new(Rule {
        step: i,
        provider: fault.provider,
        pids: targets.iter().map(|(_, pid)| *pid).collect(),
        fate,
        met: AtomicU64::new(0),
    });
    let hold = step.duration.unwrap_or_default();
    hub.arm_link_fault(true);
    chaos.links.add(rule.clone());
    let lift = Lift {
        chaos: chaos.clone(),
        step: i,
        partition,
        hub,
    };
    let what = words(&fault);
    for (slot, pid) in &targets {
        chaos.log(i).target(*pid, 0);
        w.provider_event(
            start_kind(fault.kind),
            fault.provider,
            Some(*slot),
            Some(*pid),
            format!("{why}; {what} for {}", humantime::format_duration(hold)),
        );
    }
    chaos.log(i).owe();
    let me = chaos.clone();
    chaos.keep(tokio::spawn(async move {
        tokio::time::sleep(hold).await;
        drop(lift);
        let met = rule.met.load(Ordering::Relaxed);
        let detail = format!(
            "{what} ended after {}: {met} send requests {}",
            humantime::format_duration(hold),
            met_words(fault.kind)
        );
        for (slot, pid) in &targets {
            me.world.provider_event(
                EventKind::ProviderLinkHeal,
                fault.provider,
                Some(*slot),
                Some(*pid),
                &detail,
            );
        }
        let mut log = me.log(i);
        log.count(met);
        if met == 0 {
            let p = fault.provider.as_str();
            log.observe(
                false,
                format!("{detail}: no send met it (the targets sent nothing to {p} meanwhile)"),
            );
        } else {
            log.observe(true, detail);
        }
    }));
}
