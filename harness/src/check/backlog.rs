//! Whether the stack was still working through a queue when a delivery fell due: attempts of
//! work that was due no later than it, arriving with no pause longer than a slack. A delivery
//! due during such a stretch may have been waiting its turn — the queue's business (`no_loss`
//! judges that everything ends), not a lost lease or a late retry.
//!
//! Queue work is, first, every delivery's first attempt (work waiting since its enqueue, so a
//! stack busy with it is provably behind); a checker then adds the retries it has itself found
//! on time or excused, with the moment each fell due, so a backlog of overdue retries drains in
//! due order without a false alarm. A retry that was late and not excused never counts, or a
//! stack that delays every retry would excuse itself with its own late retries.

use super::common::Sends;

/// Attempts that were queue work: (arrival, when it fell due), sorted by arrival.
pub struct Queue(Vec<(u64, u64)>);

impl Queue {
    /// Every delivery's first attempt, due from the start.
    pub fn first_attempts(sends: &Sends) -> Queue {
        let mut v: Vec<(u64, u64)> = sends
            .groups()
            .filter_map(|(_, attempts)| attempts.first().map(|s| (s.received_ns, 0)))
            .collect();
        v.sort_unstable();
        Queue(v)
    }

    /// Adds an attempt arriving at `arrival` that fell due at `due`.
    pub fn add(&mut self, arrival: u64, due: u64) {
        let i = self.0.partition_point(|p| *p <= (arrival, due));
        self.0.insert(i, (arrival, due));
    }

    /// Whether queue work due by `due_by` kept arriving throughout `[from, to]`: one attempt at
    /// most `max_gap` before `from` (the stack was busy when the delivery fell due), then no
    /// stretch longer than `max_gap` without one, up to `to`.
    pub fn cover(&self, from: u64, to: u64, max_gap: u64, due_by: u64) -> bool {
        if to <= from {
            return true;
        }
        // Work that arrived more than `max_gap` before `from` changes nothing below: start after it.
        let start = self
            .0
            .partition_point(|(at, _)| *at < from.saturating_sub(max_gap));
        let arrivals = self.0[start..]
            .iter()
            .filter(|(_, due)| *due <= due_by)
            .map(|(at, _)| *at)
            .take_while(|at| *at < to);
        let mut last = None;
        for at in arrivals {
            if at > from {
                match last {
                    Some(l) if at - l <= max_gap => {}
                    _ => return false,
                }
            }
            if at > from || from - at <= max_gap {
                last = Some(at);
            }
        }
        last.is_some_and(|l| to - l <= max_gap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cover_needs_work_near_the_start_and_no_pause_longer_than_the_gap() {
        let q = Queue(vec![(100, 0), (200, 0), (300, 0), (700, 0)]);
        // (from, to, max gap, covered)
        for (from, to, gap, want) in [
            (100, 400, 100, true),
            (100, 700, 100, false),
            (100, 700, 400, true),
            (250, 800, 400, true),
            (700, 1_200, 400, false),
            (1_000, 1_100, 400, true),
            // Nothing near the start: the stack was not busy when the delivery fell due.
            (1_200, 1_300, 400, false),
            (50, 150, 400, false),
            (500, 400, 1, true),
        ] {
            assert_eq!(
                q.cover(from, to, gap, u64::MAX),
                want,
                "{from}..{to} by {gap}"
            );
        }
    }

    #[test]
    fn only_work_due_no_later_counts() {
        let mut q = Queue(vec![(100, 0)]);
        q.add(500, 450);
        q.add(300, 250);
        assert_eq!(q.0, [(100, 0), (300, 250), (500, 450)]);
        assert!(q.cover(100, 700, 200, 450));
        assert!(
            !q.cover(100, 700, 200, 400),
            "the attempt at 500 was due after"
        );
    }
}
