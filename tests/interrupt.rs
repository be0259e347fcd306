//! Ctrl-C in the middle of a run: the harness stops the stack and the database, and nothing it
//! started survives it.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Every live descendant of `root` (from /proc's parent links).
fn descendants(root: u32) -> Vec<u32> {
    let mut parent = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Field 4 (ppid) comes after the parenthesised command name.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after.split_whitespace().nth(1).unwrap().parse().unwrap();
        parent.insert(pid, ppid);
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (c, pp) in &parent {
            if *pp == p {
                out.push(*c);
                frontier.push(*c);
            }
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
        .unwrap_or(false)
}

#[test]
fn ctrl_c_mid_run_leaves_no_orphans() {
    let case = Case::new(
        "e2e-interrupt",
        r#"
name = "e2e-interrupt"
[stack]
workers = 3
[load]
recipients = 3000
channels = ["line", "sms"]
[providers.line]
latency = { kind = "fixed", value = "200ms" }
[expect]
quiescence = "5m"
"#,
    );
    let mut child = Command::new(bin())
        .arg("run")
        .arg(&case.scenario)
        .arg("--report-dir")
        .arg(case.reports())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let harness = child.id();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // Wait for the stack to be up (the harness says so), with a deadline.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let line = lines.next().expect("harness exited early").unwrap();
        if line.contains("stack up") {
            break;
        }
        assert!(Instant::now() < deadline, "stack never came up");
    }
    let family = descendants(harness);
    assert!(
        family.len() >= 5,
        "postgres, api and 3 workers expected, got {family:?}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(harness as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    std::thread::spawn(move || for _ in lines {});
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let survivors: Vec<u32> = family.iter().copied().filter(|p| alive(*p)).collect();
        if survivors.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "orphans survived Ctrl-C: {survivors:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
