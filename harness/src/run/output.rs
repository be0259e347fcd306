//! The run's last phase: the report. One skeleton ([`skeleton`]) every report starts from, the
//! run's record filled into it, the performance gates, the one overall verdict
//! (`verdict::overall`), and the files beside `report.json` (ledger, status, HTML, JUnit,
//! summary), each written atomically.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use mock_providers::ledger::{EntryKind, Ledger, Outcome, Provider};

use super::judge::Judged;
use super::provision::Database;
use super::quiesce::Settled;
use super::start::{Stack, Workload};
use super::RunOptions;
use crate::check::Entry;
use crate::exit;
use crate::report::{self, Report};
use crate::scenario::Scenario;

/// A report of `s` with nothing recorded or judged yet, verdict `error`: a run that stops before
/// its verdict keeps it so, a judged run overwrites every field it knows.
pub(super) fn skeleton(s: &Scenario, database_kind: &str) -> Report {
    Report {
        format: report::FORMAT,
        tool: report::Tool {
            name: "ting-chaos".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        scenario_name: s.name.clone(),
        seed: s.seed,
        scenario: serde_json::to_value(s).unwrap_or_default(),
        started_at: String::new(),
        duration_ms: 0,
        exit_code: exit::INFRA,
        verdict: "error".into(),
        error: None,
        database: report::DatabaseInfo {
            kind: database_kind.into(),
            server_version: None,
        },
        load: Default::default(),
        ledger_summary: BTreeMap::new(),
        callbacks_sent: 0,
        checks: Vec::new(),
        quiescence: None,
        timeline: Vec::new(),
        processes: Vec::new(),
        chaos_unfired: Vec::new(),
        chaos_steps: Vec::new(),
        files: BTreeMap::new(),
        regressions: Vec::new(),
        gates: Vec::new(),
        sends_by_pid: Default::default(),
        sends_unattributed: None,
        sends_sender_gone: None,
        machine: None,
        harness: None,
        phases: None,
        metrics: Default::default(),
        latency: None,
        uncertain: None,
    }
}

/// Writes the ledger and the status rows, builds the judged report with its gates and verdict,
/// and renders the files beside it (`report.json` itself is written by the caller, on every
/// path).
pub(super) async fn report(
    (scenario, opts, report_dir): (&Scenario, &RunOptions, &Path),
    (ledger, db): (&Ledger, &Database),
    stack: &Stack,
    work: &Workload,
    mut settled: Settled,
    judged: Judged,
    ((started, started_at), cpu_mark): ((Instant, &str), Option<crate::cpu::Mark>),
    mut clock: report::phases::PhaseClock,
) -> anyhow::Result<Report> {
    let mut report = skeleton(scenario, db.kind());
    stack.world.journal.commit(ledger)?;
    report.files.insert("ledger".into(), "ledger.jsonl".into());
    report.files.insert("logs".into(), "logs/".into());
    if let Some(file) = settled.status_file.take() {
        file.commit()?;
        report.files.insert("status".into(), "status.json".into());
    }
    let Judged {
        entries,
        pids,
        timeline,
        processes,
        seen,
        others,
        checks,
    } = judged;
    let enqueue = &settled.enqueue;
    report.database.server_version = server_version(&db.url).await;
    report.load = report::LoadSummary {
        recipients: scenario.load.recipients,
        channels: scenario
            .load
            .channels
            .iter()
            .map(|c| c.as_str().to_string())
            .collect(),
        batches: work.plan.batches.len() as u32,
        expected_deliveries: work.expected.len() as u64,
        bad_address_deliveries: work.expected.iter().filter(|e| e.bad).count() as u64,
        enqueue_latency_ms: report::Percentiles::from_us(&enqueue.latency_us),
        batch_enqueues: enqueue.batches.clone(),
        repeats: enqueue.repeats.clone(),
        enqueue_failures: enqueue.failures.clone(),
    };
    report.ledger_summary = ledger_summary(entries.iter().map(|e| (e.provider, e.kind, e.outcome)));
    report.callbacks_sent = entries
        .iter()
        .filter(|e| e.kind == EntryKind::Callback)
        .count() as u64;
    report.uncertain = Some(report::uncertain(&entries, &checks));
    report.checks = checks;
    report.quiescence = Some(settled.quiescence);
    report.timeline = timeline;
    report.processes = processes;
    let chaos_steps = stack.chaos.results();
    report.chaos_unfired = report::chaos_steps::unfired(&chaos_steps);
    report.chaos_steps = chaos_steps;
    report.sends_by_pid = report::sends_by_pid(&entries, &pids);
    report.sends_unattributed = Some(report::sends_unattributed(&entries, &pids));
    report.sends_sender_gone = Some(stack.world.sends_sender_gone());
    report.machine = Some(crate::stalls::StallSummary::of(&seen, others));
    report.harness = crate::cpu::HarnessUsage::since(cpu_mark);
    report.latency = Some(report::latency(
        &entries,
        &enqueue.latency_us,
        &report::enqueue_times(&work.expected, &enqueue.batches),
    ));
    report.metrics = report::metrics(&report, &entries);
    report.started_at = started_at.to_string();
    clock.lap(|p| &mut p.write_s);
    report.phases = Some(clock.phases);
    report.duration_ms = started.elapsed().as_millis() as u64;
    judge_gates_and_verdict(&mut report, scenario, opts);
    render_outputs(
        report_dir,
        &mut report,
        &entries,
        report::step_summary_path().as_deref(),
    );
    Ok(report)
}

/// Holds the metrics to `[expect]`'s thresholds and `--baseline`, then sets the one overall
/// verdict and exit code from the checks, the gates and the chaos steps not applied.
fn judge_gates_and_verdict(report: &mut Report, scenario: &Scenario, opts: &RunOptions) {
    report.gates = report::gate::evaluate(
        &report.metrics,
        &scenario.expect.thresholds,
        opts.baseline
            .as_ref()
            .map(|(base, tol)| (&base.metrics, *tol)),
    );
    report.regressions = report
        .gates
        .iter()
        .filter(|g| !g.passed && !g.insufficient)
        .map(|g| g.message.clone())
        .collect();
    // A chaos step that did not take effect keeps the run from passing (inconclusive).
    let not_applied = report::chaos_steps::not_applied(&report.chaos_steps);
    let overall = crate::verdict::overall(&report.checks, &report.gates, &not_applied);
    report.exit_code = overall.exit_code();
    report.verdict = overall.verdict.as_str().into();
}

/// Counts of send attempts by provider and outcome, from every entry's (provider, kind,
/// outcome): the judged entries', or a partial report's briefs.
pub(super) fn ledger_summary(
    entries: impl IntoIterator<Item = (Provider, EntryKind, Outcome)>,
) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut m: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let sends = entries.into_iter().filter_map(|(provider, kind, outcome)| {
        (kind == EntryKind::Send).then_some((provider, outcome))
    });
    for (provider, outcome) in sends {
        let outcome = serde_json::to_value(outcome)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        *m.entry(provider.as_str().into())
            .or_default()
            .entry(outcome)
            .or_default() += 1;
    }
    m
}

/// Writes `report.html`, `junit.xml` and `summary.md` (and appends to the step summary) and
/// lists them in `report.files`. A rendering that fails is recorded in `error`, and makes a
/// passing run an infrastructure failure (exit 3, verdict `error`): CI must not pass a run whose
/// results it cannot show. A run that found a violation keeps exit 1 and `fail`: the stack's bug
/// is the news, and `report.json` still carries it.
pub(super) fn render_outputs(
    dir: &Path,
    report: &mut Report,
    entries: &[Entry],
    step_summary: Option<&Path>,
) {
    match report::write_rendered(dir, report, entries, step_summary) {
        Ok(written) => {
            for w in written {
                let name = w
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                let key = name
                    .split('.')
                    .next()
                    .unwrap_or_default()
                    .replace("report", "html");
                report.files.insert(key, name);
            }
        }
        Err(e) => {
            let msg = format!("could not render report.html, junit.xml and summary.md: {e:#}");
            eprintln!("error: {msg}");
            report.error = Some(msg);
            if report.exit_code == exit::OK {
                report.exit_code = exit::INFRA;
                report.verdict = "error".into();
            }
        }
    }
}

/// The database server's version, for the report (None when it cannot be read).
async fn server_version(url: &str) -> Option<String> {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.ok()?;
    sqlx::query_scalar::<_, String>("SHOW server_version")
        .fetch_one(&mut c)
        .await
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let data = include_str!("../../../tests/fixtures/report-sample/report.json");
        serde_json::from_str(data).expect("fixture report")
    }

    #[test]
    fn a_failed_rendering_fails_a_passing_run_and_keeps_a_violation() {
        let dir = tempfile::tempdir().unwrap();
        // Written where no file can be: a folder that does not exist.
        let missing = dir.path().join("missing");
        let mut passed = report();
        (passed.exit_code, passed.verdict) = (exit::OK, "pass".into());
        render_outputs(&missing, &mut passed, &[], None);
        assert_eq!(
            (passed.exit_code, passed.verdict.as_str()),
            (exit::INFRA, "error")
        );
        let err = passed.error.as_deref().unwrap_or_default();
        assert!(err.starts_with("could not render report.html"), "{err}");
        let mut r = report();
        assert_eq!(r.exit_code, exit::VIOLATION);
        render_outputs(&missing, &mut r, &[], None);
        assert_eq!((r.exit_code, r.verdict.as_str()), (exit::VIOLATION, "fail"));
        assert!(r.error.is_some());

        // The same report renders into a folder that exists, and lists the files.
        let mut r = report();
        r.files.clear();
        render_outputs(dir.path(), &mut r, &[], None);
        assert_eq!(r.exit_code, exit::VIOLATION);
        assert!(r.error.is_none());
        let files: Vec<&str> = r.files.values().map(String::as_str).collect();
        assert_eq!(files, ["report.html", "junit.xml", "summary.md"]);
    }
}
