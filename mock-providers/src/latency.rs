//! Samples provider latency from a [`Latency`] profile with a seeded generator.

use std::time::Duration;

use rand::Rng;

use crate::config::Latency;

/// z-score of the 99th percentile of the standard normal distribution.
const Z99: f64 = 2.326_347_874;

/// Draws one latency. Log-normal is parameterised by its median and 99th percentile:
/// `mu = ln(p50)`, `sigma = (ln(p99) - ln(p50)) / z99`.
pub fn sample(profile: &Latency, rng: &mut impl Rng) -> Duration {
    match profile {
        Latency::Fixed { value } => value.0,
        Latency::Uniform { min, max } => {
            let (lo, hi) = (
                min.0.as_secs_f64(),
                max.0.as_secs_f64().max(min.0.as_secs_f64()),
            );
            if hi <= lo {
                return min.0;
            }
            Duration::from_secs_f64(rng.gen_range(lo..=hi))
        }
        Latency::Lognormal { p50, p99 } => {
            let m = p50.0.as_secs_f64();
            if m <= 0.0 {
                return Duration::ZERO;
            }
            let p = p99.0.as_secs_f64().max(m);
            let sigma = (p.ln() - m.ln()) / Z99;
            // Box-Muller: one standard normal draw.
            let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
            let u2: f64 = rng.gen();
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            Duration::from_secs_f64((m.ln() + sigma * z).exp().min(3600.0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::HumanDuration;
    use rand::SeedableRng;

    #[test]
    fn lognormal_hits_its_percentiles() {
        let profile = Latency::Lognormal {
            p50: HumanDuration::from_millis(20),
            p99: HumanDuration::from_millis(200),
        };
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut v: Vec<f64> = (0..20_000)
            .map(|_| sample(&profile, &mut rng).as_secs_f64() * 1e3)
            .collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let p50 = v[v.len() / 2];
        let p99 = v[v.len() * 99 / 100];
        assert!((17.0..23.0).contains(&p50), "p50 {p50}");
        assert!((160.0..250.0).contains(&p99), "p99 {p99}");
    }

    #[test]
    fn uniform_stays_in_range() {
        let profile = Latency::Uniform {
            min: HumanDuration::from_millis(5),
            max: HumanDuration::from_millis(10),
        };
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        for _ in 0..1000 {
            let d = sample(&profile, &mut rng).as_millis();
            assert!((5..=10).contains(&d));
        }
    }
}
