//! The token bucket behind each HTTP fake's `rate_limit` (requests per second → 429).
//!
//! This is the one fault that depends on timing by nature: a scenario that sets `rate_limit`
//! cannot be replayed request for request. It must never be consulted when no limit is set.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A bucket holding up to `max(rate, 1)` tokens, refilled at `rate` per second.
#[derive(Debug)]
pub struct RateLimiter {
    state: Mutex<Option<(f64, Instant)>>,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimiter {
    pub fn new() -> RateLimiter {
        RateLimiter {
            state: Mutex::new(None),
        }
    }

    /// Takes one token at `now` if there is one. Otherwise returns how long until there will be,
    /// which the caller sends as `Retry-After`.
    pub fn try_take_at(&self, rate: f64, now: Instant) -> Result<(), Duration> {
        let rate = if rate.is_finite() && rate > 0.0 {
            rate
        } else {
            f64::MIN_POSITIVE
        };
        let burst = rate.max(1.0);
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, last) = st.get_or_insert((burst, now));
        let elapsed = now.saturating_duration_since(*last).as_secs_f64();
        *tokens = (*tokens + elapsed * rate).min(burst);
        *last = now.max(*last);
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                ((1.0 - *tokens) / rate).min(3600.0),
            ))
        }
    }

    pub fn try_take(&self, rate: f64) -> Result<(), Duration> {
        self.try_take_at(rate, Instant::now())
    }

    /// Forgets the bucket's level (control API reset).
    pub fn reset(&self) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_burst_then_refills_at_rate() {
        let rl = RateLimiter::new();
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // (at ms, rate, allowed?)
        let cases: &[(u64, f64, bool)] = &[
            (0, 2.0, true),
            (0, 2.0, true),
            (0, 2.0, false),
            (250, 2.0, false),
            (500, 2.0, true),
            (500, 2.0, false),
            (1500, 2.0, true),
            (1500, 2.0, true),
            (1500, 2.0, false),
        ];
        for (i, (at, rate, want)) in cases.iter().enumerate() {
            assert_eq!(rl.try_take_at(*rate, ms(*at)).is_ok(), *want, "case {i}");
        }
        let wait = rl.try_take_at(2.0, ms(1500)).unwrap_err();
        assert!(
            wait <= Duration::from_millis(500) && wait > Duration::ZERO,
            "{wait:?}"
        );
    }
}
