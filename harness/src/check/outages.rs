//! When a provider was out for everyone (`provider_outage`): from the step's start until its end,
//! or until the fake let go of the last request it held, whichever is later (a held request
//! ends only when its sender gives up). Read from the timeline (the step's start and end) and
//! the ledger (the entries the outage answered: `fault` `outage_503`, `outage_421` (SMTP) or
//! `outage_hang`, labels from [`mock_providers::outage::OutageMode::label_for`]), never from
//! the stack.
//!
//! `retry_discipline`'s cap does not count time inside such a window, nor (for any provider)
//! time in which a hung provider held requests: no correct stack gets a send through a provider
//! that answers nobody, and a worker whose every slot holds a request the provider will never
//! answer cannot start any retry before its own timeout frees one.
//! The same holds for a worker whose link to a provider is partitioned or slowed
//! (`provider_partition`, `provider_latency`): its slots fill with requests the provider holds
//! or delays, so from the fault's start to its heal ([`link_windows`]) no retry of any of its
//! deliveries is held to the cap. A refuse or reset answers at once and frees the slot: not
//! counted.
//! Deciding nothing on its own.

use super::Entry;
use mock_providers::ledger::{EntryKind, Provider};
use mock_providers::outage::OutageMode;

use super::{EventKind, Input};

/// Whether `e` is a send an outage answered or held.
pub fn answered_by_outage(e: &Entry) -> bool {
    e.kind == EntryKind::Send && e.fault().and_then(OutageMode::of_label).is_some()
}

/// The windows `[from, to)` during which `provider` was out: each of its outage steps' start to
/// the later of its end and the last answer (or hang-up) of a request it met. An outage that
/// never ended lasts for ever.
pub fn windows(input: &Input, provider: Provider) -> Vec<(u64, u64)> {
    let outages = spans(
        input,
        |k| k == EventKind::ProviderOutage,
        |k| k == EventKind::ProviderOutageEnd,
    );
    // An outage nobody met proved nothing and held nothing up.
    outages
        .into_iter()
        .filter(|o| o.provider == Some(provider))
        .filter_map(
            |Span {
                 from: s, to: end, ..
             }| {
                let met = input.ledger.iter().filter(|e| {
                    e.provider == provider
                        && answered_by_outage(e)
                        && (s..=end).contains(&e.received_ns)
                });
                let last = met.map(|e| e.mono_ns).max()?;
                Some((s, end.max(last)))
            },
        )
        .collect()
}

/// The windows `[start, heal)` during which some worker's link to a provider held or delayed
/// its requests (`provider_partition`, `provider_latency`), for any pid and provider; one
/// without a heal lasts for ever. A partition's request held past the heal (its sender let go
/// of it later) extends nothing: the heal serves every held request at once.
pub fn link_windows(input: &Input) -> Vec<(u64, u64)> {
    spans(
        input,
        |k| {
            matches!(
                k,
                EventKind::ProviderLinkPartition | EventKind::ProviderLinkSlow
            )
        },
        |k| k == EventKind::ProviderLinkHeal,
    )
    .into_iter()
    .map(|s| (s.from, s.to))
    .collect()
}

/// One lasting provider action on the timeline: whose it is and when.
struct Span {
    pid: Option<u32>,
    provider: Option<Provider>,
    from: u64,
    /// `u64::MAX` while no end has come.
    to: u64,
}

/// The spans of the timeline's lasting provider actions: each start (`starts`) to the next end
/// (`ends`) of the same pid and provider — steps on other providers or processes may overlap
/// it — or for ever when none came. In start order.
fn spans(
    input: &Input,
    starts: impl Fn(EventKind) -> bool,
    ends: impl Fn(EventKind) -> bool,
) -> Vec<Span> {
    let mut evs: Vec<_> = input
        .timeline
        .iter()
        .filter(|e| starts(e.kind) || ends(e.kind))
        .collect();
    evs.sort_by_key(|e| e.mono_ns);
    let mut out: Vec<Span> = Vec::new();
    for e in evs {
        if starts(e.kind) {
            out.push(Span {
                pid: e.pid,
                provider: e.provider,
                from: e.mono_ns,
                to: u64::MAX,
            });
        } else if let Some(open) = out
            .iter_mut()
            .find(|s| s.pid == e.pid && s.provider == e.provider && s.to == u64::MAX)
        {
            open.to = e.mono_ns;
        }
    }
    out
}

/// Every span in which a retry to each provider could be held up by an outage, computed once
/// per check from the timeline and the ledger ([`Outages::out_ns`] is asked once per retry).
pub struct Outages {
    /// Per provider ([`Provider::index`]): its spans, unsorted.
    spans: [Vec<(u64, u64)>; 3],
}

impl Outages {
    /// An outage of the provider itself ([`windows`]), any provider-link fault
    /// ([`link_windows`]), or any time some provider held a request it would never answer
    /// (`outage_hang`): a worker's slots are shared by its channels (the contract's per-channel
    /// limit defaults to the worker's), so requests a hung provider holds can keep a worker from
    /// starting any send until its own timeout frees them.
    pub fn of(input: &Input) -> Outages {
        let hang = OutageMode::Hang.label();
        let mut shared = link_windows(input);
        shared.extend(
            input
                .ledger
                .iter()
                .filter(|e| e.kind == EntryKind::Send && e.fault() == Some(hang))
                .map(|e| (e.received_ns, e.mono_ns)),
        );
        let spans = Provider::ALL.map(|p| {
            let mut v = windows(input, p);
            v.extend(shared.iter().copied());
            v
        });
        Outages { spans }
    }

    /// Nanoseconds of `[from, to)` in which a retry to `provider` could be held up by an
    /// outage ([`Outages::of`]). Each moment counted once.
    pub fn out_ns(&self, provider: Provider, from: u64, to: u64) -> u64 {
        if to <= from {
            return 0;
        }
        let mut clipped: Vec<(u64, u64)> = self.spans[provider.index()]
            .iter()
            .map(|(s, e)| ((*s).max(from), (*e).min(to)))
            .filter(|(s, e)| s < e)
            .collect();
        clipped.sort_unstable();
        let (mut total, mut reach) = (0u64, from);
        for (s, e) in clipped {
            let s = s.max(reach);
            if e > s {
                total += e - s;
                reach = e;
            }
        }
        total
    }
}

/// [`Outages::out_ns`] of a run judged once.
#[cfg(test)]
fn out_ns(input: &Input, provider: Provider, from: u64, to: u64) -> u64 {
    Outages::of(input).out_ns(provider, from, to)
}

#[cfg(test)]
mod tests {
    use mock_providers::ledger::Outcome::*;

    use super::*;
    use crate::check::testkit::*;
    use crate::scenario::Channel::*;

    #[test]
    fn a_window_lasts_until_the_last_held_request_is_let_go() {
        let mut w = World::new();
        w.provider_event(EventKind::ProviderOutage, Provider::Sms, None, 1_000);
        w.provider_event(EventKind::ProviderOutageEnd, Provider::Sms, None, 3_000);
        // Held from 1.5 s, its sender gave up at 4.5 s (after the outage ended).
        w.send(Sms, "+1555", Transient, 1_500)
            .latency(3_000)
            .fault("outage_hang");
        // A LINE send in the same time is not the SMS outage's.
        w.send(Line, "U1", Transient, 1_200).fault("http 503");
        let i = w.input();
        assert_eq!(windows(&i, Provider::Sms), vec![(ns(1_000), ns(4_500))]);
        assert!(windows(&i, Provider::Line).is_empty(), "LINE met no outage");
        // (provider, from, to, out ms): LINE only while the SMS request was held (1.5-4.5 s).
        for (p, from, to, want) in [
            (Provider::Sms, 0, 900, 0),
            (Provider::Sms, 0, 2_000, 1_000),
            (Provider::Sms, 4_000, 9_000, 500),
            (Provider::Line, 0, 2_000, 500),
            (Provider::Line, 0, 9_000, 3_000),
            (Provider::Line, 5_000, 9_000, 0),
        ] {
            assert_eq!(
                out_ns(&i, p, ns(from), ns(to)),
                ns(want),
                "{p:?} {from}..{to}"
            );
        }
    }

    #[test]
    fn a_partitioned_or_slowed_link_is_out_time_for_every_provider_until_its_heal() {
        let mut w = World::new();
        w.event(EventKind::ProviderLinkPartition, Some(7), 1_000);
        w.event(EventKind::ProviderLinkSlow, Some(8), 2_000);
        w.event(EventKind::ProviderLinkHeal, Some(7), 3_000);
        // A reset answers at once: no window.
        w.event(EventKind::ProviderLinkReset, Some(9), 3_500);
        w.event(EventKind::ProviderLinkHeal, Some(9), 3_900);
        w.event(EventKind::ProviderLinkHeal, Some(8), 4_000);
        let i = w.input();
        let mut got = link_windows(&i);
        got.sort_unstable();
        assert_eq!(got, vec![(ns(1_000), ns(3_000)), (ns(2_000), ns(4_000))]);
        for p in [Provider::Line, Provider::Smtp, Provider::Sms] {
            assert_eq!(out_ns(&i, p, 0, ns(9_000)), ns(3_000), "{p:?}");
            assert_eq!(out_ns(&i, p, ns(4_000), ns(9_000)), 0, "{p:?}");
        }
    }

    #[test]
    fn overlapping_outages_of_two_providers_each_end_at_their_own_end() {
        let mut w = World::new();
        // SMS out 1-5 s; the mail server out 2-3 s inside it.
        w.provider_event(EventKind::ProviderOutage, Provider::Sms, None, 1_000);
        w.provider_event(EventKind::ProviderOutage, Provider::Smtp, None, 2_000);
        w.provider_event(EventKind::ProviderOutageEnd, Provider::Smtp, None, 3_000);
        w.provider_event(EventKind::ProviderOutageEnd, Provider::Sms, None, 5_000);
        // The SMS outage answered 503 only after the SMTP one had ended.
        w.send(Sms, "+1555", Transient, 3_500).fault("outage_503");
        w.send(Email, "a@example.test", Transient, 2_500)
            .fault("outage_421");
        let i = w.input();
        assert_eq!(windows(&i, Provider::Sms), vec![(ns(1_000), ns(5_000))]);
        assert_eq!(windows(&i, Provider::Smtp), vec![(ns(2_000), ns(3_000))]);
    }

    #[test]
    fn one_workers_link_faults_on_two_providers_each_end_at_their_own_heal() {
        let mut w = World::new();
        w.provider_event(
            EventKind::ProviderLinkPartition,
            Provider::Sms,
            Some(7),
            1_000,
        );
        w.provider_event(EventKind::ProviderLinkSlow, Provider::Line, Some(7), 2_000);
        w.provider_event(EventKind::ProviderLinkHeal, Provider::Line, Some(7), 3_000);
        w.provider_event(EventKind::ProviderLinkHeal, Provider::Sms, Some(7), 6_000);
        let mut got = link_windows(&w.input());
        got.sort_unstable();
        assert_eq!(got, vec![(ns(1_000), ns(6_000)), (ns(2_000), ns(3_000))]);
    }

    #[test]
    fn an_outage_nobody_met_is_no_window() {
        let mut w = World::new();
        w.provider_event(EventKind::ProviderOutage, Provider::Sms, None, 1_000);
        w.provider_event(EventKind::ProviderOutageEnd, Provider::Sms, None, 3_000);
        w.send(Sms, "+1555", Accepted, 1_500);
        assert!(windows(&w.input(), Provider::Sms).is_empty());
    }
}
