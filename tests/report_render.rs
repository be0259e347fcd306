//! The renderings of a real run's report (`tests/fixtures/report-sample/`: `restart-midway` against
//! a slow stack, four invariants violated, ledger trimmed to a twentieth of the recipients):
//! HTML, JUnit, Markdown, the files written beside the report, and the metrics.

use std::path::{Path, PathBuf};

use serde_json::json;
use ting_chaos::check::Status;
use ting_chaos::report::{
    self, html::render_html, junit::render_junit, markdown::render_markdown, Report,
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

fn fixture() -> (Report, Vec<mock_providers::ledger::LedgerEntry>) {
    let data = std::fs::read(fixture_dir().join("report.json")).unwrap();
    let report: Report = serde_json::from_slice(&data).unwrap();
    let (ledger, skipped) = report::read_ledger(&fixture_dir().join("ledger.jsonl")).unwrap();
    assert_eq!(skipped, 0);
    (report, ledger)
}

/// The fixture with HTML where people put text: the scenario name and a counterexample.
fn hostile() -> (Report, Vec<mock_providers::ledger::LedgerEntry>) {
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
    assert_eq!(m.enqueue_p99_ms, r.load.enqueue_latency_ms.p99);
    assert!(
        m.deliveries_per_s > 1.0 && m.deliveries_per_s < 10.0,
        "{m:?}: a twentieth of a ~60/s run"
    );
    assert!(
        0.0 < m.e2e_p50_ms && m.e2e_p50_ms <= m.e2e_p99_ms && m.e2e_p99_ms < 70_000.0,
        "{m:?}"
    );
}

#[test]
fn write_all_and_rerender_write_every_file_atomically() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["report.json", "ledger.jsonl"] {
        std::fs::copy(fixture_dir().join(f), dir.path().join(f)).unwrap();
    }
    let written = report::rerender(dir.path()).unwrap();
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
