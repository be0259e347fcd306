//! Retry gaps: `min(max, base × factor^(attempt-1))` with ± jitter, and `Retry-After` wins when
//! the provider asked for a longer wait.
//!
//! Pure arithmetic with the random draw passed in, so tests need no clock and no luck. This module
//! must never sleep: it only says how long to wait.

use std::time::Duration;

/// The contract's `TING_BACKOFF_*` settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    pub base: Duration,
    pub factor: f64,
    pub max: Duration,
    /// Share of the gap added or removed at random, in `[0, 1]`.
    pub jitter: f64,
}

impl Backoff {
    /// The gap after failed attempt number `attempt` (1-based). `unit` is a uniform draw in
    /// `[0, 1)`; `retry_after` is the provider's requested wait, which is never shortened.
    pub fn delay(&self, attempt: i32, unit: f64, retry_after: Option<Duration>) -> Duration {
        let exp = (attempt.max(1) - 1).min(60);
        let raw = self.base.as_secs_f64() * self.factor.powi(exp);
        let capped = raw.min(self.max.as_secs_f64());
        let jittered = capped * (1.0 + self.jitter * (2.0 * unit.clamp(0.0, 1.0) - 1.0));
        let gap = Duration::from_secs_f64(jittered.max(0.0));
        match retry_after {
            Some(ra) if ra > gap => ra,
            _ => gap,
        }
    }

    /// [`Backoff::delay`] with a fresh random draw.
    pub fn delay_random(&self, attempt: i32, retry_after: Option<Duration>) -> Duration {
        self.delay(attempt, rand::random::<f64>(), retry_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let b = Backoff {
            base: Duration::from_millis(100),
            factor: 2.0,
            max: Duration::from_millis(1000),
            jitter: 0.5,
        };
        let ms = Duration::from_millis;
        // (attempt, unit, retry_after, expected)
        let cases = [
            (1, 0.5, None, ms(100)),
            (2, 0.5, None, ms(200)),
            (3, 0.5, None, ms(400)),
            (5, 0.5, None, ms(1000)),
            (50, 0.5, None, ms(1000)),
            (1, 0.0, None, ms(50)),
            (1, 1.0, None, ms(150)),
            (5, 1.0, None, ms(1500)),
            (1, 0.5, Some(ms(3000)), ms(3000)),
            (3, 0.5, Some(ms(10)), ms(400)),
            (0, 0.5, None, ms(100)),
        ];
        for (attempt, unit, ra, want) in cases {
            let got = b.delay(attempt, unit, ra);
            let diff = got.as_secs_f64() - want.as_secs_f64();
            assert!(
                diff.abs() < 1e-6,
                "attempt {attempt} unit {unit}: {got:?} != {want:?}"
            );
        }
    }
}
