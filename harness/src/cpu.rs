//! The harness's own CPU share of a run: its process's CPU seconds (user + system, from
//! `/proc/self/stat`) over the run's wall time, in cores. The harness must never be the
//! bottleneck it measures: past [`WARN_SHARE`] of one core the summary says so, because the fakes
//! and the ledger hooks may then have held the stack back. Measures only; judges nothing.

use std::time::Instant;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Share of one core past which the summary warns.
pub const WARN_SHARE: f64 = 0.5;

/// Clock ticks per second of `/proc/<pid>/stat`'s times: Linux's USER_HZ, 100 on every
/// architecture it ships for (as `stack/src/bench/usage.rs` assumes too).
pub(crate) const USER_HZ: f64 = 100.0;

/// A reading at the start of the run.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    cpu_s: f64,
    at: Instant,
}

/// What `report.json` `harness` says of the harness process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HarnessUsage {
    /// CPU seconds (user + system) the harness process used during the run, every thread.
    pub cpu_s: f64,
    /// Wall seconds between the two readings.
    pub wall_s: f64,
    /// `cpu_s / wall_s`: cores the harness kept busy on average (1.0 = one whole core).
    pub cpu_share: f64,
    /// The harness process's peak resident memory so far (`VmHWM`), in KiB.
    #[serde(default)]
    pub peak_rss_kib: Option<u64>,
    /// The most memory the harness's allocator had handed out at any of its samples (every 5 s
    /// and at the run's phase boundaries; jemalloc's `stats.allocated`, big blocks counted
    /// whole, also room never written), in KiB: beside `peak_rss_kib`, how much of the peak was
    /// the harness's data and how much was room the allocator kept resident. None when the
    /// allocator's statistics cannot be read.
    #[serde(default)]
    pub peak_heap_kib: Option<u64>,
}

/// What the harness reads of one process's `/proc/<pid>/stat` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    pub ppid: u32,
    /// utime + stime, in clock ticks.
    pub ticks: u64,
    /// cutime + cstime: the children it has reaped, in clock ticks.
    pub children_ticks: u64,
}

/// Parses a `/proc/<pid>/stat` line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted after its last `)`.
pub(crate) fn parse_stat(stat: &str) -> Option<ProcStat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state (3), ppid (4) … utime (14), stime (15), cutime (16), cstime (17);
    // the children's times are signed in the kernel's format.
    let field = |i: usize| -> Option<u64> { Some(f.get(i)?.parse::<i64>().ok()?.max(0) as u64) };
    Some(ProcStat {
        ppid: f.get(1)?.parse().ok()?,
        ticks: field(11)? + field(12)?,
        children_ticks: field(13)? + field(14)?,
    })
}

/// utime + stime of a `/proc/<pid>/stat` line, in clock ticks.
fn ticks(stat: &str) -> Option<u64> {
    parse_stat(stat).map(|s| s.ticks)
}

/// `VmHWM` of `/proc/<pid>/status` (this process's when `None`), in KiB: the peak resident
/// memory of the process so far. `None` when the process is gone or `/proc` is unavailable.
pub fn peak_rss_kib(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn cpu_now() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    Some(ticks(&stat)? as f64 / USER_HZ)
}

/// Reads the harness's CPU time now and starts its peak resident memory afresh (writing `5` to
/// `/proc/self/clear_refs` resets `VmHWM`), so that a run's peak is its own even when one process
/// runs several (`bench e2e`); `None` where `/proc` is unavailable.
pub fn mark() -> Option<Mark> {
    // Best effort: without it the peak is the process's since it started, never less.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    crate::malloc::reset_peak();
    Some(Mark {
        cpu_s: cpu_now()?,
        at: Instant::now(),
    })
}

impl HarnessUsage {
    /// From `start` to now.
    pub fn since(start: Option<Mark>) -> Option<HarnessUsage> {
        let start = start?;
        let wall_s = start.at.elapsed().as_secs_f64();
        let cpu_s = (cpu_now()? - start.cpu_s).max(0.0);
        Some(HarnessUsage {
            peak_rss_kib: peak_rss_kib(None),
            peak_heap_kib: crate::malloc::peak_in_use_kib(),
            ..HarnessUsage::of(cpu_s, wall_s)
        })
    }

    /// Raises the peak to the process's peak now: for work done after [`HarnessUsage::since`]
    /// read it (rendering the report's files).
    pub fn refresh_peak(&mut self) {
        self.peak_rss_kib = self.peak_rss_kib.max(peak_rss_kib(None));
        self.peak_heap_kib = self.peak_heap_kib.max(crate::malloc::peak_in_use_kib());
    }

    fn of(cpu_s: f64, wall_s: f64) -> HarnessUsage {
        let round = |v: f64| (v * 1000.0).round() / 1000.0;
        HarnessUsage {
            cpu_s: round(cpu_s),
            wall_s: round(wall_s),
            cpu_share: if wall_s > 0.0 {
                round(cpu_s / wall_s)
            } else {
                0.0
            },
            peak_rss_kib: None,
            peak_heap_kib: None,
        }
    }

    /// One line for the terminal summary.
    pub fn line(&self) -> String {
        let heap = self
            .peak_heap_kib
            .map(|k| format!(" (allocated at most {} MB)", k / 1024))
            .unwrap_or_default();
        let rss = self
            .peak_rss_kib
            .map(|k| format!(", peak RSS {} MB{heap}", k / 1024))
            .unwrap_or_default();
        format!(
            "{:.0}% of one core ({:.1} CPU s in {:.1} s){rss}",
            self.cpu_share * 100.0,
            self.cpu_s,
            self.wall_s
        )
    }

    /// The summary's warning, when the harness used more than [`WARN_SHARE`] of one core.
    pub fn warning(&self) -> Option<String> {
        (self.cpu_share > WARN_SHARE).then(|| {
            format!(
                "the harness itself used {:.0}% of one core ({:.1} CPU s in {:.1} s): above {:.0}%, \
                 it may have held the stack back",
                self.cpu_share * 100.0,
                self.cpu_s,
                self.wall_s,
                WARN_SHARE * 100.0
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_read_after_the_command_name_whatever_it_holds() {
        let stat = "4242 (ting (chaos) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 9 0";
        assert_eq!(ticks(stat), Some(325));
        assert_eq!(ticks("garbage"), None);
        assert_eq!(ticks("1 (x) S 1 2"), None);
        let line = "42 (a ) b (c) S 7 42 42 0 -1 4194560 1 0 0 0 11 22 33 44 20 0 1 0 5 6 7";
        let want = ProcStat {
            ppid: 7,
            ticks: 33,
            children_ticks: 77,
        };
        assert_eq!(parse_stat(line), Some(want));
    }

    #[test]
    fn warns_only_past_half_a_core() {
        assert_eq!(HarnessUsage::of(5.0, 10.0).warning(), None);
        let busy = HarnessUsage::of(12.0, 10.0);
        assert_eq!(busy.cpu_share, 1.2);
        assert!(busy.warning().unwrap().contains("120% of one core"));
        assert_eq!(HarnessUsage::of(1.0, 0.0).cpu_share, 0.0);
    }

    #[test]
    fn this_process_can_be_measured() {
        let start = mark().expect("/proc/self/stat");
        // Busy for 20 ms of wall time whatever the build's speed (a release build ran a fixed
        // loop in under the figures' resolution).
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < std::time::Duration::from_millis(20) {
            for i in 0..10_000u64 {
                x = x.wrapping_add(i * i);
            }
            x = std::hint::black_box(x);
        }
        let used = HarnessUsage::since(Some(start)).unwrap();
        assert!(used.cpu_s >= 0.0 && used.wall_s > 0.0, "{used:?}");
        assert!(used.peak_rss_kib.is_some_and(|k| k > 0), "{used:?}");
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        assert!(used.peak_heap_kib.is_some_and(|k| k > 0), "{used:?}");
    }
}
