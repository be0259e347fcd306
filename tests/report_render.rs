//! The renderings of a real run's report (`tests/fixtures/report-sample/`: `restart-midway` against
//! a slow stack, four invariants violated, ledger trimmed to a twentieth of the recipients):
//! HTML, JUnit, Markdown, the files written beside the report, and the metrics.

use std::path::{Path, PathBuf};

use mock_providers::ledger::LedgerEntry;
use serde_json::json;
use ting_chaos_harness::check::{Entry, Interner, Keep};
use ting_chaos_harness::check::{EventKind, Status, TimelineEvent};
use ting_chaos_harness::report::{
    self, gate, html::render_html, junit::render_junit, markdown::render_markdown, Bucket, Latency,
    Percentiles, Report, Uncertain,
};

const EVIL: &str = "<script>alert('pwned')</script>";
const CHECKERS: [&str; 9] = [
    "exactly_once",
    "no_loss",
    "retry_discipline",
    "immutable_payload",
    "callbacks",
    "graceful_shutdown",
    "recovery",
    "responsiveness",
    "quiescence",
];
const VIOLATED: [&str; 4] = ["no_loss", "immutable_payload", "recovery", "quiescence"];

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report-sample")
}

fn fixture() -> (Report, Vec<Entry>) {
    let data = std::fs::read(fixture_dir().join("report.json")).unwrap();
    let report: Report = serde_json::from_slice(&data).unwrap();
    let (ledger, skipped) = report::read_ledger(&fixture_dir().join("ledger.jsonl")).unwrap();
    assert_eq!(skipped, 0);
    (report, ledger)
}

/// The fixture with HTML where people put text: the scenario name and a counterexample.
fn hostile() -> (Report, Vec<Entry>) {
    let (mut r, ledger) = fixture();
    r.scenario_name = format!("restart-midway {EVIL}");
    let no_loss = r
        .checks
        .iter_mut()
        .find(|v| v.checker == "no_loss")
        .unwrap();
    no_loss.counterexamples.insert(
        0,
        json!({"rule": "lost", "recipient": EVIL, "channel": "email", "address": "x@example.test",
               "reason": format!("name {EVIL} & co"), "sends": [{"attempt": 1, "pid": 4242, "payload_hash": EVIL}]}),
    );
    (r, ledger)
}

#[test]
fn html_shows_the_verdict_every_checker_and_charts() {
    let (mut r, ledger) = fixture();
    r.sends_by_pid = [
        (18594, 900),
        (18595, 700),
        (19189, 300),
        (18597, 950),
        (18598, 910),
    ]
    .into();
    let html = render_html(&r, &ledger);
    let verdict_at = html.find(">FAIL<").expect("verdict shown");
    for name in CHECKERS {
        let at = html
            .find(&format!("<span class=\"checker\">{name}</span>"))
            .unwrap_or_else(|| panic!("{name} missing"));
        assert!(at > verdict_at, "the verdict comes first");
    }
    for v in r.checks.iter().filter(|v| v.status == Status::Violated) {
        assert!(html.contains(&format!(
            "Counterexamples ({} shown of {})",
            v.counterexamples.len(),
            v.total_counterexamples
        )));
    }
    // Timeline, e2e histogram, attempts, workers.
    assert_eq!(html.matches("<svg").count(), 4, "four charts");
    for marker in [
        "sigkill w2",
        "restart w2-r1",
        "load_start",
        "injected faults",
        "email accepted",
    ] {
        assert!(html.contains(marker), "{marker} not on the timeline");
    }
    assert!(html.contains(">w2-r1<"), "workers labelled by worker id");
    assert!(
        html.contains("<details class=\"cx\">"),
        "counterexamples collapsible"
    );
    assert!(
        html.contains("r000853"),
        "a recovery counterexample's recipient is shown"
    );
    // Self-contained: nothing to fetch.
    for external in [
        "<script",
        "<link",
        "<img",
        "<iframe",
        " src=\"",
        "href=\"http",
        "@import",
        "url(",
    ] {
        assert!(!html.contains(external), "page references {external}");
    }
}

#[test]
fn html_escapes_everything_from_the_report() {
    let (r, ledger) = hostile();
    let html = render_html(&r, &ledger);
    assert!(
        !html.contains("<script"),
        "a script from the report reached the page"
    );
    assert!(html.contains("&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;&#x2F;script&gt;"));
    assert!(
        !html.contains("<img src=x"),
        "recipient names from the real run are escaped too"
    );
}

#[test]
fn html_renders_a_run_that_never_started() {
    let (mut r, _) = fixture();
    r.checks.clear();
    r.timeline.clear();
    r.processes.clear();
    r.verdict = "error".into();
    r.error = Some(format!("database: {EVIL}"));
    let html = render_html(&r, &[]);
    assert!(html.contains("The run could not complete"));
    assert!(html.contains("No checker ran"));
    assert!(!html.contains("<script"));
}

/// (testcase name, failure/skipped/error child, its message, its text), parsed by a real XML
/// parser so a badly escaped document fails here.
fn junit_cases(xml: &str) -> Vec<(String, Option<String>, String, String)> {
    let doc = roxmltree::Document::parse(xml).expect("junit.xml is well-formed XML");
    doc.descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .map(|case| {
            let name = case.attribute("name").unwrap_or_default().to_string();
            let child = case
                .children()
                .find(|c| ["failure", "skipped", "error"].contains(&c.tag_name().name()));
            match child {
                Some(c) => (
                    name,
                    Some(c.tag_name().name().to_string()),
                    c.attribute("message").unwrap_or_default().to_string(),
                    c.text().unwrap_or_default().to_string(),
                ),
                None => (name, None, String::new(), String::new()),
            }
        })
        .collect()
}

#[test]
fn junit_has_one_testcase_per_checker_with_failures() {
    let (r, _) = hostile();
    let xml = render_junit(&r);
    assert!(xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"));
    assert!(
        xml.contains("tests=\"9\" failures=\"4\" errors=\"0\" skipped=\"1\""),
        "{xml}"
    );
    let cases = junit_cases(&xml);
    let names: Vec<&str> = cases.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, CHECKERS);
    for (name, child, message, text) in &cases {
        let v = r.checks.iter().find(|v| &v.checker == name).unwrap();
        match v.status {
            Status::Violated => {
                assert_eq!(child.as_deref(), Some("failure"), "{name}");
                assert_eq!(message, &v.summary);
                assert!(VIOLATED.contains(&name.as_str()));
                let total_line = usize::from(v.total_counterexamples > v.counterexamples.len());
                assert_eq!(
                    text.lines().count(),
                    v.counterexamples.len() + total_line,
                    "{name}: one line per counterexample (and the total)"
                );
            }
            Status::NotChecked => {
                assert_eq!((child.as_deref(), message), (Some("skipped"), &v.summary))
            }
            Status::Holds => assert_eq!(child, &None, "{name}"),
            Status::Insufficient => {
                assert_eq!((child.as_deref(), message), (Some("failure"), &v.summary))
            }
        }
    }
    let no_loss = cases.iter().find(|c| c.0 == "no_loss").unwrap();
    assert!(
        no_loss.3.contains(EVIL),
        "the counterexample survives escaping intact"
    );
    assert!(!xml.contains(EVIL), "…and is escaped in the file");
}

#[test]
fn junit_reports_an_infrastructure_error() {
    let (mut r, _) = fixture();
    r.checks.clear();
    r.error = Some("could not start PostgreSQL: \u{1} <bad>".into());
    let cases = junit_cases(&render_junit(&r));
    assert_eq!(cases.len(), 1);
    assert_eq!(cases[0].0, "run");
    assert_eq!(cases[0].1.as_deref(), Some("error"));
    assert_eq!(cases[0].2, "could not start PostgreSQL: \u{fffd} <bad>");
}

#[test]
fn markdown_summarises_with_a_table() {
    let (r, _) = hostile();
    let md = render_markdown(&r);
    assert!(
        md.starts_with("## ❌ FAIL — restart-midway &lt;script&gt;"),
        "{md}"
    );
    assert!(md.contains("| checker | status | summary |\n|---|---|---|\n"));
    for name in CHECKERS {
        let name = name.replace('_', "\\_");
        assert!(
            md.lines().any(|l| l.starts_with(&format!("| {name} | "))),
            "{name} row missing:\n{md}"
        );
    }
    assert_eq!(md.matches("❌ **violated**").count(), 4);
    assert!(md.contains("### Counterexamples"));
    assert!(!md.contains("<script"), "{md}");
    let mut pass = hostile().0;
    pass.verdict = "pass".into();
    pass.checks
        .iter_mut()
        .filter(|v| v.status == Status::Violated)
        .for_each(|v| v.status = Status::Holds);
    let md = render_markdown(&pass);
    assert!(md.starts_with("## ✅ PASS"));
    assert!(!md.contains("Counterexamples"));
    assert!(
        !md.contains("Senders:"),
        "nothing to say when every send is attributed"
    );
    // Sends the harness could not tie to a process are said, in both summaries.
    pass.sends_unattributed = Some(3);
    pass.sends_sender_gone = Some(2);
    let md = render_markdown(&pass);
    assert!(
        md.contains("Senders: 3 send(s) not attributed to a process (2 whose sender"),
        "{md}"
    );
    assert!(report::summary_text(&pass).contains("senders: 3 send(s)"));
}

#[test]
fn metrics_come_from_the_ledger() {
    let (r, ledger) = fixture();
    let m = report::metrics(&r, &ledger);
    assert_eq!(m.enqueue_p99_ms, Some(r.load.enqueue_latency_ms.p99));
    let (per_s, p50, p99) = (
        m.deliveries_per_s.unwrap(),
        m.e2e_p50_ms.unwrap(),
        m.e2e_p99_ms.unwrap(),
    );
    assert!(
        per_s > 1.0 && per_s < 10.0,
        "{m:?}: a twentieth of a ~60/s run"
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 < 70_000.0, "{m:?}");
}

#[test]
fn write_all_and_rerender_write_every_file_atomically() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["report.json", "ledger.jsonl"] {
        std::fs::copy(fixture_dir().join(f), dir.path().join(f)).unwrap();
    }
    let written = report::rerender(dir.path(), false).unwrap();
    let names: Vec<_> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(names, ["report.html", "junit.xml", "summary.md"]);

    let (r, ledger) = fixture();
    let step = dir.path().join("step-summary.md");
    std::fs::write(&step, "earlier step\n").unwrap();
    report::write_rendered(dir.path(), &r, &ledger, Some(&step)).unwrap();
    report::write_rendered(dir.path(), &r, &ledger, Some(&step)).unwrap();
    let step = std::fs::read_to_string(&step).unwrap();
    assert!(
        step.starts_with("earlier step\n## ❌ FAIL"),
        "appended, not replaced"
    );
    assert_eq!(step.matches("| checker | status | summary |").count(), 2);
    // The summary of an old report without metrics gets them from the ledger.
    assert!(step.contains("deliveries/s"), "{step}");

    let mut files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "junit.xml",
            "ledger.jsonl",
            "report.html",
            "report.json",
            "step-summary.md",
            "summary.md"
        ]
    );
}

/// The fixture as a run whose invariants all held but whose performance gates failed: one
/// threshold broken, one kept, and a baseline ten times better.
fn gated() -> Report {
    let (mut r, _) = fixture();
    for v in &mut r.checks {
        if v.status == Status::Violated {
            v.status = Status::Holds;
            v.counterexamples.clear();
            v.total_counterexamples = 0;
        }
    }
    r.metrics = report::Metrics {
        deliveries_per_s: Some(60.0),
        enqueue_p99_ms: Some(700.0),
        e2e_p50_ms: Some(20_000.0),
        e2e_p99_ms: Some(40_000.0),
    };
    let thresholds: Vec<gate::Threshold> = ["deliveries_per_s >= 1000000000", "e2e_p99 <= 1h"]
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
    let base = report::Metrics {
        deliveries_per_s: Some(600.0),
        enqueue_p99_ms: Some(70.0),
        e2e_p50_ms: Some(2_000.0),
        e2e_p99_ms: Some(4_000.0),
    };
    r.gates = gate::evaluate(&r.metrics, &thresholds, Some((&base, 0.15)));
    r.regressions = r
        .gates
        .iter()
        .filter(|g| !g.passed)
        .map(|g| g.message.clone())
        .collect();
    r.verdict = "fail".into();
    r.exit_code = 1;
    r
}

const THRESHOLD_LINE: &str =
    "deliveries_per_s under threshold: this run 60.0 (threshold deliveries_per_s >= 1000000000)";
const BASELINE_LINE: &str =
    "deliveries_per_s regressed: baseline 600.0 → this run 60.0 (−90.0%, tolerance 15%)";

#[test]
fn failed_gates_are_named_in_every_rendering() {
    let r = gated();
    assert_eq!(r.regressions.len(), 4, "{:?}", r.regressions);
    assert_eq!(r.regressions[0], THRESHOLD_LINE);
    assert_eq!(r.regressions[1], BASELINE_LINE);

    // Terminal: one line per gate, failed ones with their message.
    let text = report::summary_text(&r);
    assert!(
        text.contains(&format!("GATE FAILED  threshold          {THRESHOLD_LINE}")),
        "{text}"
    );
    assert!(text.contains(BASELINE_LINE), "{text}");
    assert!(
        text.contains("gate ok      threshold          e2e_p99 <= 1h"),
        "{text}"
    );

    // summary.md: the failure under the heading, and a table of every gate.
    let md = render_markdown(&r);
    assert!(md.starts_with("## ❌ FAIL"), "{md}");
    let escaped = THRESHOLD_LINE.replace('_', "\\_").replace('>', "&gt;");
    assert!(
        md.contains(&format!("> ❌ **Performance gate failed:** {escaped}")),
        "{md}"
    );
    assert!(md.contains("| performance gate | result | threshold / baseline | this run |"));
    assert_eq!(md.matches("❌ **failed**").count(), 4, "{md}");

    // report.html: the verdict line says why, and the gates come before the checkers.
    let html = render_html(&r, &[]);
    let header_end = html.find("</header>").unwrap();
    assert!(
        html[..header_end]
            .contains("none violated; performance gate failed: deliveries_per_s under threshold"),
        "{}",
        &html[..header_end]
    );
    let gates_at = html.find("<section id=\"gates\">").expect("gates section");
    assert!(gates_at < html.find("<section id=\"checks\">").unwrap());
    assert!(html.contains("regressed: baseline 600.0 → this run 60.0"));

    // junit.xml: a test case per gate, failing with the message.
    let xml = render_junit(&r);
    assert!(xml.contains("tests=\"14\" failures=\"4\""), "{xml}");
    let cases = junit_cases(&xml);
    let gate_cases: Vec<_> = cases.iter().filter(|c| c.0.starts_with("gate: ")).collect();
    assert_eq!(gate_cases.len(), 5);
    let t = gate_cases
        .iter()
        .find(|c| c.0 == "gate: threshold deliveries_per_s >= 1000000000")
        .unwrap();
    assert_eq!(
        (t.1.as_deref(), t.2.as_str()),
        (Some("failure"), THRESHOLD_LINE)
    );
    let ok = gate_cases
        .iter()
        .find(|c| c.0 == "gate: threshold e2e_p99 <= 1h")
        .unwrap();
    assert_eq!(ok.1, None, "a kept threshold passes");
    let b = gate_cases
        .iter()
        .find(|c| c.0 == "gate: baseline deliveries_per_s within 15% of baseline")
        .unwrap();
    assert_eq!(b.2, BASELINE_LINE);
}

#[test]
fn html_draws_both_latency_histograms_from_report_json_alone() {
    let (mut r, _) = fixture();
    let buckets = |n: u64| -> Vec<Bucket> {
        (0..n)
            .map(|i| Bucket {
                from_ms: i as f64 * 10.0,
                to_ms: (i + 1) as f64 * 10.0,
                count: i + 1,
            })
            .collect()
    };
    let p = Percentiles {
        count: 10,
        p50: 12.0,
        p90: 20.0,
        p99: 30.0,
        max: 31.0,
    };
    r.latency = Some(Latency {
        enqueue_histogram: buckets(4),
        e2e: p.clone(),
        e2e_by_channel: [("line".to_string(), p)].into(),
        e2e_histogram: buckets(6),
        e2e_from: "batch_post".into(),
    });
    // No ledger: the histograms come from report.json (what `ting-chaos report DIR` has).
    let html = render_html(&r, &[]);
    assert!(html.contains("<h3>Enqueue latency histogram</h3><div class=\"chart\"><svg"));
    assert!(html.contains("<h3>End-to-end latency histogram</h3><div class=\"chart\"><svg"));
    assert!(html.contains("enqueue latency (bucket start)"));
    assert!(html.contains("the delivery's own batch was sent"));
    assert!(
        html.contains("<td>end-to-end, line</td><td class=\"n\">10</td><td class=\"n\">12.0</td>"),
        "percentiles from report.json"
    );
    // A report written before histograms were kept says so rather than drawing nothing.
    let (old, ledger) = fixture();
    let html = render_html(&old, &ledger);
    assert!(html.contains("Not recorded: this report predates enqueue histograms."));
    assert!(
        html.contains("this report predates per-batch enqueue times, and its load was one batch")
    );
}

#[test]
fn a_restarts_sigterm_is_marked_like_the_other_actions() {
    let (mut r, ledger) = fixture();
    let ev = |s: u64, kind: EventKind| TimelineEvent {
        mono_ns: s * 1_000_000_000,
        kind,
        slot: Some(3),
        pid: Some(18597),
        provider: None,
        detail: String::new(),
    };
    r.timeline.push(ev(52, EventKind::RestartBegin));
    r.timeline.push(ev(54, EventKind::Sigstop));
    let html = render_html(&r, &ledger);
    assert!(
        html.contains("SIGTERM (restart) w3"),
        "labelled as a SIGTERM"
    );
    let chart = &html[html.find("<section id=\"timeline\">").unwrap()
        ..html.find("<details><summary>All").unwrap()];
    assert!(
        !chart.contains("restart_begin"),
        "the internal name is not a label"
    );
    assert!(html.contains("sigstop w3"));
    // Coloured like a SIGTERM (amber), not the grey of run milestones.
    let label_at = html.find(" SIGTERM (restart) w3").unwrap();
    let tag_start = html[..label_at].rfind("<text").unwrap();
    assert!(
        html[tag_start..label_at].contains("#F59E0B"),
        "{}",
        &html[tag_start..label_at]
    );
}

#[test]
fn uncertain_sends_are_counted_in_every_rendering() {
    let (mut r, ledger) = fixture();
    r.uncertain = Some(Uncertain {
        line_retry_key: 2,
        sms_adopted_by_listing: 1,
        email_unknown_resolved: 4,
        email_unknown_held: 0,
    });
    let line = "LINE 2 settled by retry key (409) · SMS 1 adopted by listing · e-mail 4 held unknown then resolved by a delivery event (0 still unknown)";
    assert!(report::summary_text(&r).contains(&format!("uncertain sends: {line}")));
    assert!(render_markdown(&r).contains(&format!("Uncertain sends: {line}.")));
    let html = render_html(&r, &ledger);
    assert!(html.contains("<h3>Uncertain sends: how they were settled</h3>"));
    for (settled_by, n) in [
        ("(already accepted)", 2),
        ("not sent again", 1),
        ("delivery event", 4),
    ] {
        let row = format!("{settled_by}</td><td class=\"n\">{n}</td>");
        assert!(html.contains(&row), "{row}");
    }
}

#[test]
fn report_cli_appends_to_the_step_summary_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["report.json", "ledger.jsonl"] {
        std::fs::copy(fixture_dir().join(f), dir.path().join(f)).unwrap();
    }
    let step = dir.path().join("step-summary.md");
    std::fs::write(&step, "the run's own summary\n").unwrap();
    let report = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ting-chaos"))
            .arg("report")
            .arg(dir.path())
            .args(extra)
            .env("GITHUB_STEP_SUMMARY", &step)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let listed = report(&[]);
    assert!(
        listed.contains("report.html") && listed.contains("summary.md"),
        "{listed}"
    );
    assert_eq!(
        std::fs::read_to_string(&step).unwrap(),
        "the run's own summary\n",
        "a re-render does not list the run a second time"
    );
    report(&["--step-summary"]);
    let step = std::fs::read_to_string(&step).unwrap();
    assert!(
        step.starts_with("the run's own summary\n## ❌ FAIL"),
        "{step}"
    );
}

/// Sets every number under `v` to `to`.
fn every_number(v: &mut serde_json::Value, to: &serde_json::Value) {
    match v {
        serde_json::Value::Number(_) => *v = to.clone(),
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| every_number(x, to)),
        serde_json::Value::Object(o) => o.values_mut().for_each(|x| every_number(x, to)),
        _ => {}
    }
}

/// A hand-edited or damaged `report.json` / `ledger.jsonl` is rendered or refused, never a
/// panic: every number of each top-level field of the report, and each field of every ledger
/// entry, set to an extreme (0, a huge float, u64::MAX) in turn. A value the format does not
/// allow is refused by `report DIR` with the reader's error (exit 2).
#[test]
fn extreme_numbers_in_a_saved_report_never_panic_the_renderers() {
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture_dir().join("report.json")).unwrap()).unwrap();
    let (_, ledger) = fixture();
    let extremes = [json!(0), json!(1e300), json!(u64::MAX)];
    let render = |r: &serde_json::Value, ledger: &[Entry]| {
        let Ok(r) = serde_json::from_value::<Report>(r.clone()) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            report::write_rendered(dir.path(), &r, ledger, None).map(|_| ())
        }));
        assert!(rendered.is_ok(), "a renderer panicked");
    };
    for to in &extremes {
        for key in report.as_object().unwrap().keys() {
            let mut r = report.clone();
            every_number(&mut r[key], to);
            render(&r, &ledger);
        }
        // The ledger as written: each line mutated, then read as `report DIR` reads it.
        let raw: Vec<serde_json::Value> =
            std::fs::read_to_string(fixture_dir().join("ledger.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        let fields = raw[0].clone();
        // Every entry's field, then one entry's (a chart sized by one absurd time once asked
        // for tens of gigabytes).
        for (field, all) in fields
            .as_object()
            .unwrap()
            .keys()
            .flat_map(|f| [(f, true), (f, false)])
        {
            let names = Interner::default();
            let mutated: Vec<Entry> = raw
                .iter()
                .enumerate()
                .filter_map(|(i, v)| {
                    let mut v = v.clone();
                    if v[field].is_number() && (all || i == 0) {
                        v[field] = to.clone();
                    }
                    let e: LedgerEntry = serde_json::from_value(v).ok()?;
                    Some(Entry::of(&e, &names, &Keep::NoHtml))
                })
                .collect();
            render(&report, &mutated);
        }
    }
}

/// `ting-chaos report DIR` on a report it cannot read is a usage error (exit 2) saying what is
/// wrong with the file; renderings it cannot write are an infrastructure failure (exit 3); a
/// ledger line that is not UTF-8 is skipped, not fatal.
#[test]
fn report_cli_names_what_is_wrong_with_a_saved_report() {
    let report = |dir: &Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ting-chaos"))
            .arg("report")
            .arg(dir)
            .env_remove("GITHUB_STEP_SUMMARY")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "{stderr}");
        (out.status.code(), stderr)
    };
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(fixture_dir().join("report.json")).unwrap();
    let file = dir.path().join("report.json");
    let (code, err) = report(dir.path());
    assert_eq!(code, Some(2));
    assert!(
        err.contains("report.json does not exist: a run folder"),
        "{err}"
    );
    std::fs::write(&file, &good[..good.len() / 3]).unwrap();
    let (code, err) = report(dir.path());
    assert_eq!(code, Some(2));
    assert!(err.contains("report.json is cut short"), "{err}");
    std::fs::write(&file, &good).unwrap();
    let mut ledger = std::fs::read(fixture_dir().join("ledger.jsonl")).unwrap();
    ledger.extend_from_slice(b"{\"seq\": \xff\xfe torn\n");
    std::fs::write(dir.path().join("ledger.jsonl"), ledger).unwrap();
    assert_eq!(report(dir.path()).0, Some(0));
    let ledger = dir.path().join("ledger.jsonl");
    std::fs::rename(&ledger, dir.path().join("kept.jsonl")).unwrap();
    std::fs::create_dir(&ledger).unwrap();
    let (code, err) = report(dir.path());
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("ledger.jsonl: Is a directory"), "{err}");
    std::fs::remove_dir(&ledger).unwrap();
    std::fs::remove_file(dir.path().join("report.html")).unwrap();
    std::fs::create_dir(dir.path().join("report.html")).unwrap();
    let (code, err) = report(dir.path());
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("report.html"), "{err}");
}
