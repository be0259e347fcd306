//! The machine's wall clock stepping against the ledger clock: a **clock jump**.
//!
//! The harness times everything on the ledger's monotonic clock; a stack times its leases,
//! backoffs and retries by the wall clock (PostgreSQL's `now()`, a process's `SystemTime`). The
//! two run together on a quiet machine, but not when the wall clock is stepped: an NTP step, or
//! a virtual machine paused (snapshotted, migrated) whose monotonic clock did not count the
//! pause while its wall clock was set right on resume. A guest here jumped 8.3 s forward in the
//! middle of a run: to the stack 8.3 s passed in an instant, every lease it had granted lapsed
//! at once, and every retry it had scheduled fell due — while on the ledger clock the retries
//! came "too soon" and the rescued rows were "resent after an accept".
//!
//! [`Watch`] (the stall probe's thread, `crate::stalls`) reads both clocks every tick and
//! records each step of [`MIN_JUMP`] or more. Rules read the steps through these helpers:
//! - a **forward** jump is time the stack's clock counted and the ledger's did not: a gap the
//!   stack had to wait is credited with the jumps inside it ([`forward_ns`]), and leases the
//!   stack timed may have lapsed at the jump ([`forward_within`]: a rescue that follows is the
//!   machine's doing, as a kill's is chaos's);
//! - a **backward** jump is time the stack waited that its clock did not count: to the time
//!   allowances it is a stall of the machine ([`as_stalls`]).
//!
//! Only the machine is measured: a stack that reads a clock wrongly gets no credit.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::stalls::Stall;

/// A step of the wall clock against the ledger clock smaller than this is not recorded (an NTP
/// slew moves it microseconds per tick).
pub const MIN_JUMP_NS: i64 = 50_000_000;

/// Two wall-clock reads around a ledger-clock read further apart than this are discarded: the
/// thread was descheduled between them, and the offset read would be off by as much.
const READ_WINDOW_NS: i64 = 1_000_000;

/// One step of the wall clock: at `at_ns` on the ledger clock, the wall clock moved `by_ns`
/// more than the ledger clock did (negative: it went back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClockJump {
    pub at_ns: u64,
    pub by_ns: i64,
}

impl ClockJump {
    pub fn forward(&self) -> bool {
        self.by_ns > 0
    }
}

/// Follows the wall clock's offset from the ledger clock, one look per tick.
#[derive(Debug, Default)]
pub struct Watch {
    offset_ns: Option<i128>,
}

impl Watch {
    /// Reads both clocks; a step of the offset since the last good read is a jump.
    pub fn look(&mut self, now_ns: &impl Fn() -> u64) -> Option<ClockJump> {
        let before = wall_ns()?;
        let at_ns = now_ns();
        let after = wall_ns()?;
        if after - before > READ_WINDOW_NS as i128 || after < before {
            return None;
        }
        self.step(at_ns, before - at_ns as i128)
    }

    /// Takes one offset read at `at_ns`; returns the jump it shows.
    pub fn step(&mut self, at_ns: u64, offset_ns: i128) -> Option<ClockJump> {
        let last = self.offset_ns.replace(offset_ns)?;
        let by = offset_ns - last;
        (by.abs() >= MIN_JUMP_NS as i128).then(|| ClockJump {
            at_ns,
            by_ns: by.clamp(i64::MIN as i128, i64::MAX as i128) as i64,
        })
    }
}

fn wall_ns() -> Option<i128> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_nanos() as i128)
}

/// Nanoseconds the wall clock jumped forward within `[from_ns, to_ns]`.
pub fn forward_ns(jumps: &[ClockJump], from_ns: u64, to_ns: u64) -> u64 {
    jumps
        .iter()
        .filter(|j| j.forward() && (from_ns..=to_ns).contains(&j.at_ns))
        .map(|j| j.by_ns.unsigned_abs())
        .sum()
}

/// The largest forward jump within `[from_ns, to_ns]`.
pub fn forward_within(jumps: &[ClockJump], from_ns: u64, to_ns: u64) -> Option<&ClockJump> {
    jumps
        .iter()
        .filter(|j| j.forward() && (from_ns..=to_ns).contains(&j.at_ns))
        .max_by_key(|j| j.by_ns)
}

/// The backward jumps as stalls: from the jump, as long as the clock went back.
pub fn as_stalls(jumps: &[ClockJump]) -> impl Iterator<Item = Stall> + '_ {
    jumps.iter().filter(|j| !j.forward()).map(|j| Stall {
        from_ns: j.at_ns,
        to_ns: j.at_ns.saturating_add(j.by_ns.unsigned_abs()),
    })
}

/// One line for the summary: how often, how far and where the wall clock jumped.
pub fn line(jumps: &[ClockJump]) -> Option<String> {
    let largest = jumps.iter().max_by_key(|j| j.by_ns.unsigned_abs())?;
    Some(format!(
        "the wall clock jumped {} time{} against the run's clock (largest {:+.0} ms at {:.1} s): \
         the stack's timers moved with it, and rules timed by them credit the jumps",
        jumps.len(),
        if jumps.len() == 1 { "" } else { "s" },
        largest.by_ns as f64 / 1e6,
        largest.at_ns as f64 / 1e9,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i128 = 1_000_000;

    fn jump(at_ms: u64, by_ms: i64) -> ClockJump {
        ClockJump {
            at_ns: at_ms * 1_000_000,
            by_ns: by_ms * 1_000_000,
        }
    }

    #[test]
    fn a_step_of_the_offset_is_a_jump_and_a_slew_is_not() {
        let mut w = Watch::default();
        assert_eq!(
            w.step(0, 1_000 * MS),
            None,
            "the first read sets the offset"
        );
        // A slew: microseconds a tick, however many ticks.
        for k in 1..1_000u64 {
            assert_eq!(
                w.step(k * 10_000_000, 1_000 * MS + k as i128 * 20_000),
                None
            );
        }
        let base = 1_000 * MS + 999 * 20_000;
        assert_eq!(
            w.step(10_000_000_000, base + 8_300 * MS),
            Some(ClockJump {
                at_ns: 10_000_000_000,
                by_ns: 8_300_000_000
            })
        );
        assert_eq!(
            w.step(10_010_000_000, base + 8_300 * MS - 60 * MS),
            Some(jump(10_010, -60))
        );
        assert_eq!(
            w.step(10_020_000_000, base + 8_300 * MS - 60 * MS - 49 * MS),
            None
        );
    }

    #[test]
    fn a_real_watch_sees_no_jump_on_a_quiet_clock() {
        let start = std::time::Instant::now();
        let now = move || start.elapsed().as_nanos() as u64;
        let mut w = Watch::default();
        for _ in 0..20 {
            assert_eq!(w.look(&now), None);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    #[test]
    fn forward_jumps_credit_a_window_and_backward_ones_are_stalls() {
        let js = [jump(1_000, 400), jump(5_000, -300), jump(9_000, 8_000)];
        assert_eq!(forward_ns(&js, 0, 10_000_000_000), 8_400_000_000);
        assert_eq!(forward_ns(&js, 1_500_000_000, 8_000_000_000), 0);
        assert_eq!(
            forward_within(&js, 0, 10_000_000_000).map(|j| j.by_ns),
            Some(8_000_000_000)
        );
        assert_eq!(forward_within(&js, 2_000_000_000, 8_000_000_000), None);
        let stalls: Vec<Stall> = as_stalls(&js).collect();
        assert_eq!(
            stalls,
            [Stall {
                from_ns: 5_000_000_000,
                to_ns: 5_300_000_000
            }]
        );
        let line = line(&js).expect("said");
        assert!(
            line.starts_with("the wall clock jumped 3 times") && line.contains("+8000 ms at 9.0 s"),
            "{line}"
        );
        assert_eq!(super::line(&[]), None);
    }
}
