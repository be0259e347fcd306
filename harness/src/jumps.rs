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
//!   stack had to wait is credited with the jumps inside it ([`forward_ns`]), and a jump of at
//!   least `lease − heartbeat` may have lapsed the leases the stack timed ([`lapsing`]: a rescue
//!   that follows is the machine's doing, as a kill's is chaos's);
//! - a **backward** jump is time the stack waited that its clock did not count: the allowances
//!   the stack times by that clock (the retry cap, `recovery`'s lease) grow by it ([`back_ns`]).
//!
//! Only the machine is measured: a stack that reads a clock wrongly gets no credit. The credits
//! assume the stack's clock is this machine's; a `DATABASE_URL` server elsewhere keeps a clock of
//! its own, and a jump seen here may not have moved it. A jump is noticed at most a tick (10 ms)
//! after it happened (`at_ns`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A step of the wall clock against the ledger clock smaller than this is not recorded (an NTP
/// slew moves it microseconds per tick).
pub const MIN_JUMP_NS: i64 = 50_000_000;

/// Two wall-clock reads around a ledger-clock read further apart than this are discarded: the
/// thread was descheduled between them, and the offset read would be off by as much.
const READ_WINDOW_NS: i64 = 1_000_000;

/// One step of the wall clock: at `at_ns` on the ledger clock (when the probe saw it, at most a
/// tick after it happened), the wall clock moved `by_ns` more than the ledger clock did
/// (negative: it went back), and read `wall_ms` (milliseconds since the Unix epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClockJump {
    pub at_ns: u64,
    pub by_ns: i64,
    #[serde(default)]
    pub wall_ms: i64,
}

/// Jumps kept at most: a clock that flaps for ever must not fill the report.
pub const MAX_JUMPS: usize = 1_000;

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
        let clamp = |v: i128| v.clamp(i64::MIN as i128, i64::MAX as i128) as i64;
        (by.abs() >= MIN_JUMP_NS as i128).then(|| ClockJump {
            at_ns,
            by_ns: clamp(by),
            wall_ms: clamp((at_ns as i128 + offset_ns) / 1_000_000),
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
    sum(jumps, from_ns, to_ns, ClockJump::forward)
}

/// Nanoseconds the wall clock went back within `[from_ns, to_ns]`: time the stack waited that its
/// clock did not count, which widens an allowance the stack times by it (the retry cap,
/// `recovery`'s lease) like a stall.
pub fn back_ns(jumps: &[ClockJump], from_ns: u64, to_ns: u64) -> u64 {
    sum(jumps, from_ns, to_ns, |j| !j.forward())
}

fn sum(jumps: &[ClockJump], from_ns: u64, to_ns: u64, which: impl Fn(&ClockJump) -> bool) -> u64 {
    jumps
        .iter()
        .filter(|j| which(j) && (from_ns..=to_ns).contains(&j.at_ns))
        .fold(0u64, |n, j| n.saturating_add(j.by_ns.unsigned_abs()))
}

/// The largest forward jump within `[from_ns, to_ns]` of at least `at_least_ns`: one that can
/// have lapsed a lease the stack renews every heartbeat takes `lease − heartbeat`.
pub fn lapsing(
    jumps: &[ClockJump],
    from_ns: u64,
    to_ns: u64,
    at_least_ns: u64,
) -> Option<&ClockJump> {
    jumps
        .iter()
        .filter(|j| j.forward() && j.by_ns.unsigned_abs() >= at_least_ns)
        .filter(|j| (from_ns..=to_ns).contains(&j.at_ns))
        .max_by_key(|j| j.by_ns)
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
            wall_ms: 0,
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
        let got = w.step(10_000_000_000, base + 8_300 * MS).expect("a jump");
        assert_eq!((got.at_ns, got.by_ns), (10_000_000_000, 8_300_000_000));
        // The wall clock's reading after it: the ledger time plus the new offset.
        assert_eq!(got.wall_ms, ((10_000 * MS + base + 8_300 * MS) / MS) as i64);
        let back = w
            .step(10_010_000_000, base + 8_300 * MS - 60 * MS)
            .expect("a jump");
        assert_eq!((back.at_ns, back.by_ns), (10_010_000_000, -60_000_000));
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
    fn forward_jumps_credit_a_window_and_backward_ones_widen_allowances() {
        let js = [jump(1_000, 400), jump(5_000, -300), jump(9_000, 8_000)];
        assert_eq!(forward_ns(&js, 0, 10_000_000_000), 8_400_000_000);
        assert_eq!(forward_ns(&js, 1_500_000_000, 8_000_000_000), 0);
        assert_eq!(back_ns(&js, 0, 10_000_000_000), 300_000_000);
        assert_eq!(back_ns(&js, 5_100_000_000, 10_000_000_000), 0);
        // Only a jump big enough to lapse a lease renewed every heartbeat.
        let at_least = |ms: u64| lapsing(&js, 0, 10_000_000_000, ms * 1_000_000).map(|j| j.by_ns);
        assert_eq!(at_least(1_500), Some(8_000_000_000));
        assert_eq!(at_least(300), Some(8_000_000_000));
        assert_eq!(lapsing(&js, 0, 2_000_000_000, 1_500_000_000), None);
        assert_eq!(
            lapsing(&js, 0, 2_000_000_000, 300_000_000).map(|j| j.by_ns),
            Some(400_000_000)
        );
        // Absurd jumps saturate, never overflow.
        let huge = [jump(1, i64::MAX / 1_000_000); 3];
        assert_eq!(forward_ns(&huge, 0, u64::MAX), u64::MAX);
        let line = line(&js).expect("said");
        assert!(
            line.starts_with("the wall clock jumped 3 times") && line.contains("+8000 ms at 9.0 s"),
            "{line}"
        );
        assert_eq!(super::line(&[]), None);
    }
}
