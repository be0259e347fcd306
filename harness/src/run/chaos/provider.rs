//! `provider_outage`: a provider answers every send 503, or reads it and never answers, for
//! every process (SMTP: 421 at every RCPT, or the RCPT never answered), for `for`; then it
//! recovers. Driven through the fakes' fault profile (the same field `PUT /_mock/faults` sets),
//! so the fake records what it did on each entry (`outage_503`, `outage_421`, `outage_hang`).
//! Applied once the outage answered or held at least one send request (counted by the fakes as
//! the requests arrive): an outage nobody met proved nothing.

use std::sync::Arc;

use mock_providers::ledger::Provider;
use mock_providers::outage::{Outage, OutageMode};

use super::Chaos;
use crate::check::EventKind;
use crate::report::chaos_steps::ChaosOutcome;
use crate::scenario::ChaosStep;

fn mode_str(m: OutageMode, p: Provider) -> &'static str {
    match (m, p) {
        (OutageMode::Unavailable, Provider::Smtp) => "421 at every RCPT",
        (OutageMode::Unavailable, _) => "503 for every send",
        (OutageMode::Hang, _) => "no answer to any send",
    }
}

/// Starts the outage now and ends it after the step's `for`, on a task the run waits for.
pub(super) fn outage(chaos: &Arc<Chaos>, i: usize, step: &ChaosStep, why: &str) {
    let (Some(fault), Some(hub)) = (step.provider_fault, chaos.hub()) else {
        chaos.log(i).decide(
            ChaosOutcome::Skipped,
            format!("{why}: no provider to fail (the fakes are not running)"),
        );
        return;
    };
    let hold = step.duration.unwrap_or_default();
    let name = fault.provider.as_str();
    if let Err(e) = hub.set_outage(fault.provider, Some(Outage { mode: fault.mode })) {
        chaos
            .log(i)
            .decide(ChaosOutcome::Skipped, format!("{why}: {e}"));
        return;
    }
    let before = hub.outage_hits(fault.provider);
    chaos.log(i).owe();
    let w = &chaos.world;
    w.provider_event(
        EventKind::ProviderOutage,
        fault.provider,
        None,
        None,
        format!(
            "{name}: {} for {} ({why})",
            mode_str(fault.mode, fault.provider),
            humantime::format_duration(hold)
        ),
    );
    let me = chaos.clone();
    chaos.keep(tokio::spawn(async move {
        tokio::time::sleep(hold).await;
        // Healing cannot fail: the profile is the fakes' own memory.
        let _ = hub.set_outage(fault.provider, None);
        let met = hub.outage_hits(fault.provider) - before;
        let detail = format!(
            "{name} recovered after {}: the outage answered or held {met} send requests",
            humantime::format_duration(hold)
        );
        me.world.provider_event(
            EventKind::ProviderOutageEnd,
            fault.provider,
            None,
            None,
            detail.clone(),
        );
        let mut log = me.log(i);
        log.count(met);
        if met == 0 {
            log.observe(
                false,
                format!("{detail}: no send met it (it ended before the stack sent to {name})"),
            );
        } else {
            log.observe(true, detail);
        }
    }));
}
