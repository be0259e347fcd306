//! `ting-chaos bench claim` and `bench e2e` through the real binary, at tiny sizes: the table has
//! its rows, the double-claim verification is printed, and `bench.json` / `chart.svg` are written.
//! Figures are not asserted (benchmarks are commands, not timed tests). Each starts its own
//! throwaway PostgreSQL unless `DATABASE_URL` is set.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// The one result directory a bench command wrote under `root`.
fn result_dir(root: &Path) -> PathBuf {
    let mut dirs: Vec<_> = std::fs::read_dir(root)
        .expect("report dir")
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "expected one result dir, got {dirs:?}");
    dirs.pop().unwrap()
}

fn bench_json(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("bench.json")).expect("bench.json"))
        .expect("bench.json is JSON")
}

#[test]
fn bench_claim_prints_rows_verifies_and_writes_json() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args(["bench", "claim", "--workers", "1,2", "--batch", "1,10"])
        .args(["--rows", "2000", "--report-dir"])
        .arg(tmp.path())
        .output()
        .expect("run ting-chaos");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let table: Vec<&str> = stdout
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 9 && f[0].parse::<u32>().is_ok() && f[1].parse::<u32>().is_ok()
        })
        .collect();
    let keys: Vec<(String, String)> = table
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_string(), f[1].to_string())
        })
        .collect();
    let want: Vec<(String, String)> = [("1", "1"), ("1", "10"), ("2", "1"), ("2", "10")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(keys, want, "{stdout}");
    assert!(
        stdout.contains("verification: OK") && stdout.contains("0 claimed twice"),
        "{stdout}"
    );
    let dir = result_dir(tmp.path());
    let json = bench_json(&dir);
    assert_eq!(json["benchmark"], "claim");
    assert_eq!(json["verified"], true);
    let rows = json["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 4);
    for r in rows {
        assert_eq!(r["claimed"], 2000, "{r}");
        assert_eq!(r["double_claims"], 0, "{r}");
        assert!(r["stack"].as_f64().unwrap() > 0.0);
    }
    assert!(json["machine"]["postgres"]["version"].is_string(), "{json}");
    assert!(dir.join("chart.svg").is_file());
}

/// `--rounds`: each measurement runs both sides that many times, and every round's ratio is
/// kept beside the median round's figures (only when pgbench ran: without it there is no ratio).
#[test]
fn bench_claim_rounds_list_every_rounds_ratio() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args([
            "bench",
            "claim",
            "--workers",
            "2",
            "--batch",
            "10",
            "--rounds",
            "3",
        ])
        .args(["--rows", "600", "--report-dir"])
        .arg(tmp.path())
        .output()
        .expect("run ting-chaos");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let json = bench_json(&result_dir(tmp.path()));
    let row = &json["rows"][0];
    assert_eq!(row["double_claims"], 0, "{row}");
    if row["pgbench"].is_number() {
        assert_eq!(
            row["round_ratios"].as_array().map(Vec::len),
            Some(3),
            "{row}"
        );
        assert!(stdout.contains("stack/pgbench per round"), "{stdout}");
    }
}

#[test]
fn bench_e2e_runs_the_whole_stack_at_each_size() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args(["bench", "e2e", "--workers", "1", "--recipients", "30,60"])
        .args(["--latency", "0ms", "--channels", "line", "--report-dir"])
        .arg(tmp.path())
        .output()
        .expect("run ting-chaos");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("line") && l.ends_with("pass")),
        "{stdout}"
    );
    let json = bench_json(&result_dir(tmp.path()));
    assert_eq!(json["benchmark"], "e2e");
    let rows = json["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    for (row, deliveries) in rows.iter().zip([30, 60]) {
        assert_eq!(row["deliveries"], deliveries, "{row}");
        assert_eq!(row["exit_code"], 0, "{row}");
        assert!(row["deliveries_per_s"].as_f64().unwrap() > 0.0, "{row}");
        // The cost curve: the harness's CPU per 1,000 deliveries and every process's peak.
        assert!(row["harness_cpu_s_per_1k"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["judge_seconds"].as_f64().unwrap() > 0.0, "{row}");
        for peak in [
            "harness_peak_rss_mib",
            "api_peak_rss_mib",
            "worker_peak_rss_mib",
        ] {
            assert!(row[peak].as_u64().unwrap() > 0, "{peak}: {row}");
        }
    }
}

#[test]
fn bench_e2e_rejects_an_empty_campaign() {
    let out = Command::new(bin())
        .args(["bench", "e2e", "--recipients", "100,0"])
        .output()
        .expect("run ting-chaos");
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("--recipients"), "{}", text(&out));
}

/// `--duration` with `--rows`: the queue holds that many rows and the claimers stop when it is
/// empty, before the time is up.
#[test]
fn bench_claim_duration_takes_its_queue_size_from_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args(["bench", "claim", "--workers", "2", "--batch", "1"])
        .args(["--duration", "30s", "--rows", "300", "--no-pgbench"])
        .arg("--report-dir")
        .arg(tmp.path())
        .output()
        .expect("run ting-chaos");
    assert_eq!(code(&out), 0, "{}", text(&out));
    let json = bench_json(&result_dir(tmp.path()));
    let row = &json["rows"][0];
    assert_eq!(row["seeded"], 300, "{row}");
    assert_eq!(row["claimed"], 300, "{row}");
    assert_eq!(row["double_claims"], 0, "{row}");
    assert!(row["seconds"].as_f64().unwrap() < 30.0, "{row}");
}

#[test]
fn bench_claim_rejects_bad_lists() {
    let out = Command::new(bin())
        .args(["bench", "claim", "--workers", "0,2"])
        .output()
        .expect("run ting-chaos");
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("--workers"), "{}", text(&out));
}
