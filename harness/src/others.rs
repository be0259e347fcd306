//! The machine's other work: CPU time the machine spent on what is not the run — other tenants'
//! processes, a build beside it, a hypervisor's steal — in cores on average over the run.
//!
//! The run is this process and every process descended from it: the stack it started (its API
//! and workers, an external stack's processes and their children), the throwaway PostgreSQL and
//! its backends. Each one's CPU is read from `/proc/<pid>/stat` (user + system, and that of its
//! children it already reaped, so a worker killed and reaped still counts); the machine's from
//! `/proc/stat` (every busy state, steal included). The difference is the others' share. A
//! stack process that left the harness's tree (daemonised, or a database the run did not start,
//! `DATABASE_URL`) counts as the machine's other work: the figure is then an upper bound.
//!
//! Measures only; judges nothing. A timed verdict on a machine the others kept busy is the
//! machine's as much as the stack's: the summary says how busy, beside the stalls.

use std::collections::HashMap;
use std::time::Instant;

use crate::cpu::{parse_stat, USER_HZ};

/// A reading at the start of the run.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    machine_ticks: u64,
    run_ticks: u64,
    at: Instant,
}

/// What the others used between a [`Mark`] and now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Others {
    /// The machine's cores (the `cpuN` lines of `/proc/stat`).
    pub cores: u32,
    /// CPU the machine spent outside the run, in cores on average (0.5: half a core all along).
    pub cores_busy: f64,
}

/// Reads the machine's and the run's CPU now; `None` where `/proc` is unavailable.
pub fn mark() -> Option<Mark> {
    let (machine_ticks, _) = machine(&std::fs::read_to_string("/proc/stat").ok()?)?;
    Some(Mark {
        machine_ticks,
        run_ticks: run_ticks(std::process::id())?,
        at: Instant::now(),
    })
}

impl Mark {
    /// The others' CPU from this mark to now.
    pub fn since(&self) -> Option<Others> {
        let (machine_ticks, cores) = machine(&std::fs::read_to_string("/proc/stat").ok()?)?;
        let run_ticks = run_ticks(std::process::id())?;
        let wall_s = self.at.elapsed().as_secs_f64();
        Some(others(
            (self.machine_ticks, machine_ticks),
            (self.run_ticks, run_ticks),
            cores,
            wall_s,
        ))
    }
}

/// The others' cores from the machine's and the run's tick counts at both ends of `wall_s`.
fn others(machine: (u64, u64), run: (u64, u64), cores: u32, wall_s: f64) -> Others {
    let machine = machine.1.saturating_sub(machine.0);
    let run = run.1.saturating_sub(run.0);
    let busy_s = machine.saturating_sub(run) as f64 / USER_HZ;
    let cores_busy = if wall_s > 0.0 {
        (busy_s / wall_s).min(f64::from(cores))
    } else {
        0.0
    };
    Others { cores, cores_busy }
}

/// The machine's busy ticks (every state but idle and iowait; `guest` is inside `user` already)
/// and its cores, from `/proc/stat`'s text.
fn machine(stat: &str) -> Option<(u64, u32)> {
    let mut lines = stat.lines();
    let total = lines.next()?.strip_prefix("cpu ")?;
    let f: Vec<u64> = total
        .split_whitespace()
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    let busy = [0, 1, 2, 5, 6, 7]
        .iter()
        .map(|&i| f.get(i).copied().unwrap_or(0))
        .sum();
    let cores = lines
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    Some((busy, u32::try_from(cores).ok()?.max(1)))
}

/// The CPU ticks of `root` and every process descended from it now.
fn run_ticks(root: u32) -> Option<u64> {
    let mut parent_of: HashMap<u32, u32> = HashMap::new();
    let mut ticks_of: HashMap<u32, u64> = HashMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may be gone between the listing and the read: it is simply not counted.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Its own CPU and that of the children it reaped (a killed worker, a backend).
        if let Some(s) = parse_stat(&stat) {
            parent_of.insert(pid, s.ppid);
            ticks_of.insert(pid, s.ticks + s.children_ticks);
        }
    }
    Some(descendants_ticks(root, &parent_of, &ticks_of))
}

/// The ticks of `root` and of every process whose chain of parents reaches it.
fn descendants_ticks(
    root: u32,
    parent_of: &HashMap<u32, u32>,
    ticks_of: &HashMap<u32, u64>,
) -> u64 {
    let in_run = |mut pid: u32| {
        // A chain of parents is at most as long as the table (no cycles in /proc, but a table
        // read while processes come and go is not trusted to be a tree).
        for _ in 0..=parent_of.len() {
            if pid == root {
                return true;
            }
            match parent_of.get(&pid) {
                Some(&p) if p != 0 && p != pid => pid = p,
                _ => return false,
            }
        }
        false
    };
    ticks_of
        .iter()
        .filter(|(pid, _)| in_run(**pid))
        .map(|(_, t)| *t)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_busy_ticks_and_cores_from_proc_stat() {
        let stat = "cpu  100 5 50 1000 20 3 2 7 40 0\ncpu0 50 2 25 500 10 1 1 3 20 0\n\
                    cpu1 50 3 25 500 10 2 1 4 20 0\nintr 1 2 3\nctxt 9\n";
        // user + nice + system + irq + softirq + steal; idle, iowait and guest (inside user) not.
        assert_eq!(machine(stat), Some((100 + 5 + 50 + 3 + 2 + 7, 2)));
        assert_eq!(machine("intr 1\n"), None);
        assert_eq!(machine("cpu  x y\n"), None);
    }

    #[test]
    fn the_run_is_the_root_and_its_descendants_only() {
        // 1 → 10 (the harness) → 11 (a worker), 12 (postgres) → 13 (a backend); 20 elsewhere;
        // 30 claims a parent that is not in the table.
        let parent_of: HashMap<u32, u32> = [
            (1, 0),
            (10, 1),
            (11, 10),
            (12, 10),
            (13, 12),
            (20, 1),
            (30, 99),
        ]
        .into();
        let ticks_of: HashMap<u32, u64> = [
            (1, 1_000),
            (10, 5),
            (11, 7),
            (12, 11),
            (13, 13),
            (20, 500),
            (30, 900),
        ]
        .into();
        assert_eq!(
            descendants_ticks(10, &parent_of, &ticks_of),
            5 + 7 + 11 + 13
        );
        // A cycle (never in a real /proc) ends instead of spinning.
        let cyclic: HashMap<u32, u32> = [(2, 3), (3, 2)].into();
        assert_eq!(descendants_ticks(10, &cyclic, &[(2, 1), (3, 1)].into()), 0);
    }

    #[test]
    fn the_others_are_the_machine_less_the_run_in_cores() {
        // 400 machine ticks and 150 of the run's in 2 s: the others kept 1.25 cores busy.
        let o = others((1_000, 1_400), (10, 160), 2, 2.0);
        assert_eq!(
            o,
            Others {
                cores: 2,
                cores_busy: 1.25
            }
        );
        // Never below 0 (the run's children reaped after the machine was read) nor above the
        // machine.
        assert_eq!(others((0, 100), (0, 300), 2, 1.0).cores_busy, 0.0);
        assert_eq!(others((0, 10_000), (0, 0), 2, 1.0).cores_busy, 2.0);
        assert_eq!(others((0, 10), (0, 0), 2, 0.0).cores_busy, 0.0);
    }

    #[test]
    fn this_machine_can_be_read_and_the_test_itself_is_part_of_the_run() {
        let m = mark().expect("/proc is readable on Linux");
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed().as_millis() < 50 {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        let o = m.since().expect("a second reading");
        assert!(o.cores >= 1);
        assert!((0.0..=f64::from(o.cores)).contains(&o.cores_busy), "{o:?}");
    }
}
