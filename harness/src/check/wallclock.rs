//! The stack's wall-clock times on the ledger clock.
//!
//! A stack's status API stamps its transitions by the wall clock (PostgreSQL's `now()`); the
//! checkers time everything on the ledger's monotonic clock. Every ledger entry carries both
//! readings, taken together when it was recorded, so the ledger itself is the conversion table:
//! a wall time is placed after the last entry stamped no later, by the wall time between them.
//! That follows the wall clock wherever it went — slewed by NTP (a few milliseconds a second on
//! a guest) or stepped (`crate::jumps`: a paused guest's clock set right on resume) — where one
//! offset taken at the start would misplace every later time by the drift and the jumps.

use super::Entry;
use crate::jumps::ClockJump;

/// Calibration points: (wall milliseconds, ledger nanoseconds), ordered by wall time.
pub struct WallClock {
    points: Vec<(i64, u64)>,
}

impl WallClock {
    /// The ledger's entries that carry a wall time, and the wall clock's reading at each of its
    /// `jumps`; `None` when no entry has a wall time.
    pub fn of(ledger: &[Entry], jumps: &[ClockJump]) -> Option<WallClock> {
        let mut points: Vec<(i64, u64)> = ledger
            .iter()
            .filter_map(|e| Some((e.wall_ms()?, e.mono_ns)))
            .collect();
        // The wall clock's reading at each jump, as the probe saw it: the ledger may have
        // recorded nothing for a while after it.
        points.extend(jumps.iter().map(|j| (j.wall_ms, j.at_ns)));
        points.sort_unstable();
        points.dedup_by_key(|p| p.0);
        (!points.is_empty()).then_some(WallClock { points })
    }

    /// `wall_ms` on the ledger clock: after the last entry stamped at or before it, by the wall
    /// time between them, and never after the next entry (a time inside a forward jump the
    /// clock skipped is placed at the jump). `None` for a time that is no time on the ledger
    /// clock (centuries off: a stack's clock or format gone wrong).
    pub fn ledger_ns(&self, wall_ms: i64) -> Option<u64> {
        let i = self.points.partition_point(|p| p.0 <= wall_ms);
        let (w, m) = self.points[i.saturating_sub(1)];
        let at = m as i128 + (wall_ms as i128 - w as i128) * 1_000_000;
        let at = match self.points.get(i) {
            Some(&(_, next)) if i > 0 => at.min(next as i128),
            _ => at,
        };
        u64::try_from(at.max(0)).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;
    use crate::scenario::Channel::*;
    use mock_providers::ledger::Outcome::*;

    const MS: u64 = 1_000_000;

    /// Entries at 100, 200 and 300 ms on the ledger clock, stamped with wall times `walls`
    /// (ms since the epoch of the testkit's `wall`).
    fn clock(walls: [u64; 3]) -> WallClock {
        let mut w = World::new();
        let a = w.expect("r1", Line);
        for (k, wall) in walls.into_iter().enumerate() {
            w.send(Line, &a, Transient, 0);
            let e = w.entry_mut(k);
            e.mono_ns = 100 * (k as u64 + 1) * MS;
            e.wall = crate::check::testkit::wall(wall);
        }
        WallClock::of(w.entries(), &[]).expect("entries with wall times")
    }

    fn epoch_ms(at: u64) -> i64 {
        chrono::DateTime::parse_from_rfc3339(&crate::check::testkit::wall(at))
            .expect("wall")
            .timestamp_millis()
    }

    #[test]
    fn times_follow_the_clock_through_a_drift_and_a_jump() {
        // In step at 100 ms, 5 ms of drift by 200 ms, then an 8.3 s jump before 300 ms.
        let c = clock([100, 205, 8_605]);
        assert_eq!(c.ledger_ns(epoch_ms(150)), Some(150 * MS));
        // After the drift, placed by the entry at 200 ms, not by the first one's offset.
        assert_eq!(c.ledger_ns(epoch_ms(225)), Some(220 * MS));
        // Inside the skipped span: at the jump, no later than the next entry.
        assert_eq!(c.ledger_ns(epoch_ms(4_000)), Some(300 * MS));
        // After the jump: by the entry after it.
        assert_eq!(c.ledger_ns(epoch_ms(8_655)), Some(350 * MS));
        // Before every entry: by the first one; never before the run.
        assert_eq!(c.ledger_ns(epoch_ms(60)), Some(60 * MS));
        assert_eq!(c.ledger_ns(epoch_ms(0) - 10_000), Some(0));
        // Centuries off: no time.
        assert_eq!(c.ledger_ns(i64::MAX / 2), None);
    }

    #[test]
    fn a_jump_the_ledger_recorded_nothing_after_is_followed_from_its_moment() {
        // Entries at 100 and 200 ms in step; the clock jumps 8 s at 250 ms and the next entry
        // is 300 ms on (wall 8,550).
        let mut w = World::new();
        let a = w.expect("r1", Line);
        for (k, (mono, wall)) in [(100, 100), (200, 200), (550, 8_550)]
            .into_iter()
            .enumerate()
        {
            w.send(Line, &a, Transient, 0);
            let e = w.entry_mut(k);
            e.mono_ns = mono * MS;
            e.wall = crate::check::testkit::wall(wall);
        }
        let jump = ClockJump {
            at_ns: 250 * MS,
            by_ns: 8_000_000_000,
            wall_ms: epoch_ms(8_250),
        };
        let c = WallClock::of(w.entries(), &[jump]).expect("entries");
        // Stamped 20 ms after the jump by the stack's clock: 270 ms, not clamped to 550 ms.
        assert_eq!(c.ledger_ns(epoch_ms(8_270)), Some(270 * MS));
        let without = WallClock::of(w.entries(), &[]).expect("entries");
        assert_eq!(without.ledger_ns(epoch_ms(8_270)), Some(550 * MS));
    }
}
