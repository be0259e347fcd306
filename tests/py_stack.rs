//! The Python stack (`examples/py-stack/`, another design in another language) passes a shipped
//! scenario through the real binary: a FAIL from the harness must mean a wrong stack, so a
//! correct stack that is not ours must pass. Needs a `python3` on PATH with psycopg: run the suite
//! with `scripts/test.sh`, which installs it into `target/py-venv` and puts that first on PATH; a
//! machine without it fails here with that instruction, never skips.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

fn require_psycopg() {
    let probe = Command::new("python3")
        .args(["-c", "import psycopg"])
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "python3 cannot import psycopg ({}): run the suite with scripts/test.sh (it installs \
             examples/py-stack/requirements.txt into target/py-venv), or pip-install that file",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => panic!("python3 is not runnable ({e}): the py-stack test needs Python 3.11+"),
    }
}

fn run_scenario(name: &str, sets: &[&str]) -> (std::process::Output, tempfile::TempDir) {
    require_psycopg();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let reports = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(bin());
    cmd.arg("run")
        .arg(root.join("scenarios").join(format!("{name}.toml")))
        .arg("--stack")
        .arg(root.join("examples/py-stack/stack.toml"))
        .arg("--report-dir")
        .arg(reports.path());
    for s in sets {
        cmd.args(["--set", s]);
    }
    (cmd.output().expect("run ting-chaos"), reports)
}

#[test]
fn python_stack_passes_restart_midway() {
    let (out, reports) = run_scenario("restart-midway", &["load.recipients=150"]);
    assert_eq!(
        code(&out),
        0,
        "the Python stack did not pass restart-midway (reports in {:?}):\n{}\n{}",
        reports.keep(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
}
