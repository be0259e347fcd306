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

use crate::jumps::ClockJump;

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
    /// The machine's cores (`crate::others`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// CPU the machine spent on what is not the run (other processes, a hypervisor's steal), in
    /// cores on average over the run (`crate::others`; an upper bound when a stack process left
    /// the harness's process tree or the database is not the run's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub others_cores: Option<f64>,
    /// Every jump of the wall clock against the run's clock (`crate::jumps`), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clock_jumps: Vec<ClockJump>,
}

/// Past this many cores busy with other work the summary line is printed without any stall.
const OTHERS_WORTH_SAYING: f64 = 0.1;

impl StallSummary {
    pub fn of(seen: &Seen, others: Option<crate::others::Others>) -> StallSummary {
        let stalls = &seen.stalls;
        let ms = |s: &Stall| (s.to_ns - s.from_ns) / 1_000_000;
        StallSummary {
            count: stalls.len() as u64,
            total_ms: stalls.iter().map(ms).sum(),
            max_ms: stalls.iter().map(ms).max().unwrap_or(0),
            over_100ms: stalls.iter().filter(|s| ms(s) >= 100).count() as u64,
            cores: others.map(|o| o.cores),
            others_cores: others.map(|o| (o.cores_busy * 100.0).round() / 100.0),
            clock_jumps: seen.jumps.clone(),
        }
    }
}

impl StallSummary {
    /// One line for the terminal and summary.md, when the machine stalled or other work kept
    /// it busy.
    pub fn line(&self) -> Option<String> {
        let stalls = (self.count > 0).then(|| {
            format!(
                "{} stalls of the machine over 20 ms ({} over 100 ms), {} ms in all, longest {} ms: \
                 time allowances grew by them",
                self.count, self.over_100ms, self.total_ms, self.max_ms
            )
        });
        let others = match (self.others_cores, self.cores) {
            (Some(busy), Some(cores)) if busy >= OTHERS_WORTH_SAYING => Some(format!(
                "other work kept {busy:.2} of its {cores} cores busy on average (the run's \
                 timings are the machine's as much as the stack's)"
            )),
            _ => None,
        };
        let said: Vec<String> = [stalls, others, crate::jumps::line(&self.clock_jumps)]
            .into_iter()
            .flatten()
            .collect();
        (!said.is_empty()).then(|| said.join("; "))
    }
}

/// Nanoseconds of `[from_ns, to_ns]` the machine spent stalled.
pub fn stalled_ns(stalls: &[Stall], from_ns: u64, to_ns: u64) -> u64 {
    stalls
        .iter()
        .map(|s| s.to_ns.min(to_ns).saturating_sub(s.from_ns.max(from_ns)))
        .fold(0u64, u64::saturating_add)
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

/// What the probe saw of the machine over the run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Seen {
    pub stalls: Vec<Stall>,
    pub jumps: Vec<ClockJump>,
}

/// The running probe; [`StallProbe::finish`] stops it and returns what it saw.
pub struct StallProbe {
    stop: Arc<AtomicBool>,
    stalls: Arc<Mutex<Vec<Stall>>>,
    /// The wall clock's jumps against the ledger clock (`crate::jumps`), seen on the same ticks.
    jumps: Arc<Mutex<Vec<ClockJump>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The machine's and the run's CPU when the probe started (`crate::others`).
    others: Option<crate::others::Mark>,
}

impl StallProbe {
    /// Starts the probe; `now_ns` reads the ledger clock.
    pub fn start(now_ns: impl Fn() -> u64 + Send + 'static) -> StallProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let stalls = Arc::new(Mutex::new(Vec::new()));
        let jumps = Arc::new(Mutex::new(Vec::new()));
        let (stop2, stalls2, jumps2) = (stop.clone(), stalls.clone(), jumps.clone());
        let thread = std::thread::Builder::new()
            .name("stall-probe".into())
            .spawn(move || {
                let (tick, min) = (TICK.as_nanos() as u64, MIN_STALL.as_nanos() as u64);
                let mut watch = crate::jumps::Watch::default();
                while !stop2.load(Ordering::Relaxed) {
                    if let Some(j) = watch.look(&now_ns) {
                        if let Ok(mut v) = jumps2.lock() {
                            if v.len() < crate::jumps::MAX_JUMPS {
                                v.push(j);
                            }
                        }
                    }
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
            jumps,
            thread,
            others: crate::others::mark(),
        }
    }

    /// The CPU other work took from the machine since the probe started.
    pub fn others(&self) -> Option<crate::others::Others> {
        self.others.as_ref().and_then(crate::others::Mark::since)
    }

    /// The stalls seen so far.
    pub fn snapshot(&self) -> Vec<Stall> {
        self.stalls.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Stops the probe and returns every stall and clock jump it saw.
    pub fn finish(mut self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        Seen {
            stalls: self.snapshot(),
            jumps: self.jumps.lock().map(|v| v.clone()).unwrap_or_default(),
        }
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
        // A summary of nothing is all zeros, and says nothing.
        assert_eq!(
            StallSummary::of(&Seen::default(), None),
            StallSummary::default()
        );
        assert_eq!(StallSummary::default().line(), None);
        let seen = Seen {
            stalls: vec![stall(0, 150), stall(500, 530)],
            jumps: Vec::new(),
        };
        let sum = StallSummary::of(&seen, None);
        assert_eq!(
            (sum.count, sum.total_ms, sum.max_ms, sum.over_100ms),
            (2, 180, 150, 1)
        );
        assert!(probe.others().is_some_and(|o| o.cores >= 1));
        let got = probe.finish();
        assert!(got.stalls.iter().all(|s| s.to_ns > s.from_ns));
    }

    #[test]
    fn other_work_on_the_machine_is_said_past_a_tenth_of_a_core() {
        let busy = |cores_busy| {
            StallSummary::of(
                &Seen::default(),
                Some(crate::others::Others {
                    cores: 2,
                    cores_busy,
                }),
            )
        };
        assert_eq!(busy(0.05).line(), None);
        let line = busy(1.234).line().expect("said");
        assert!(
            line.starts_with("other work kept 1.23 of its 2 cores busy"),
            "{line}"
        );
        assert_eq!(busy(1.234).others_cores, Some(1.23));
        let seen = Seen {
            stalls: vec![stall(0, 150)],
            jumps: vec![ClockJump {
                at_ns: 2_000 * MS,
                by_ns: -300 * MS as i64,
                wall_ms: 0,
            }],
        };
        let both = StallSummary::of(
            &seen,
            busy(0.5).cores.map(|cores| crate::others::Others {
                cores,
                cores_busy: 0.5,
            }),
        );
        let line = both.line().expect("said");
        assert!(
            line.contains("1 stalls")
                && line.contains("; other work kept 0.50")
                && line.contains("; the wall clock jumped 1 time"),
            "{line}"
        );
        assert_eq!(both.clock_jumps, seen.jumps);
    }
}
