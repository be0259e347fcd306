//! The fault decision the HTTP fakes share: bad address → permanent faults → transient faults →
//! accept, keyed on (seed, provider, recipient, attempt) and nothing else.
//!
//! Rate limiting and idempotency are stateful and decided by each fake before it calls here.
//! This module must never read the clock.

use std::time::Duration;

use crate::config::{HttpFault, Latency};
use crate::faults;
use crate::ledger::Provider;
use crate::units::Ratio;

/// What the seeded dice say about one send attempt.
#[derive(Debug, PartialEq)]
pub enum Verdict<'a> {
    /// The recipient is in the seeded share of bad addresses.
    BadAddress,
    /// An injected fault from the `permanent` or `transient` list.
    Fault {
        fault: &'a HttpFault,
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
    permanent: &'a [HttpFault],
    transient: &'a [HttpFault],
) -> Verdict<'a> {
    if faults::is_bad_address(seed, provider, recipient, bad_addresses) {
        return Verdict::BadAddress;
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
            fault: &permanent[i],
            permanent: true,
        };
    }
    if let Some(i) = pick(transient, "transient") {
        return Verdict::Fault {
            fault: &transient[i],
            permanent: false,
        };
    }
    Verdict::Accept
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

/// `Retry-After` in whole seconds (rounded up, at least 1) for a wait.
pub fn retry_after_secs(wait: std::time::Duration) -> u64 {
    (wait.as_secs_f64().ceil() as u64).max(1)
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
            let got = decide(1, Provider::Line, "U1", 1, bad, p, t);
            match (got, want) {
                (Verdict::BadAddress, None) => {}
                (Verdict::Fault { fault, .. }, Some(s)) => assert_eq!(fault.status, s),
                (v, w) => panic!("got {v:?}, want {w:?}"),
            }
        }
        assert_eq!(
            decide(1, Provider::Line, "U1", 1, Ratio(0.0), &[], &[]),
            Verdict::Accept
        );
    }
}
