//! `summary.md`: a short Markdown summary of a run for `$GITHUB_STEP_SUMMARY` and merge requests —
//! the verdict, a table of checkers, the first counterexamples. Details stay in `report.html`.
//!
//! GitHub renders HTML inside Markdown, so every string from the report is escaped for both
//! (see [`md`]); nothing may be written into the summary unescaped.

use std::fmt::Write;

use super::chaos_steps::ChaosOutcome;
use super::{Metrics, Report};
use crate::check::Status;

/// Counterexamples shown per violated checker.
const SHOWN: usize = 3;

/// Escapes report text for a Markdown table cell or paragraph: HTML-significant characters become
/// entities, Markdown punctuation is backslash-escaped, and line breaks become spaces.
fn md(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\n' | '\r' => out.push(' '),
            '|' | '\\' | '`' | '*' | '_' | '[' | ']' | '#' | '~' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// Milliseconds as people read them: `694.3 ms`, `36.0 s`; `—` without data.
fn duration(ms: Option<f64>) -> String {
    let Some(ms) = ms else {
        return "—".into();
    };
    if ms >= 10_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        format!("{ms:.1} ms")
    }
}

/// Renders the summary. Short by design: a CI page shows many of these.
pub fn render_markdown(report: &Report) -> String {
    render_with(report, &report.metrics)
}

/// [`render_markdown`] with metrics computed by the caller (a re-render of a report written
/// before `metrics` existed computes them from the ledger).
pub(crate) fn render_with(report: &Report, m: &Metrics) -> String {
    let mut out = String::new();
    let icon = match report.verdict.as_str() {
        "pass" => "✅",
        "fail" => "❌",
        _ => "⚠️",
    };
    let _ = writeln!(
        out,
        "## {icon} {} — {} (seed {})\n",
        report.verdict.to_uppercase(),
        md(&report.scenario_name),
        report.seed
    );
    let _ = write!(
        out,
        "{:.1} s · exit code {} · {} deliveries expected",
        report.duration_ms as f64 / 1000.0,
        report.exit_code,
        report.load.expected_deliveries,
    );
    if !m.is_empty() {
        let _ = write!(
            out,
            " · {:.1} deliveries/s · enqueue p99 {} · end-to-end p50 {}, p99 {}",
            m.deliveries_per_s.unwrap_or(0.0),
            duration(m.enqueue_p99_ms),
            duration(m.e2e_p50_ms),
            duration(m.e2e_p99_ms),
        );
    }
    out.push_str("\n\n");
    if let Some(note) = super::attribution_note(report) {
        let _ = writeln!(out, "Senders: {}.\n", md(&note));
    }
    if let Some(e) = &report.error {
        let _ = writeln!(out, "> **The run could not complete:** {}\n", md(e));
    }
    for msg in &report.regressions {
        let _ = writeln!(out, "> ❌ **Performance gate failed:** {}\n", md(msg));
    }
    if let Some(u) = report.uncertain.as_ref().filter(|u| !u.is_empty()) {
        let _ = writeln!(out, "Uncertain sends: {}.\n", md(&u.line()));
    }
    if let Some(line) = report.machine.as_ref().and_then(|m| m.line()) {
        let _ = writeln!(out, "Machine: {}.\n", md(&line));
    }
    if let Some(warning) = report.harness.as_ref().and_then(|h| h.warning()) {
        let _ = writeln!(out, "Warning: {}.\n", md(&warning));
    }
    out.push_str("| checker | status | summary |\n|---|---|---|\n");
    for v in &report.checks {
        let status = match v.status {
            Status::Holds => "✅ holds",
            Status::Insufficient => "⚠️ **insufficient**",
            Status::Violated => "❌ **violated**",
            Status::NotChecked => "➖ not checked",
        };
        let _ = writeln!(
            out,
            "| {} | {status} | {} |",
            md(&v.checker),
            md(&v.summary)
        );
    }
    if !report.gates.is_empty() {
        out.push_str("\n| performance gate | result | threshold / baseline | this run |\n|---|---|---|---|\n");
        for g in &report.gates {
            let result = if g.insufficient {
                "⚠️ **no data**"
            } else if g.passed {
                "✅ passed"
            } else {
                "❌ **failed**"
            };
            let _ = writeln!(
                out,
                "| {} {} | {result} | {:.1} | {} |",
                md(&g.kind),
                md(&g.name),
                g.limit,
                g.value.map_or("no data".into(), |v| format!("{v:.1}"))
            );
        }
    }
    let violated: Vec<_> = report.violated().collect();
    if !violated.is_empty() {
        out.push_str("\n### Counterexamples\n");
        for v in violated {
            let _ = writeln!(
                out,
                "\n**{}** ({} in all{})\n",
                md(&v.checker),
                v.total_counterexamples.max(v.counterexamples.len()),
                md(&super::by_rule(v))
            );
            for cx in v.counterexamples.iter().take(SHOWN) {
                let _ = writeln!(out, "- {}", md(&one_line(cx)));
            }
        }
    }
    if !report.chaos_steps.is_empty() {
        out.push_str("\n| chaos step | outcome | what was seen / why not |\n|---|---|---|\n");
        for s in &report.chaos_steps {
            let outcome = match (s.outcome, s.optional) {
                (ChaosOutcome::Applied, _) => "✅ applied".to_string(),
                (o, true) => format!("➖ {} (optional)", o.as_str()),
                (o, false) => format!("⚠️ **{}**", o.as_str()),
            };
            let seen = if s.outcome == ChaosOutcome::Applied {
                s.observed.join("; ")
            } else {
                s.reason.clone()
            };
            let _ = writeln!(out, "| {} | {outcome} | {} |", md(&s.name()), md(&seen));
        }
    }
    out.push_str("\nDetails: `report.html` and `report.json` in the run's report folder.\n");
    out
}

/// A counterexample in one line: `rule` first, then the delivery, then the other scalar fields.
fn one_line(cx: &serde_json::Value) -> String {
    let Some(obj) = cx.as_object() else {
        return cx.to_string();
    };
    let mut parts = Vec::new();
    if let Some(rule) = obj.get("rule").and_then(|r| r.as_str()) {
        parts.push(format!("{rule}:"));
    }
    // The delivery and the reason first, then the rest in key order.
    let first = ["recipient", "channel", "address", "delivery", "reason"];
    let fields = first
        .iter()
        .filter_map(|k| obj.get_key_value(*k))
        .chain(obj.iter().filter(|(k, _)| !first.contains(&k.as_str())));
    for (k, v) in fields.filter(|(k, _)| k.as_str() != "rule") {
        let text = match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(a) => format!("[{} items]", a.len()),
            serde_json::Value::Object(_) => "{…}".into(),
            other => other.to_string(),
        };
        parts.push(format!("{k}={text}"));
    }
    let line = parts.join(" ");
    if line.chars().count() > 300 {
        line.chars().take(300).collect::<String>() + "…"
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::md;

    #[test]
    fn markdown_and_html_are_inert() {
        for (input, want) in [
            ("<script>x</script>", "&lt;script&gt;x&lt;/script&gt;"),
            ("a|b", "a\\|b"),
            ("line\nbreak", "line break"),
            ("[link](http://x)", "\\[link\\](http://x)"),
            ("r_1 *x*", "r\\_1 \\*x\\*"),
        ] {
            assert_eq!(md(input), want, "{input}");
        }
    }
}
