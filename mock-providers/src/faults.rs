//! Seeded, timing-free fault decisions.
//!
//! Whether attempt `k` to recipient `r` on provider `p` is faulted derives only from
//! (seed, p, r, k) through a keyed hash, so the same seed injects the same faults whatever order
//! requests arrive in. The harness calls [`is_bad_address`] too, to know which recipients the
//! providers will reject for good, without asking them.

use sha2::{Digest, Sha256};

use crate::ledger::Provider;
use crate::units::Ratio;

/// A uniform draw in `[0, 1)` for (seed, provider, subject, salt).
pub fn unit(seed: u64, provider: Provider, subject: &str, salt: &str) -> f64 {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(provider.as_str().as_bytes());
    h.update([0]);
    h.update(subject.as_bytes());
    h.update([0]);
    h.update(salt.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    // 53 random bits → exactly representable in f64.
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

/// Whether `address` is in the seeded share of permanently bad addresses on `provider`.
pub fn is_bad_address(seed: u64, provider: Provider, address: &str, rate: Ratio) -> bool {
    rate.get() > 0.0 && unit(seed, provider, address, "bad-address") < rate.get()
}

/// Picks at most one of `rates` for attempt `attempt` to `recipient`: the faults partition
/// `[0, 1)` in order, so their rates add up (capped at 1) and exactly one draw decides.
/// Returns the index of the chosen fault.
pub fn pick(
    seed: u64,
    provider: Provider,
    recipient: &str,
    attempt: u32,
    salt: &str,
    rates: impl IntoIterator<Item = Ratio>,
) -> Option<usize> {
    let u = unit(seed, provider, recipient, &format!("{salt}#{attempt}"));
    let mut acc = 0.0;
    for (i, r) in rates.into_iter().enumerate() {
        acc += r.get();
        if u < acc {
            return Some(i);
        }
    }
    None
}

/// A seeded generator for one (provider, recipient, attempt, purpose), for decisions that need
/// several draws (latency samples, callback schedules).
pub fn rng(
    seed: u64,
    provider: Provider,
    recipient: &str,
    attempt: u32,
    salt: &str,
) -> rand_chacha::ChaCha8Rng {
    use rand::SeedableRng;
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(provider.as_str().as_bytes());
    h.update([0]);
    h.update(recipient.as_bytes());
    h.update(attempt.to_le_bytes());
    h.update(salt.as_bytes());
    let d: [u8; 32] = h.finalize().into();
    rand_chacha::ChaCha8Rng::from_seed(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_address_share_is_close_to_rate() {
        let rate = Ratio(0.1);
        let n = 20_000;
        let bad = (0..n)
            .filter(|i| is_bad_address(7, Provider::Sms, &format!("+1555{i:07}"), rate))
            .count();
        let share = bad as f64 / n as f64;
        assert!((0.09..0.11).contains(&share), "share {share}");
    }

    #[test]
    fn pick_depends_only_on_inputs() {
        let rates = [Ratio(0.2), Ratio(0.3)];
        let a: Vec<_> = (0..100)
            .map(|k| pick(1, Provider::Line, "U1", k, "t", rates))
            .collect();
        let b: Vec<_> = (0..100)
            .rev()
            .map(|k| pick(1, Provider::Line, "U1", k, "t", rates))
            .collect();
        let b: Vec<_> = b.into_iter().rev().collect();
        assert_eq!(a, b);
        assert!(a.iter().any(|x| x.is_none()) && a.iter().any(|x| x.is_some()));
        let other_seed: Vec<_> = (0..100)
            .map(|k| pick(2, Provider::Line, "U1", k, "t", rates))
            .collect();
        assert_ne!(a, other_seed);
    }
}
