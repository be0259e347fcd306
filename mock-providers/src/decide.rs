//! The fault decision the HTTP fakes share: bad address → sticky faults → permanent faults →
//! transient faults → accept, keyed on (seed, provider, recipient, attempt) and nothing else.
//!
//! Rate limiting and idempotency are stateful and decided by each fake before it calls here.
//! This module must never read the clock.

use std::borrow::Cow;
use std::time::Duration;

use crate::config::{HttpFault, Latency, StickyFault};
use crate::faults;
use crate::ledger::Provider;
use crate::units::Ratio;

/// What the seeded dice say about one send attempt.
#[derive(Debug, PartialEq)]
pub enum Verdict<'a> {
    /// The recipient is in the seeded share of bad addresses.
    BadAddress,
    /// An injected fault from the `sticky`, `permanent` or `transient` list.
    Fault {
        fault: Cow<'a, HttpFault>,
        permanent: bool,
    },
    Accept,
}

/// Decides attempt `attempt` to `recipient`.
pub fn decide<'a>(
    seed: u64,
    provider: Provider,
    recipient: &str,
    attempt: u32,
    bad_addresses: Ratio,
    sticky: &[StickyFault],
    permanent: &'a [HttpFault],
    transient: &'a [HttpFault],
) -> Verdict<'a> {
    if faults::is_bad_address(seed, provider, recipient, bad_addresses) {
        return Verdict::BadAddress;
    }
    if let Some(s) = sticky_for(seed, provider, recipient, sticky) {
        if attempt <= s.attempts {
            return Verdict::Fault {
                fault: Cow::Owned(s.fault()),
                permanent: false,
            };
        }
    }
    let any = |list: &[HttpFault]| list.iter().any(|f| f.rate.get() > 0.0);
    let pick = |list: &'a [HttpFault], salt: &str| {
        any(list)
            .then(|| {
                faults::pick(
                    seed,
                    provider,
                    recipient,
                    attempt,
                    salt,
                    list.iter().map(|f| f.rate),
                )
            })
            .flatten()
    };
    if let Some(i) = pick(permanent, "permanent") {
        return Verdict::Fault {
            fault: Cow::Borrowed(&permanent[i]),
            permanent: true,
        };
    }
    if let Some(i) = pick(transient, "transient") {
        return Verdict::Fault {
            fault: Cow::Borrowed(&transient[i]),
            permanent: false,
        };
    }
    Verdict::Accept
}

/// The sticky fault `recipient` is in, if any: one draw per (seed, provider, recipient), the
/// shares partitioning `[0, 1)` in order.
pub fn sticky_for<'a>(
    seed: u64,
    provider: Provider,
    recipient: &str,
    sticky: &'a [StickyFault],
) -> Option<&'a StickyFault> {
    if sticky.iter().all(|s| s.share.get() <= 0.0) {
        return None;
    }
    let u = faults::unit(seed, provider, recipient, "sticky");
    let mut acc = 0.0;
    sticky.iter().find(|s| {
        acc += s.share.get();
        u < acc
    })
}

/// The seeded latency of attempt `attempt` to `recipient` (no draw for a fixed latency).
pub fn latency(
    seed: u64,
    provider: Provider,
    recipient: &str,
    attempt: u32,
    profile: &Latency,
) -> Duration {
    if let Latency::Fixed { value } = profile {
        return value.0;
    }
    let mut rng = faults::rng(seed, provider, recipient, attempt, "latency");
    crate::latency::sample(profile, &mut rng)
}

/// The ledger's `fault` label for an injected HTTP fault, e.g. `http 503 after_commit`.
pub fn label(fault: &HttpFault) -> String {
    let mut s = format!("http {}", fault.status);
    if fault.monthly_quota {
        s.push_str(" monthly_quota");
    }
    if fault.after_commit {
        s.push_str(" after_commit");
    }
    s
}

/// `Retry-After` in whole seconds (rounded up, at least 1) for a wait: what LINE and Twilio send
/// (delay-seconds, RFC 9110 §10.2.3). The ledger records this value, as sent, not the wait.
pub fn retry_after_secs(wait: std::time::Duration) -> u64 {
    (wait.as_secs_f64().ceil() as u64).max(1)
}

/// A `Retry-After` of `secs` as the ledger records it, in milliseconds (saturating: a wait
/// configured in centuries is recorded as the longest, never wrapped).
pub fn retry_after_ms(secs: u64) -> u64 {
    secs.saturating_mul(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(status: u16, rate: f64) -> HttpFault {
        HttpFault {
            status,
            rate: Ratio(rate),
            retry_after: None,
            code: None,
            monthly_quota: false,
            after_commit: false,
        }
    }

    #[test]
    fn order_is_bad_address_then_permanent_then_transient() {
        let perm = [fault(400, 1.0)];
        let trans = [fault(503, 1.0)];
        type Case<'a> = (Ratio, &'a [HttpFault], &'a [HttpFault], Option<u16>);
        let cases: Vec<Case> = vec![
            (Ratio(1.0), &perm, &trans, None),
            (Ratio(0.0), &perm, &trans, Some(400)),
            (Ratio(0.0), &[], &trans, Some(503)),
        ];
        for (bad, p, t, want) in cases {
            let got = decide(1, Provider::Line, "U1", 1, bad, &[], p, t);
            match (got, want) {
                (Verdict::BadAddress, None) => {}
                (Verdict::Fault { fault, .. }, Some(s)) => assert_eq!(fault.status, s),
                (v, w) => panic!("got {v:?}, want {w:?}"),
            }
        }
        assert_eq!(
            decide(1, Provider::Line, "U1", 1, Ratio(0.0), &[], &[], &[]),
            Verdict::Accept
        );
    }

    #[test]
    fn sticky_recipients_fail_their_first_attempts_then_go_on_as_usual() {
        let sticky = [StickyFault {
            share: Ratio(0.25),
            attempts: 3,
            status: 503,
            retry_after: None,
        }];
        let users: Vec<String> = (0..400).map(|i| format!("U{i}")).collect();
        let stuck: Vec<&String> = users
            .iter()
            .filter(|u| sticky_for(7, Provider::Line, u, &sticky).is_some())
            .collect();
        assert!((70..130).contains(&stuck.len()), "{} of 400", stuck.len());
        for u in &stuck {
            let outcome = |attempt| match decide(
                7,
                Provider::Line,
                u,
                attempt,
                Ratio(0.0),
                &sticky,
                &[],
                &[],
            ) {
                Verdict::Fault { fault, permanent } => Some((fault.status, permanent)),
                _ => None,
            };
            let got: Vec<_> = (1..=4).map(outcome).collect();
            assert_eq!(
                got,
                [
                    Some((503, false)),
                    Some((503, false)),
                    Some((503, false)),
                    None
                ]
            );
        }
        // Bad addresses stay bad; another seed picks other recipients.
        let u = stuck[0].as_str();
        assert_eq!(
            decide(7, Provider::Line, u, 1, Ratio(1.0), &sticky, &[], &[]),
            Verdict::BadAddress
        );
        let other: Vec<bool> = users
            .iter()
            .map(|u| sticky_for(8, Provider::Line, u, &sticky).is_some())
            .collect();
        let this: Vec<bool> = users
            .iter()
            .map(|u| sticky_for(7, Provider::Line, u, &sticky).is_some())
            .collect();
        assert_ne!(this, other);
    }

    #[test]
    fn retry_after_is_sent_in_whole_seconds_rounded_up() {
        for (ms, secs) in [(1, 1), (200, 1), (1_000, 1), (1_001, 2), (2_500, 3)] {
            assert_eq!(retry_after_secs(Duration::from_millis(ms)), secs, "{ms} ms");
        }
    }

    #[test]
    fn retry_after_in_milliseconds_saturates() {
        assert_eq!(retry_after_ms(3), 3_000);
        let longest = retry_after_secs(Duration::MAX);
        assert_eq!(retry_after_ms(longest), u64::MAX);
    }
}
