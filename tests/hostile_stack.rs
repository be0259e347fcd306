//! A stack that answers the harness with garbage (`tests/fixtures/hostile-stack/stack.py`, run as
//! an external stack): whatever it answers, the run ends in bounded time with a verdict that
//! names what the stack did wrong — never a panic, never exit 3 once the stack was usable, never
//! a pass because the harness could not read it.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// A scenario against the hostile stack, answering as `env` says (`HOSTILE_*` variables).
fn hostile(name: &str, env: &str) -> Case {
    let stack = repo().join("tests/fixtures/hostile-stack/stack.py");
    let stack = stack.display();
    Case::new(
        name,
        &format!(
            r#"name = "{name}"
seed = 5

[stack]
workers = 1

[stack.external]
migrate = ["python3", "{stack}", "migrate"]
api = ["python3", "{stack}", "api"]
worker = ["python3", "{stack}", "worker"]
env = {{ {env} }}

[load]
recipients = 4
channels = ["line"]

[expect]
quiescence = "3s"
"#
        ),
    )
}

fn rule_violated(report: &serde_json::Value, checker: &str, rule: &str) -> bool {
    verdict(report, checker)["violations_by_rule"][rule]
        .as_u64()
        .is_some_and(|n| n > 0)
}

/// A valid batch refused (422) is the stack failing to take it: a FAIL naming the answer, not
/// an infrastructure failure (it used to stop the run with exit 3).
#[test]
fn a_refused_batch_is_a_verdict_not_an_infrastructure_failure() {
    let case = hostile("hostile-refuse", r#"HOSTILE_POST = "refuse""#);
    let out = case.run(&[]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let report = case.report();
    assert!(
        rule_violated(&report, "responsiveness", "enqueue_not_accepted"),
        "{}",
        verdict(&report, "responsiveness")
    );
    let gone = &report["load"]["enqueue_failures"]["not_accepted"][0];
    let why = gone["last_error"].as_str().unwrap_or_default();
    assert!(why.starts_with("HTTP 422: "), "{gone}");
    assert!(why.contains("is final"), "{gone}");
    assert_eq!(gone["attempts"], 1, "a refusal is not retried: {gone}");
}

/// A status API answering 200 with HTML is a broken status API, reported with the answer — not
/// taken for "no status API" (which let the checkers that need it say "not checked").
#[test]
fn a_status_api_answering_garbage_is_a_violation_with_the_answer() {
    let case = hostile("hostile-status", r#"HOSTILE_STATUS = "garbage""#);
    let out = case.run(&[]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let report = case.report();
    let v = verdict(&report, "agreement");
    assert!(
        rule_violated(&report, "agreement", "status_unreadable"),
        "{v}"
    );
    let c = v["counterexamples"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["rule"] == "status_unreadable")
        .expect("a status_unreadable counterexample");
    assert_eq!(c["http_status"], 200, "{c}");
    assert!(
        c["error"]
            .as_str()
            .unwrap()
            .starts_with("not the contract's answer: expected value at line 1 column 1"),
        "{c}"
    );
    assert!(
        c["body_head"].as_str().unwrap().starts_with("<html>"),
        "{c}"
    );
    assert!(!text(&out).contains("panicked"), "{}", text(&out));
}

/// A status API that never answers costs one timeout per poll, not one per batch per poll, and
/// is reported: the run ends in bounded time.
#[test]
fn a_status_api_that_hangs_is_reported_in_bounded_time() {
    let case = hostile("hostile-hang", r#"HOSTILE_STATUS = "hang""#);
    let started = Instant::now();
    let out = case.run(&["--set", "load.batches=4"]);
    let took = started.elapsed();
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(took < Duration::from_secs(150), "took {took:?}");
    let report = case.report();
    assert!(
        rule_violated(&report, "agreement", "status_unreadable"),
        "{}",
        verdict(&report, "agreement")
    );
}

/// An API that answers `/healthz` 503 for ever never became usable: exit 3, saying what it
/// answered.
#[test]
fn an_api_never_healthy_is_an_infrastructure_failure_naming_its_answer() {
    let case = hostile("hostile-healthz", r#"HOSTILE_HEALTHZ = "503""#);
    let out = case.run(&[]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    assert!(
        text(&out).contains("(last try: HTTP 503 Service Unavailable)"),
        "{}",
        text(&out)
    );
}
