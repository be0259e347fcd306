//! Helpers for the tests that run the real `ting-chaos` binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ting-chaos")
}

/// A scenario file in a fresh temporary directory (with a `reports/` folder beside it).
pub struct Case {
    pub dir: tempfile::TempDir,
    pub scenario: PathBuf,
}

impl Case {
    pub fn new(name: &str, toml: &str) -> Case {
        let dir = tempfile::tempdir().expect("tempdir");
        let scenario = dir.path().join(format!("{name}.toml"));
        std::fs::write(&scenario, toml).expect("write scenario");
        Case { dir, scenario }
    }

    pub fn reports(&self) -> PathBuf {
        self.dir.path().join("reports")
    }

    /// `ting-chaos run` on this scenario; the run's own database unless DATABASE_URL is set.
    pub fn run(&self, extra: &[&str]) -> Output {
        let mut cmd = Command::new(bin());
        cmd.arg("run")
            .arg(&self.scenario)
            .arg("--report-dir")
            .arg(self.reports())
            .args(extra);
        cmd.output().expect("run ting-chaos")
    }

    /// The one report directory the run created.
    pub fn report_dir(&self) -> PathBuf {
        let mut dirs: Vec<_> = std::fs::read_dir(self.reports())
            .expect("reports dir")
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(dirs.len(), 1, "expected one report dir, got {dirs:?}");
        dirs.pop().unwrap()
    }

    pub fn report(&self) -> serde_json::Value {
        let path = self.report_dir().join("report.json");
        serde_json::from_slice(&std::fs::read(&path).expect("report.json")).expect("report is JSON")
    }
}

pub fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The verdict of checker `name` in a report.
pub fn verdict<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|v| v["checker"] == name)
        .unwrap_or_else(|| panic!("no checker {name} in report"))
}

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Validates `report` against the committed `docs/report.schema.json`.
pub fn assert_valid_report(report: &serde_json::Value) {
    let schema: serde_json::Value = serde_json::from_slice(
        &std::fs::read(repo().join("docs/report.schema.json")).expect("schema"),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(report)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "report does not match docs/report.schema.json:\n{}",
        errors.join("\n")
    );
}

/// The text of a shipped scenario, `scenarios/<name>.toml`.
pub fn shipped(name: &str) -> String {
    std::fs::read_to_string(repo().join("scenarios").join(format!("{name}.toml")))
        .unwrap_or_else(|e| panic!("scenarios/{name}.toml: {e}"))
}

/// `toml` with `flaws = [...]` inserted right after its `[stack]` line (the built-in stack then
/// runs with those mistakes switched on).
pub fn with_flaws(toml: &str, flaws: &[&str]) -> String {
    let list = flaws
        .iter()
        .map(|f| format!("{f:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let line = format!("flaws = [{list}]");
    let mut out: Vec<String> = Vec::new();
    let mut done = false;
    for l in toml.lines() {
        out.push(l.to_string());
        if !done && l.trim() == "[stack]" {
            out.push(line.clone());
            done = true;
        }
    }
    assert!(done, "scenario has no [stack] table");
    out.join("\n") + "\n"
}

/// `toml` with `key = value` set in table `[table]`: the key's line is replaced if the table has
/// one, else the line is added right after the table header.
pub fn set(toml: &str, table: &str, key: &str, value: &str) -> String {
    let header = format!("[{table}]");
    let mut out: Vec<String> = Vec::new();
    let (mut inside, mut done, mut seen) = (false, false, false);
    for l in toml.lines() {
        let t = l.trim_start();
        if t.starts_with('[') {
            if inside && !done {
                // Table ended without the key: add it before the next table.
                let at = out
                    .iter()
                    .rposition(|o| !o.trim().is_empty())
                    .map_or(0, |i| i + 1);
                out.insert(at, format!("{key} = {value}"));
                done = true;
            }
            inside = t.trim_end() == header;
            seen |= inside;
        }
        let is_key = t
            .strip_prefix(key)
            .is_some_and(|r| r.trim_start().starts_with('='));
        if inside && !done && is_key {
            out.push(format!("{key} = {value}"));
            done = true;
            continue;
        }
        out.push(l.to_string());
    }
    assert!(seen, "scenario has no {header} table");
    if !done {
        out.push(format!("{key} = {value}"));
    }
    out.join("\n") + "\n"
}

/// The `rule` of every kept counterexample of a verdict.
pub fn rules_of(v: &serde_json::Value) -> Vec<String> {
    v["counterexamples"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["rule"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}
