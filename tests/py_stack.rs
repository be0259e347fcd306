//! The Python stack (`examples/py-stack/`, another design in another language) passes a shipped
//! scenario through the real binary: a FAIL from the harness must mean a wrong stack, so a
//! correct stack that is not ours must pass. And with a mistake switched on (`PY_STACK_FLAWS`) it
//! fails, on the rules that were blind to that stack's shape of it until the mutation testing in
//! its README found them. Needs a `python3` on PATH with psycopg: run the suite
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
    run_flawed(&[], name, sets)
}

/// `run_scenario` with py-stack's `PY_STACK_FLAWS` switched on (none: the correct stack).
fn run_flawed(
    flaws: &[&str],
    name: &str,
    sets: &[&str],
) -> (std::process::Output, tempfile::TempDir) {
    run_py(&[("PY_STACK_FLAWS", &flaws.join(","))], name, sets)
}

/// Runs the shipped scenario `name` against py-stack with `envs` set for its processes.
fn run_py(
    envs: &[(&str, &str)],
    name: &str,
    sets: &[&str],
) -> (std::process::Output, tempfile::TempDir) {
    require_psycopg();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let reports = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(bin());
    cmd.envs(envs.iter().copied());
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

/// `api-redeploy` with its SIGKILL 100 ms after the restart's SIGTERM: the old API is still
/// draining (this stack's serve loop notices the shutdown within 0.5 s) and its replacement not
/// yet up. The kill must wait for the replacement and hit it, right after it answered a batch:
/// acting at once signalled the draining or still-starting API and started two replacements on
/// one address (`process_crashed`, or a restart that never became ready: INCONCLUSIVE).
#[test]
fn python_stack_passes_api_redeploy_with_the_api_steps_100ms_apart() {
    let (out, reports) = run_scenario(
        "api-redeploy",
        &["load.recipients=200", "chaos[1].at=\"2100ms\""],
    );
    let report = report_in(&reports);
    assert_eq!(
        code(&out),
        0,
        "the Python stack did not pass api-redeploy with overlapping API steps (reports in {:?}):\n{}",
        reports.keep(),
        String::from_utf8_lossy(&out.stdout)
    );
    let steps = report["chaos_steps"].as_array().expect("chaos_steps");
    let pids: Vec<&serde_json::Value> = steps.iter().map(|s| &s["pids"][0]).collect();
    assert_ne!(
        pids[0], pids[1],
        "the kill hit the API the restart had signalled: {steps:?}"
    );
    let aimed = report["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .filter(|e| e["kind"] == "api_signal")
        .any(|e| {
            e["detail"]
                .as_str()
                .is_some_and(|d| d.contains("right after the API answered"))
        });
    assert!(
        aimed,
        "no API signal landed right after an answer: {steps:?}"
    );
}

/// The one report a run wrote under `reports`.
fn report_in(reports: &tempfile::TempDir) -> serde_json::Value {
    let dir = std::fs::read_dir(reports.path())
        .expect("reports dir")
        .map(|e| e.expect("entry").path())
        .find(|p| p.join("report.json").exists())
        .expect("a report directory");
    serde_json::from_slice(&std::fs::read(dir.join("report.json")).expect("report.json"))
        .expect("report is JSON")
}

/// Runs py-stack with `envs` on the shipped scenario `name` and asserts `ok` of the exit code
/// and the report; on failure prints both, with the run's summary.
fn expect_run(
    envs: &[(&str, &str)],
    name: &str,
    sets: &[&str],
    ok: impl Fn(i32, &serde_json::Value) -> bool,
) {
    let (out, reports) = run_py(envs, name, sets);
    let report = report_in(&reports);
    assert!(
        ok(code(&out), &report),
        "py-stack {envs:?} on {name}: exit {}, chaos {:#}, checks {:#} (reports in {:?}):\n{}",
        code(&out),
        report["chaos_steps"],
        report["checks"],
        reports.keep(),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The report has `n` chaos steps and each met something.
fn every_step_met(report: &serde_json::Value, n: usize) -> bool {
    let steps = report["chaos_steps"].as_array().expect("chaos_steps");
    steps.len() == n && steps.iter().all(|s| s["count"].as_u64() > Some(0))
}

/// Whether any checker of the report was violated.
fn any_violated(report: &serde_json::Value) -> bool {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .any(|v| v["status"] == "violated")
}

/// INCONCLUSIVE because the stack was still settling when the wait ended, nothing violated.
fn still_settling(code: i32, report: &serde_json::Value) -> bool {
    let q = verdict(report, "quiescence");
    code == 4
        && !any_violated(report)
        && q["status"] == "insufficient"
        && q["figures"]["still_settling"] == true
}

/// Runs py-stack with `flaw` on `scenario` and asserts exit 1 with `checker` violated on `rule`.
fn caught(flaw: &str, scenario: &str, sets: &[&str], checker: &str, rule: &str) {
    let (out, reports) = run_flawed(&[flaw], scenario, sets);
    let report = report_in(&reports);
    let v = verdict(&report, checker);
    let found = v["status"] == "violated" && rules_of(v).iter().any(|r| r == rule);
    assert!(
        found && code(&out) == 1,
        "py-stack flaw {flaw} on {scenario}: exit {}, {checker} {} {:?} (reports in {:?}):\n{}",
        code(&out),
        v["status"],
        rules_of(v),
        reports.keep(),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A stack that checks a report's signature only when there is one: the fakes' forged reports
/// without any signature header (`unsigned`) must be refused (403) and change nothing.
#[test]
fn python_stack_accepting_unsigned_reports_fails_callbacks_chaos() {
    caught(
        "unsigned-reports-accepted",
        "callbacks-chaos",
        &["load.recipients=60"],
        "callbacks",
        "forged_answered_2xx",
    );
}

/// A stack that keeps templates by id (the latest POST wins) and renders at send time: the
/// batches POSTed before `template-change`'s edit go out with the edited Subject.
#[test]
fn python_stack_rendering_from_the_template_of_the_moment_fails_template_change() {
    caught(
        "template-by-id",
        "template-change",
        &["load.recipients=40"],
        "headers",
        "subject_changed",
    );
}

/// A correct stack whose report path is slow (py-stack applying delivery reports one at a time,
/// 250 ms each: ~300 reports take over a minute) is still taking reports in when the wait ends at
/// three times a 2 s deadline: INCONCLUSIVE with the reports still due, never a FAIL
/// (`callbacks_pending` once failed it though every report it answered was right).
#[test]
fn python_stack_taking_reports_slowly_is_inconclusive_not_failed() {
    expect_run(
        &[("PY_STACK_REPORT_MS", "250")],
        "callbacks-chaos",
        &["load.recipients=40", "expect.quiescence=\"2s\""],
        |code, r| {
            still_settling(code, r)
                && verdict(r, "quiescence")["figures"]["callbacks_pending"].as_u64() > Some(0)
        },
    );
}

/// A stack that drains its channels one after another, every e-mail first, has sent all of
/// them by a third of all deliveries: an SMTP outage "at 50%" counted over every delivery met no
/// e-mail and left this correct stack INCONCLUSIVE ("no send met it"). A provider action counts
/// its own channel's progress, so both outages meet sends (the SMS hang comes at a quarter of
/// the SMS, sent last) and the run passes.
#[test]
fn python_stack_draining_one_channel_first_meets_both_outages() {
    expect_run(
        &[("PY_STACK_CHANNEL_ORDER", "email,line,sms")],
        "provider-outage",
        &["load.recipients=200", "load.batches=4"],
        |code, r| code == 0 && every_step_met(r, 2),
    );
}

/// A stack with a worker per channel (slot 1 SMS, 2 LINE, 3 e-mail): a link fault aimed at a
/// worker by its index, or at the busiest worker in all, meets no send of its provider, and the
/// run was INCONCLUSIVE ("no send met it") for this correct stack. `provider-links` aims each
/// at the worker busiest with that provider, and every step takes effect.
#[test]
fn python_stack_with_a_worker_per_channel_meets_every_link_fault() {
    expect_run(
        &[("PY_STACK_WORKER_CHANNELS", "1=sms;2=line;3=email")],
        "provider-links",
        &["load.recipients=200"],
        |code, r| code == 0 && every_step_met(r, 5),
    );
}

/// The same stack on `stuck-worker`, which kills worker 2 for good: worker 2 was its only LINE
/// sender, so the LINE rows it gave up stay open with no process left to send them. That FAILED
/// (`no_loss` and `quiescence` "open") though nothing was lost; it is INCONCLUSIVE, naming the
/// worker, and every other channel is judged as before.
#[test]
fn python_stack_with_a_worker_per_channel_losing_its_line_worker_is_inconclusive_not_failed() {
    expect_run(
        &[("PY_STACK_WORKER_CHANNELS", "1=sms;2=line;3=email")],
        "stuck-worker",
        &["load.recipients=150", "expect.quiescence=\"10s\""],
        |code, r| {
            let orphaned = |name: &str, key: &str| {
                let v = verdict(r, name);
                v["status"] == "insufficient" && v["figures"][key].as_u64() > Some(0)
            };
            code == 4
                && !any_violated(r)
                && orphaned("no_loss", "open_orphaned")
                && orphaned("quiescence", "orphaned")
                && verdict(r, "exactly_once")["status"] == "holds"
        },
    );
}

/// A stack whose worker takes 3 s to boot, run with one worker: each replacement the chaos
/// starts is idle for those 3 s, and its rescue and its retries were judged from its spawn, so
/// the run FAILED (`recovery` `no_progress`, `retry_discipline` `gap_above_cap`) though the
/// stack was right. They are judged from its boot, measured on the first worker.
#[test]
fn python_stack_booting_slowly_passes_restart_midway_with_one_worker() {
    expect_run(
        &[("PY_STACK_BOOT_MS", "3000")],
        "restart-midway",
        &["load.recipients=60", "stack.workers=1"],
        |code, r| {
            let boot = verdict(r, "recovery")["figures"]["worker_boot_ms"]
                .as_f64()
                .unwrap_or(0.0);
            code == 0 && boot >= 3_000.0
        },
    );
}

/// A stack whose worker is a prefork pool (two child processes claim and send; the process the
/// harness started only waits for them, as Celery's default pool does): every send is the
/// started worker's, found in its process group, so the kills and the restart are judged like
/// any worker's. Its sends were unattributed (`agreement`, `recovery` insufficient). The only
/// ones left are those of a child killed between its connect and the provider's accept, which
/// no lookup can name.
#[test]
fn python_stack_as_a_prefork_pool_is_judged_by_its_childrens_sends() {
    expect_run(
        &[("PY_STACK_PROCS", "2")],
        "restart-midway",
        &["load.recipients=150"],
        |code, r| code == 0 && r["sends_unattributed"] == r["sends_sender_gone"],
    );
}

/// A stack with 32 sender threads per worker, each with its own connection, uses 34 connections
/// a worker: with the throwaway cluster's old `60 + 16 × workers` its API found none free, and
/// the run FAILED (`agreement` `status_unreadable`: every status request answered 503) though
/// every delivery was right. The cluster now allows 40 a worker (`provision::max_connections`).
#[test]
fn python_stack_with_32_senders_a_worker_gets_its_connections() {
    expect_run(
        &[("PY_STACK_THREADS", "32")],
        "flaky-providers",
        &["load.recipients=200"],
        |code, _| code == 0,
    );
}

/// A slow correct stack (one sender thread a worker, each send 5 s) behind a trickle that adds
/// orders faster than it settles them: the open count only grows while it settles a delivery
/// every second or so. Counted as "fewer open", the wait saw no progress and called it a stall
/// at the deadline: FAIL (`quiescence` and `no_loss` violated). Counted as more settled, it is
/// still settling at three times the deadline: INCONCLUSIVE, never FAIL.
#[test]
fn python_stack_slower_than_its_trickle_is_inconclusive_not_failed() {
    expect_run(
        &[("PY_STACK_THREADS", "1")],
        "slow-provider",
        &["expect.quiescence=\"10s\""],
        still_settling,
    );
}

/// A fast stack (32 senders a worker) reaches 35% of its SMS half a second after 15%: the
/// busiest SMS sender, aimed at for the reset, was the worker the partition had just cut off,
/// whose SMS were all held, and the reset met nothing (INCONCLUSIVE). A link fault's `busiest`
/// skips a worker whose link to that provider another step holds.
#[test]
fn python_stack_sending_fast_meets_two_link_faults_on_one_provider() {
    expect_run(
        &[("PY_STACK_THREADS", "32")],
        "provider-links",
        &["load.recipients=200"],
        |code, r| code == 0 && every_step_met(r, 5),
    );
}

/// A stack sending one delivery at a time (one sender a worker): each `crash-window` kill
/// catches only the send the provider has just accepted, its answer on the way. Counted as
/// final, it left `recovery` with nothing judged (INCONCLUSIVE) on every seed; judged by the
/// row's release, the run passes.
#[test]
fn python_stack_sending_one_at_a_time_passes_crash_window() {
    expect_run(
        &[("PY_STACK_THREADS", "1")],
        "crash-window",
        &[],
        |code, r| {
            let caught = &verdict(r, "recovery")["figures"]["answers_caught_in_flight"];
            code == 0 && caught.as_u64() >= Some(3)
        },
    );
}

/// The other edge: a stack that answers no delivery report within the fakes' 2 s timeout
/// (each takes a minute) has stopped taking them, however many are due: a stall, violated once
/// nothing has settled and no report been answered for 10 s past the deadline (12 s: its sends
/// are done in two or three, so the last progress is well over 10 s old by then). The fakes
/// retry each report 50 times, so reports are still due then (given up on, the rows would be
/// `awaiting_report`: unjudged, not this stall).
#[test]
fn python_stack_answering_no_report_in_time_fails_quiescence() {
    let (out, reports) = run_py(
        &[("PY_STACK_REPORT_MS", "60000")],
        "callbacks-chaos",
        &[
            "load.recipients=20",
            "expect.quiescence=\"12s\"",
            "providers.sms.callbacks.max_retries=50",
            "providers.smtp.events.max_retries=50",
        ],
    );
    let report = report_in(&reports);
    let q = verdict(&report, "quiescence");
    assert!(
        code(&out) == 1
            && q["status"] == "violated"
            && q["figures"]["still_settling"] == false
            && rules_of(q).iter().any(|r| r == "callbacks_pending"),
        "exit {}, quiescence {q:#} (reports in {:?}):\n{}",
        code(&out),
        reports.keep(),
        String::from_utf8_lossy(&out.stdout)
    );
}
