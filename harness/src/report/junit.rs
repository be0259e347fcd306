//! `junit.xml`: the verdict as JUnit test results, so GitHub Actions and GitLab list each checker
//! as a test case and show a violated invariant as a failure with its counterexamples.
//!
//! Written with `quick-xml`'s writer, which escapes every attribute and text; this file must never
//! build XML by concatenating strings. Characters XML 1.0 cannot carry at all are replaced.

use std::io;

use quick_xml::escape::partial_escape;
use quick_xml::events::{BytesDecl, BytesText, Event};
use quick_xml::Writer;

use super::Report;
use crate::check::{Status, Verdict};

/// Renders the report as a JUnit XML document: one `<testsuite>` for the run, one `<testcase>`
/// per checker (`not_checked` → `<skipped>`, `violated` → `<failure>`), one per performance gate
/// (`gate: <what>`, a failed gate → `<failure>` with its message), and an `<error>` test case
/// named `run` when the run could not complete.
pub fn render_junit(report: &Report) -> String {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    write_doc(&mut w, report).expect("writing XML to memory cannot fail");
    String::from_utf8(w.into_inner()).expect("quick-xml writes UTF-8") + "\n"
}

/// Text content escaped for XML: only `<`, `>` and `&` need it there, which keeps the JSON of
/// counterexamples readable in the raw file.
fn text(s: &str) -> BytesText<'_> {
    BytesText::from_escaped(partial_escape(s))
}

/// Replaces characters XML 1.0 forbids even escaped (most C0 controls) with U+FFFD.
fn xml_safe(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '\t' | '\n' | '\r' => c,
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => '\u{fffd}',
            c => c,
        })
        .collect()
}

fn count(report: &Report, status: Status) -> usize {
    report.checks.iter().filter(|v| v.status == status).count()
}

/// The gates as (test case name, failure message when failed). A report written before `gates`
/// existed has only the failed ones' messages.
fn gate_cases(r: &Report) -> Vec<(String, Option<String>)> {
    if r.gates.is_empty() {
        return r
            .regressions
            .iter()
            .map(|m| (format!("gate: {m}"), Some(m.clone())))
            .collect();
    }
    r.gates
        .iter()
        .map(|g| {
            (
                format!("gate: {} {}", g.kind, g.name),
                (!g.passed).then(|| g.message.clone()),
            )
        })
        .collect()
}

fn write_doc(w: &mut Writer<Vec<u8>>, r: &Report) -> io::Result<()> {
    w.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))?;
    let errors = usize::from(r.error.is_some());
    let gates = gate_cases(r);
    let gate_failures = gates.iter().filter(|g| g.1.is_some()).count();
    let tests = (r.checks.len() + gates.len() + errors).to_string();
    let failures =
        (count(r, Status::Violated) + count(r, Status::Insufficient) + gate_failures).to_string();
    let skipped = count(r, Status::NotChecked).to_string();
    let errors = errors.to_string();
    let time = format!("{:.3}", r.duration_ms as f64 / 1000.0);
    let suite = xml_safe(&r.scenario_name);
    let totals = [
        ("tests", tests.as_str()),
        ("failures", failures.as_str()),
        ("errors", errors.as_str()),
        ("skipped", skipped.as_str()),
        ("time", time.as_str()),
    ];
    w.create_element("testsuites")
        .with_attribute(("name", "ting-chaos"))
        .with_attributes(totals)
        .write_inner_content(|w| {
            let mut suite_el = w
                .create_element("testsuite")
                .with_attribute(("name", suite.as_str()))
                .with_attributes(totals);
            let stamp = xml_safe(&r.started_at);
            if !stamp.is_empty() {
                suite_el = suite_el.with_attribute(("timestamp", stamp.as_str()));
            }
            suite_el.write_inner_content(|w| {
                properties(w, r)?;
                if let Some(e) = &r.error {
                    w.create_element("testcase")
                        .with_attributes([
                            ("name", "run"),
                            ("classname", suite.as_str()),
                            ("time", "0"),
                        ])
                        .write_inner_content(|w| {
                            let msg = xml_safe(e);
                            w.create_element("error")
                                .with_attributes([
                                    ("message", msg.as_str()),
                                    ("type", "infrastructure"),
                                ])
                                .write_text_content(text(&msg))?;
                            Ok(())
                        })?;
                }
                for v in &r.checks {
                    testcase(w, &suite, v)?;
                }
                for (name, failure) in &gates {
                    gate_case(w, &suite, name, failure.as_deref())?;
                }
                Ok(())
            })?;
            Ok(())
        })?;
    Ok(())
}

fn properties(w: &mut Writer<Vec<u8>>, r: &Report) -> io::Result<()> {
    let props = [
        ("seed", r.seed.to_string()),
        ("verdict", r.verdict.clone()),
        ("exit_code", r.exit_code.to_string()),
        ("tool_version", r.tool.version.clone()),
    ];
    w.create_element("properties").write_inner_content(|w| {
        for (k, v) in &props {
            let v = xml_safe(v);
            w.create_element("property")
                .with_attributes([("name", *k), ("value", v.as_str())])
                .write_empty()?;
        }
        Ok(())
    })?;
    Ok(())
}

/// The failure body: one counterexample per line as compact JSON, then how many there were.
fn failure_text(v: &Verdict) -> String {
    let mut lines: Vec<String> = v.counterexamples.iter().map(|c| c.to_string()).collect();
    if v.total_counterexamples > v.counterexamples.len() {
        lines.push(format!(
            "… {} counterexamples in all (see report.json)",
            v.total_counterexamples
        ));
    }
    xml_safe(&lines.join("\n"))
}

fn gate_case(
    w: &mut Writer<Vec<u8>>,
    suite: &str,
    name: &str,
    failure: Option<&str>,
) -> io::Result<()> {
    let name = xml_safe(name);
    let case = w.create_element("testcase").with_attributes([
        ("name", name.as_str()),
        ("classname", suite),
        ("time", "0"),
    ]);
    match failure {
        None => {
            case.write_empty()?;
        }
        Some(msg) => {
            let msg = xml_safe(msg);
            case.write_inner_content(|w| {
                w.create_element("failure")
                    .with_attributes([("message", msg.as_str()), ("type", "performance_gate")])
                    .write_text_content(text(&msg))?;
                Ok(())
            })?;
        }
    }
    Ok(())
}

fn testcase(w: &mut Writer<Vec<u8>>, suite: &str, v: &Verdict) -> io::Result<()> {
    let name = xml_safe(&v.checker);
    let summary = xml_safe(&v.summary);
    let case = w.create_element("testcase").with_attributes([
        ("name", name.as_str()),
        ("classname", suite),
        ("time", "0"),
    ]);
    match v.status {
        Status::Holds => {
            case.write_inner_content(|w| {
                w.create_element("system-out")
                    .write_text_content(text(&summary))?;
                Ok(())
            })?;
        }
        Status::NotChecked => {
            case.write_inner_content(|w| {
                w.create_element("skipped")
                    .with_attribute(("message", summary.as_str()))
                    .write_empty()?;
                Ok(())
            })?;
        }
        Status::Insufficient => {
            // CI must not show a checker that could not look as a pass.
            let body = format!("insufficient: {}", v.shortfalls().join("\n"));
            case.write_inner_content(|w| {
                w.create_element("failure")
                    .with_attributes([("message", summary.as_str()), ("type", "insufficient")])
                    .write_text_content(text(&body))?;
                Ok(())
            })?;
        }
        Status::Violated => {
            let body = failure_text(v);
            case.write_inner_content(|w| {
                w.create_element("failure")
                    .with_attributes([("message", summary.as_str()), ("type", name.as_str())])
                    .write_text_content(text(&body))?;
                Ok(())
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::xml_safe;

    #[test]
    fn control_characters_are_replaced() {
        for (input, want) in [
            ("a\u{0}b", "a\u{fffd}b"),
            ("tab\tnl\n", "tab\tnl\n"),
            ("ü<", "ü<"),
        ] {
            assert_eq!(xml_safe(input), want);
        }
    }
}
