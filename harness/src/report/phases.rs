//! How long each phase of a run took (`report.json` `phases`, the summary's `phases:` line): where
//! a run's wall time goes — the stack's work (enqueue, send and settle) or the harness's own
//! (provisioning, stopping the stack, judging, writing the files).

use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Wall seconds of each phase, in the order they run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Phases {
    /// The database and the fake providers up.
    pub provision_s: f64,
    /// The stack migrated, its API healthy and its workers started.
    pub start_s: f64,
    /// The load's batches enqueued (the chaos schedule runs beside the load and after it).
    pub enqueue_s: f64,
    /// From the load's end to quiescence (or the deadline): the stack's sending, the chaos, the
    /// delivery reports, the trickle's orders.
    pub settle_s: f64,
    /// Every stack process stopped.
    pub stop_s: f64,
    /// Every checker run over the frozen record.
    pub judge_s: f64,
    /// `ledger.jsonl` and `status.json` written and the report assembled (renderings excluded).
    pub write_s: f64,
}

/// Marks phase boundaries as the run passes them.
pub struct PhaseClock {
    last: Instant,
    pub phases: Phases,
}

impl PhaseClock {
    pub fn start() -> PhaseClock {
        PhaseClock {
            last: Instant::now(),
            phases: Phases::default(),
        }
    }

    /// Ends the current phase: `field` gets its wall seconds, and the next phase starts now.
    pub fn lap(&mut self, field: fn(&mut Phases) -> &mut f64) {
        let now = Instant::now();
        *field(&mut self.phases) = round_ms(now - self.last);
        self.last = now;
    }
}

fn round_ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e3).round() / 1e3
}

impl Phases {
    /// "provision 1.6 s · start 0.3 s · enqueue 0.4 s · send and settle 8.0 s · stop 1.2 s ·
    /// judge 1.1 s · write 0.9 s".
    pub fn line(&self) -> String {
        [
            ("provision", self.provision_s),
            ("start", self.start_s),
            ("enqueue", self.enqueue_s),
            ("send and settle", self.settle_s),
            ("stop", self.stop_s),
            ("judge", self.judge_s),
            ("write", self.write_s),
        ]
        .iter()
        .map(|(name, s)| format!("{name} {s:.1} s"))
        .collect::<Vec<_>>()
        .join(" · ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_lap_times_its_own_phase_and_the_line_names_them_in_order() {
        let mut clock = PhaseClock::start();
        let begun = Instant::now();
        clock.lap(|p| &mut p.provision_s);
        clock.lap(|p| &mut p.start_s);
        let (p, total) = (&clock.phases, begun.elapsed().as_secs_f64() + 0.001);
        assert!(p.provision_s + p.start_s <= total, "{p:?}");
        assert_eq!(p.enqueue_s, 0.0, "a phase not lapped stays zero");
        let p = Phases {
            enqueue_s: 13.14,
            judge_s: 1.06,
            ..Phases::default()
        };
        let line = p.line();
        assert!(line.starts_with("provision 0.0 s · start 0.0 s · enqueue 13.1 s"));
        assert!(line.ends_with("judge 1.1 s · write 0.0 s"), "{line}");
    }
}
