//! End to end through the real binary: a passing run, a broken stack caught, infrastructure
//! failures, and teardown on Ctrl-C. Each run starts its own throwaway PostgreSQL (or uses
//! `DATABASE_URL` when set).

mod common;

use common::*;

const PASSING: &str = r#"
name = "e2e-pass"
seed = 11

[stack]
workers = 2
lease = "1s"
heartbeat = "250ms"
max_attempts = 5
shutdown_grace = "3s"

[stack.backoff]
base = "50ms"
max = "500ms"

[load]
recipients = 60
channels = ["line", "email", "sms"]
tricky_names = "30%"

[load.bad_addresses]
email = "5%"

[providers.line]
transient = [{ status = 503, rate = "10%" }, { status = 429, rate = "5%", retry_after = "100ms" }]

[providers.smtp]
faults = [{ stage = "rcpt", code = 451, rate = "10%" }]

[providers.sms]
transient = [{ status = 500, rate = "10%" }]

[providers.sms.callbacks]
enabled = true
delay_max = "200ms"
duplicate_rate = "20%"
stale_rate = "10%"
forged_rate = "10%"

[[chaos]]
progress = "30%"
action = "sigkill"
target = 1
restart_after = "200ms"

[[chaos]]
progress = "60%"
action = "restart"
target = 2

[providers.smtp.events]
enabled = true
delay_max = "200ms"

[expect]
quiescence = "60s"
enqueue_p99 = "5s"
# E-mails the SIGKILLed worker had mid-transaction cannot be known (SMTP has no idempotency key):
# held as `unknown` unless a delivery event resolves them. At most its in-flight share.
max_unknown = 32
"#;

#[test]
fn correct_stack_passes_and_report_matches_schema() {
    let case = Case::new("e2e-pass", PASSING);
    let out = case.run(&[]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let report = case.report();
    assert_valid_report(&report);
    assert_eq!(report["verdict"], "pass");
    for name in [
        "exactly_once",
        "no_loss",
        "retry_discipline",
        "immutable_payload",
        "callbacks",
        "graceful_shutdown",
        "recovery",
    ] {
        assert_eq!(
            verdict(&report, name)["status"],
            "holds",
            "{name}: {}",
            verdict(&report, name)
        );
    }
    let kinds: Vec<&str> = report["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"sigkill") && kinds.contains(&"restart"),
        "chaos did not happen: {kinds:?}"
    );
    assert!(report["chaos_unfired"].as_array().unwrap().is_empty());
    // Every send is attributed to the process that sent it, the SIGKILLed worker's included,
    // except a send whose sender the SIGKILL caught between its `connect` and the provider's
    // accept: then no process holds the socket any more, and the report says so.
    assert_eq!(
        report["sends_unattributed"], report["sends_sender_gone"],
        "sends_by_pid: {}",
        report["sends_by_pid"]
    );
    let gone = report["sends_sender_gone"].as_u64().unwrap();
    assert!(
        gone <= 32,
        "{gone} sends whose sender was gone: more than the killed worker had in flight \
         (TING_WORKER_CONCURRENCY 32)"
    );
    let sends: u64 = report["ledger_summary"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|by_outcome| by_outcome.as_object().unwrap().values())
        .map(|n| n.as_u64().unwrap())
        .sum();
    let attributed: u64 = report["sends_by_pid"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(
        attributed + report["sends_unattributed"].as_u64().unwrap(),
        sends,
        "sends_by_pid covers every attributed send"
    );
    let dir = case.report_dir();
    assert!(dir.join("ledger.jsonl").exists());
    assert!(
        dir.join("logs").read_dir().unwrap().count() >= 4,
        "one log per process"
    );
}

#[test]
fn broken_external_stack_that_resends_after_restart_is_caught() {
    // The reference stack with job-level tracking put back, driven as an external stack through
    // the contract: a restarted worker starts the batch again from recipient 1.
    let toml = format!(
        r#"
name = "e2e-broken"
seed = 5

[stack]
workers = 2
lease = "1s"
heartbeat = "250ms"

[stack.external]
migrate = ["{bin}", "stack", "migrate"]
api = ["{bin}", "stack", "api"]
worker = ["{bin}", "stack", "worker", "--flaw", "restart-from-first"]

[load]
recipients = 200
channels = ["line"]

[providers.line]
latency = {{ kind = "fixed", value = "5ms" }}
idempotency = false

[[chaos]]
progress = "50%"
action = "sigkill"
target = "busiest"
restart_after = "100ms"

[expect]
quiescence = "60s"
"#,
        bin = bin()
    );
    let case = Case::new("e2e-broken", &toml);
    let out = case.run(&[]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let report = case.report();
    assert_valid_report(&report);
    let v = verdict(&report, "exactly_once");
    assert_eq!(v["status"], "violated", "{v}");
    let ex = &v["counterexamples"][0];
    assert!(
        ex["sends"].as_array().unwrap().len() >= 2,
        "counterexample lists each send: {ex}"
    );
    assert!(text(&out).contains("VIOLATED"), "{}", text(&out));
}

#[test]
fn unreachable_stack_command_is_an_infrastructure_failure() {
    let case = Case::new(
        "e2e-infra",
        r#"
name = "e2e-infra"
[stack.external]
migrate = ["/nonexistent/ting-stack", "migrate"]
api = ["/nonexistent/ting-stack", "api"]
worker = ["/nonexistent/ting-stack", "worker"]
[load]
recipients = 1
channels = ["sms"]
"#,
    );
    let out = case.run(&[]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    assert!(
        text(&out).contains("/nonexistent/ting-stack"),
        "{}",
        text(&out)
    );
    let report = case.report();
    assert_valid_report(&report);
    assert_eq!(report["verdict"], "error");
}

#[test]
fn bad_scenario_is_a_usage_error() {
    let case = Case::new(
        "bad",
        "name = \"x\"\n[load]\nrecipients = 1\nchannels = [\"fax\"]\n",
    );
    let out = case.run(&[]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("bad.toml:4:"), "{}", text(&out));
}

#[test]
fn committed_report_schema_is_in_sync() {
    let path = repo().join("docs/report.schema.json");
    let want = serde_json::to_string_pretty(&ting_chaos::report::json_schema()).unwrap() + "\n";
    if std::env::var_os("UPDATE_SCHEMAS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(have == want, "docs/report.schema.json is out of date: run `UPDATE_SCHEMAS=1 cargo test --test run_e2e committed_report_schema` and commit it");
}

#[test]
fn stack_survives_database_outages() {
    if std::env::var_os("DATABASE_URL").is_some() {
        eprintln!("skipped: db_restart needs the throwaway cluster (DATABASE_URL is set)");
        return;
    }
    let shipped = std::fs::read_to_string(repo().join("scenarios/db-outage.toml")).unwrap();
    let case = Case::new(
        "db-outage",
        &shipped.replace("recipients = 400", "recipients = 150"),
    );
    let out = case.run(&[]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let report = case.report();
    let kinds: Vec<String> = report["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str().map(String::from))
        .collect();
    for k in [
        "db_terminate",
        "db_restarted",
        "db_idle_tx",
        "db_idle_tx_end",
    ] {
        assert!(
            kinds.iter().any(|x| x == k),
            "{k} missing from the timeline: {kinds:?}"
        );
    }
}
