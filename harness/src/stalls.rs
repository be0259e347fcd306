//! The machine's stalls: when the machine under test stopped running processes on time.
//!
//! A thread of its own sleeps [`TICK`] at a time and records, on the ledger clock, every wake-up
//! that came more than [`MIN_STALL`] late. A starved machine (a CI runner shared with a compile,
//! a noisy neighbour) delays every process on it alike: the stack's sends and answers, and the
//! harness's own clocks. Rules that hold the stack to a time allowance widen it by the stall
//! time inside the window they judge ([`stalled_ns`]), so a correct stack is never failed
//! because the machine stopped it; the report shows the stalls (`report.json` `machine`).
//!
//! Only the machine is measured here, never the stack: a stack that is slow on a quiet machine
//! gets no extra time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How long the probe sleeps between looks.
pub const TICK: Duration = Duration::from_millis(10);
/// A wake-up later than this is a stall (below it is ordinary timer and scheduler jitter).
pub const MIN_STALL: Duration = Duration::from_millis(20);

/// One stall, on the ledger clock: the probe was due to wake at `from_ns` and woke at `to_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Stall {
    pub from_ns: u64,
    pub to_ns: u64,
}

/// What `report.json` says of the machine's stalls during the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StallSummary {
    /// Stalls longer than `MIN_STALL` (20 ms).
    pub count: u64,
    pub total_ms: u64,
    pub max_ms: u64,
    /// Stalls of 100 ms or more.
    pub over_100ms: u64,
}

impl StallSummary {
    pub fn of(stalls: &[Stall]) -> StallSummary {
        let ms = |s: &Stall| (s.to_ns - s.from_ns) / 1_000_000;
        StallSummary {
            count: stalls.len() as u64,
            total_ms: stalls.iter().map(ms).sum(),
            max_ms: stalls.iter().map(ms).max().unwrap_or(0),
            over_100ms: stalls.iter().filter(|s| ms(s) >= 100).count() as u64,
        }
    }
}

impl StallSummary {
    /// One line for the terminal and summary.md, when the machine stalled at all.
    pub fn line(&self) -> Option<String> {
        (self.count > 0).then(|| {
            format!(
                "{} stalls of the machine over 20 ms ({} over 100 ms), {} ms in all, longest {} ms: \
                 time allowances grew by them",
                self.count, self.over_100ms, self.total_ms, self.max_ms
            )
        })
    }
}

/// Nanoseconds of `[from_ns, to_ns]` the machine spent stalled.
pub fn stalled_ns(stalls: &[Stall], from_ns: u64, to_ns: u64) -> u64 {
    stalls
        .iter()
        .map(|s| s.to_ns.min(to_ns).saturating_sub(s.from_ns.max(from_ns)))
        .sum()
}

/// `end_ns` pushed later by the stalls between `start_ns` and it, and by the stalls inside each
/// extension in turn: the time a process needed `end_ns - start_ns` of running for, on this
/// machine.
pub fn extended(stalls: &[Stall], start_ns: u64, end_ns: u64) -> u64 {
    let mut end = end_ns;
    // Each round adds the stalls inside the previous extension; it converges fast (stalls are
    // sparse), and the bound only guards against a pathological list.
    for _ in 0..64 {
        let more = start_ns.saturating_add(
            end_ns
                .saturating_sub(start_ns)
                .saturating_add(stalled_ns(stalls, start_ns, end)),
        );
        if more == end {
            break;
        }
        end = more;
    }
    end
}

/// The running probe; [`StallProbe::finish`] stops it and returns what it saw.
pub struct StallProbe {
    stop: Arc<AtomicBool>,
    stalls: Arc<Mutex<Vec<Stall>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StallProbe {
    /// Starts the probe; `now_ns` reads the ledger clock.
    pub fn start(now_ns: impl Fn() -> u64 + Send + 'static) -> StallProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let stalls = Arc::new(Mutex::new(Vec::new()));
        let (stop2, stalls2) = (stop.clone(), stalls.clone());
        let thread = std::thread::Builder::new()
            .name("stall-probe".into())
            .spawn(move || {
                let (tick, min) = (TICK.as_nanos() as u64, MIN_STALL.as_nanos() as u64);
                while !stop2.load(Ordering::Relaxed) {
                    let due = now_ns() + tick;
                    std::thread::sleep(TICK);
                    let woke = now_ns();
                    if woke > due + min {
                        if let Ok(mut v) = stalls2.lock() {
                            v.push(Stall {
                                from_ns: due,
                                to_ns: woke,
                            });
                        }
                    }
                }
            })
            .ok();
        StallProbe {
            stop,
            stalls,
            thread,
        }
    }

    /// The stalls seen so far.
    pub fn snapshot(&self) -> Vec<Stall> {
        self.stalls.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Stops the probe and returns every stall it saw.
    pub fn finish(mut self) -> Vec<Stall> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.snapshot()
    }
}

impl Drop for StallProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn stall(from_ms: u64, to_ms: u64) -> Stall {
        Stall {
            from_ns: from_ms * MS,
            to_ns: to_ms * MS,
        }
    }

    #[test]
    fn stalled_time_is_the_overlap_with_the_window() {
        let s = [stall(100, 300), stall(1_000, 1_050)];
        assert_eq!(stalled_ns(&s, 0, 2_000 * MS), 250 * MS);
        assert_eq!(stalled_ns(&s, 200 * MS, 1_020 * MS), 120 * MS);
        assert_eq!(stalled_ns(&s, 400 * MS, 900 * MS), 0);
        assert_eq!(stalled_ns(&[], 0, u64::MAX), 0);
    }

    #[test]
    fn an_allowance_grows_by_the_stalls_inside_it_and_its_extensions() {
        // 1 s from 0: a 300 ms stall inside it, then a 500 ms stall inside the extension.
        let s = [stall(200, 500), stall(1_100, 1_600)];
        assert_eq!(extended(&s, 0, 1_000 * MS), 1_800 * MS);
        // No stall: unchanged.
        assert_eq!(extended(&[], 0, 1_000 * MS), 1_000 * MS);
        // A stall after the window does not count.
        assert_eq!(extended(&[stall(2_000, 3_000)], 0, 1_000 * MS), 1_000 * MS);
    }

    #[test]
    fn summaries_and_a_probe_that_starts_and_stops() {
        let start = std::time::Instant::now();
        let probe = StallProbe::start(move || start.elapsed().as_nanos() as u64);
        // A summary of nothing is all zeros.
        assert_eq!(StallSummary::of(&[]), StallSummary::default());
        let s = [stall(0, 150), stall(500, 530)];
        let sum = StallSummary::of(&s);
        assert_eq!(
            (sum.count, sum.total_ms, sum.max_ms, sum.over_100ms),
            (2, 180, 150, 1)
        );
        let got = probe.finish();
        assert!(got.iter().all(|s| s.to_ns > s.from_ns));
    }
}
