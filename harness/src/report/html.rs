//! `report.html`: one self-contained page a person reads to understand a run in seconds — the
//! verdict first, then each checker with its counterexamples, then the charts that explain them.
//!
//! The page must work offline and stay inert: inline CSS and inline SVG only, no scripts, no
//! external fonts or images, and every string from the report escaped (see `html_parts`).
//!
//! One file on purpose (about 600 lines): one function per section of the page, in page order,
//! so the page reads top to bottom here; the shared pieces live in `html_parts` and `charts`.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::check::Entry;
use serde_json::Value;

use super::charts::{self, Marker};
use super::html_parts::{counterexample, esc, kv_table, table};
use super::stats::{self, Metrics};
use super::Report;
use crate::check::{EventKind, Status, Verdict};

const CSS: &str = include_str!("report.css");

/// Timeline events that are bookkeeping rather than something worth a line on the chart.
const QUIET_EVENTS: [EventKind; 3] = [EventKind::Spawn, EventKind::ApiReady, EventKind::Exit];

/// Renders the whole page. `ledger` may be empty (the charts then say so).
pub fn render_html(report: &Report, ledger: &[Entry]) -> String {
    let metrics = if ledger.is_empty() {
        report.metrics.clone()
    } else {
        stats::metrics(report, ledger)
    };
    let mut page = String::with_capacity(256 * 1024);
    let verdict = report.verdict.to_uppercase();
    let _ = write!(
        page,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · {} · ting-chaos</title><style>{CSS}</style></head><body>",
        esc(&verdict),
        esc(&report.scenario_name)
    );
    header(&mut page, report);
    page.push_str("<main>");
    gates(&mut page, report);
    cards(&mut page, report, &metrics, ledger);
    checks(&mut page, &report.checks);
    timeline(&mut page, report, ledger);
    latency(&mut page, report, ledger);
    outcomes(&mut page, report, ledger);
    workers(&mut page, report);
    page.push_str("</main>");
    let _ = writeln!(
        page,
        "<footer>{} {} · database: {} {} · files: {}</footer></body></html>",
        esc(&report.tool.name),
        esc(&report.tool.version),
        esc(&report.database.kind),
        esc(report.database.server_version.as_deref().unwrap_or("")),
        esc(&report
            .files
            .values()
            .cloned()
            .collect::<Vec<_>>()
            .join(", "))
    );
    page
}

fn header(page: &mut String, r: &Report) {
    let class = match r.verdict.as_str() {
        "pass" => "pass",
        "fail" => "fail",
        "inconclusive" => "inconclusive",
        _ => "error",
    };
    let violated: Vec<&str> = r.violated().map(|v| v.checker.as_str()).collect();
    let short: Vec<&str> = r
        .checks
        .iter()
        .filter(|v| v.status == Status::Insufficient)
        .map(|v| v.checker.as_str())
        .chain(
            r.gates
                .iter()
                .filter(|g| g.insufficient)
                .map(|g| g.name.as_str()),
        )
        .collect();
    let line = if violated.is_empty() && !short.is_empty() {
        format!(
            "none violated, but too little was judged to call it a pass: {}",
            short.join(", ")
        )
    } else if violated.is_empty() {
        let held = r
            .checks
            .iter()
            .filter(|v| v.status == Status::Holds)
            .count();
        let mut line = format!(
            "{held} of {} invariants hold, none violated",
            r.checks.len()
        );
        if let Some(gate) = super::gate_failure_line(r) {
            line.push_str("; ");
            line.push_str(&gate);
        }
        line
    } else {
        format!(
            "{} of {} invariants violated: {}",
            violated.len(),
            r.checks.len(),
            violated.join(", ")
        )
    };
    let _ = write!(
        page,
        "<header class=\"verdict {class}\"><div class=\"big\">{}</div><div><h1>{}</h1>\
         <p>seed {} · started {} · {:.1} s · exit code {}</p><p>{}</p></div></header>",
        esc(&r.verdict.to_uppercase()),
        esc(&r.scenario_name),
        r.seed,
        esc(if r.started_at.is_empty() {
            "—"
        } else {
            &r.started_at
        }),
        r.duration_ms as f64 / 1000.0,
        r.exit_code,
        esc(&line)
    );
}

/// Every performance gate, right under the verdict: a failed one is why a run whose invariants
/// all hold still fails.
fn gates(page: &mut String, r: &Report) {
    if r.gates.is_empty() && r.regressions.is_empty() {
        return;
    }
    page.push_str("<section id=\"gates\"><h2>Performance gates</h2>");
    for msg in &r.regressions {
        let _ = write!(
            page,
            "<div class=\"error-box\"><b>Gate failed:</b> {}</div>",
            esc(msg)
        );
    }
    if !r.gates.is_empty() {
        let rows: Vec<Vec<String>> = r
            .gates
            .iter()
            .map(|g| {
                let result = if g.insufficient {
                    "<span class=\"pill insufficient\">NO DATA</span>".to_string()
                } else if g.passed {
                    "<span class=\"pill holds\">PASSED</span>".to_string()
                } else {
                    "<span class=\"pill violated\">FAILED</span>".to_string()
                };
                vec![
                    result,
                    esc(&g.kind).into_owned(),
                    esc(&g.name).into_owned(),
                    format!("{:.1}", g.limit),
                    g.value.map_or("no data".into(), |v| format!("{v:.1}")),
                ]
            })
            .collect();
        page.push_str(&table(
            &["result", "gate", "what", "threshold / baseline", "this run"],
            &rows,
        ));
        page.push_str(
            "<p class=\"note\">Latencies in milliseconds, throughput in deliveries per second.</p>",
        );
    }
    page.push_str("</section>");
}

fn ms(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} s", v / 1000.0)
    } else {
        format!("{v:.1} ms")
    }
}

fn cards(page: &mut String, r: &Report, m: &Metrics, ledger: &[Entry]) {
    if let Some(e) = &r.error {
        let _ = write!(page, "<section><div class=\"error-box\"><b>The run could not complete:</b> {}</div></section>", esc(e));
    }
    // Saturating: a hand-edited report.json may hold any count.
    let accepted: u64 = r
        .ledger_summary
        .values()
        .filter_map(|o| o.get("accepted"))
        .fold(0, |n, a| n.saturating_add(*a));
    let faults = ledger.iter().filter(|e| e.fault().is_some()).count();
    let cards = [
        (
            "deliveries expected",
            r.load.expected_deliveries.to_string(),
        ),
        ("accepted sends", accepted.to_string()),
        (
            "deliveries / s",
            m.deliveries_per_s.map_or("—".into(), |v| format!("{v:.1}")),
        ),
        ("enqueue p99", m.enqueue_p99_ms.map_or("—".into(), ms)),
        ("end-to-end p50", m.e2e_p50_ms.map_or("—".into(), ms)),
        ("end-to-end p99", m.e2e_p99_ms.map_or("—".into(), ms)),
        ("faults injected", faults.to_string()),
        ("callbacks sent", r.callbacks_sent.to_string()),
    ];
    page.push_str("<section class=\"cards\">");
    for (k, v) in cards {
        let _ = write!(
            page,
            "<div class=\"card\"><div class=\"v\">{}</div><div class=\"k\">{}</div></div>",
            esc(&v),
            esc(k)
        );
    }
    page.push_str("</section>");
}

fn checks(page: &mut String, verdicts: &[Verdict]) {
    page.push_str("<section id=\"checks\"><h2>Checkers</h2>");
    if verdicts.is_empty() {
        page.push_str("<p class=\"note\">No checker ran.</p>");
    }
    for v in verdicts {
        let (class, label) = match v.status {
            Status::Holds => ("holds", "HOLDS"),
            Status::Insufficient => ("insufficient", "INSUFFICIENT"),
            Status::Violated => ("violated", "VIOLATED"),
            Status::NotChecked => ("not_checked", "NOT CHECKED"),
        };
        let open = if matches!(v.status, Status::Violated | Status::Insufficient) {
            " open"
        } else {
            ""
        };
        let _ = write!(
            page,
            "<details class=\"check {class}\"{open}><summary><span class=\"pill {class}\">{label}</span>\
             <span class=\"checker\">{}</span>{}</summary><div class=\"body\">",
            esc(&v.checker),
            esc(&v.summary)
        );
        if !v.counterexamples.is_empty() {
            let _ = write!(
                page,
                "<h3>Counterexamples ({} shown of {}{})</h3>",
                v.counterexamples.len(),
                v.total_counterexamples.max(v.counterexamples.len()),
                esc(&super::by_rule(v))
            );
            for cx in &v.counterexamples {
                page.push_str(&counterexample(cx));
            }
        }
        if !v.figures.is_empty() {
            let _ = write!(
                page,
                "<details class=\"figures\"><summary>Figures</summary>{}</details>",
                kv_table(&v.figures)
            );
        }
        page.push_str("</div></details>");
    }
    page.push_str("</section>");
}

fn chart_or_note(page: &mut String, svg: Result<String, String>) {
    match svg {
        Ok(svg) => {
            let _ = write!(page, "<div class=\"chart\">{svg}</div>");
        }
        Err(e) => {
            let _ = write!(page, "<p class=\"note\">{}</p>", esc(&e));
        }
    }
}

fn secs(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e9)
}

fn timeline(page: &mut String, r: &Report, ledger: &[Entry]) {
    page.push_str("<section id=\"timeline\"><h2>Timeline</h2>");
    let workers: BTreeMap<u32, &str> = r
        .processes
        .iter()
        .filter_map(|p| Some((p.pid, p.worker_id.as_deref()?)))
        .collect();
    let markers: Vec<Marker> = r
        .timeline
        .iter()
        .filter(|e| !QUIET_EVENTS.contains(&e.kind))
        .map(|e| {
            let who = e
                .pid
                .and_then(|p| workers.get(&p))
                .map(|w| format!(" {w}"))
                .unwrap_or_default();
            Marker {
                at_s: e.mono_ns as f64 / 1e9,
                label: format!("{}{who}", e.kind.label()),
                kind: e.kind,
            }
        })
        .collect();
    if ledger.is_empty() {
        page.push_str("<p class=\"note\">No ledger beside this report: no send rates to draw.</p>");
    } else {
        page.push_str("<p class=\"note\">Accepted sends per second per channel; red bars are sends the providers failed on purpose; dashed lines are chaos actions and run milestones.</p>");
        chart_or_note(page, charts::timeline(&stats::per_second(ledger), &markers));
    }
    chaos_steps(page, r);
    let rows: Vec<Vec<String>> = r
        .timeline
        .iter()
        .map(|e| {
            vec![
                secs(e.mono_ns),
                esc(e.kind.label()).into_owned(),
                e.slot.map(|s| s.to_string()).unwrap_or_default(),
                e.pid.map(|p| p.to_string()).unwrap_or_default(),
                esc(&e.detail).into_owned(),
            ]
        })
        .collect();
    let _ = write!(
        page,
        "<details><summary>All {} timeline events</summary>{}</details></section>",
        rows.len(),
        table(&["at (s)", "event", "slot", "pid", "detail"], &rows)
    );
}

fn pct_row(name: &str, p: &super::Percentiles) -> Vec<String> {
    vec![
        esc(name).into_owned(),
        p.count.to_string(),
        format!("{:.1}", p.p50),
        format!("{:.1}", p.p90),
        format!("{:.1}", p.p99),
        format!("{:.1}", p.max),
    ]
}

/// A histogram's bars labelled by where each bucket starts.
fn histogram_bars(buckets: &[stats::Bucket]) -> Vec<(String, u64)> {
    // Seconds once the range reaches two of them: `2.5s` reads better than `2500ms`.
    let seconds = buckets.last().is_some_and(|b| b.to_ms >= 2000.0);
    buckets
        .iter()
        .map(|b| {
            let label = if seconds {
                format!("{}s", b.from_ms.round() / 1000.0)
            } else {
                format!("{}ms", b.from_ms)
            };
            (label, b.count)
        })
        .collect()
}

fn latency(page: &mut String, r: &Report, ledger: &[Entry]) {
    page.push_str("<section id=\"latency\"><h2>Latency</h2>");
    let mut rows = vec![pct_row(
        "enqueue (POST /v1/batches)",
        &r.load.enqueue_latency_ms,
    )];
    let lat = stats::latency_of(r, ledger);
    if let Some(l) = lat.as_deref().filter(|l| l.e2e.count > 0) {
        rows.push(pct_row("end-to-end, all channels", &l.e2e));
        for (ch, p) in &l.e2e_by_channel {
            rows.push(pct_row(&format!("end-to-end, {ch}"), p));
        }
    }
    page.push_str(&table(
        &["latency (ms)", "count", "p50", "p90", "p99", "max"],
        &rows,
    ));
    match lat.as_deref().map(|l| l.e2e_from.as_str()) {
        Some("load_start") => page.push_str("<p class=\"note\">End-to-end: from the start of the load (<code>load_start</code>; this report predates per-batch enqueue times, and its load was one batch) to the provider accepting the delivery's first copy.</p>"),
        Some(_) => page.push_str("<p class=\"note\">End-to-end: from the moment the <code>POST /v1/batches</code> of the delivery's own batch was sent to the provider accepting the delivery's first copy.</p>"),
        None => page.push_str("<p class=\"note\">End-to-end latency is not available: this report predates per-batch enqueue times and its load was more than one batch.</p>"),
    }
    page.push_str("<div class=\"row\"><div><h3>Enqueue latency histogram</h3>");
    match lat.as_deref().filter(|l| !l.enqueue_histogram.is_empty()) {
        Some(l) => chart_or_note(
            page,
            charts::bars(
                &histogram_bars(&l.enqueue_histogram),
                charts::channel_color("sms"),
                "enqueue latency (bucket start)",
                "batches",
                540,
            ),
        ),
        None => page.push_str(
            "<p class=\"note\">Not recorded: this report predates enqueue histograms.</p>",
        ),
    }
    page.push_str("</div><div><h3>End-to-end latency histogram</h3>");
    match lat.as_deref().filter(|l| !l.e2e_histogram.is_empty()) {
        Some(l) => chart_or_note(
            page,
            charts::bars(
                &histogram_bars(&l.e2e_histogram),
                charts::channel_color("email"),
                "end-to-end latency (bucket start)",
                "deliveries",
                540,
            ),
        ),
        None => page.push_str("<p class=\"note\">No delivery was accepted.</p>"),
    }
    page.push_str("</div></div></section>");
}

fn outcomes(page: &mut String, r: &Report, ledger: &[Entry]) {
    page.push_str("<section id=\"outcomes\"><h2>Outcomes</h2><div class=\"row\"><div>");
    page.push_str("<h3>Deliveries per channel (no_loss)</h3>");
    let by_channel = r
        .checks
        .iter()
        .find(|v| v.checker == "no_loss")
        .and_then(|v| v.figures.get("by_channel"))
        .and_then(Value::as_object);
    match by_channel {
        Some(m) => page.push_str(&kv_table(m)),
        None => page.push_str("<p class=\"note\">no_loss did not report per-channel outcomes.</p>"),
    }
    if let Some(u) = &r.uncertain {
        page.push_str("<h3>Uncertain sends: how they were settled</h3>");
        let rows = vec![
            vec![
                "LINE".to_string(),
                "resent with the same retry key; the provider answered 409 (already accepted)"
                    .into(),
                u.line_retry_key.to_string(),
            ],
            vec![
                "SMS".to_string(),
                "found by listing the provider's messages and adopted, not sent again".into(),
                u.sms_adopted_by_listing.to_string(),
            ],
            vec![
                "e-mail".to_string(),
                "held as unknown, then resolved by the provider's delivery event".into(),
                u.email_unknown_resolved.to_string(),
            ],
            vec![
                "e-mail".to_string(),
                "still held as unknown at the end".into(),
                u.email_unknown_held.to_string(),
            ],
        ];
        page.push_str(&table(&["channel", "settled by", "deliveries"], &rows));
    }
    page.push_str("<h3>Send attempts by provider answer</h3>");
    let summary: serde_json::Map<String, Value> = r
        .ledger_summary
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::to_value(v).unwrap_or_default()))
        .collect();
    page.push_str(&kv_table(&summary));
    page.push_str("</div><div><h3>Attempts per delivery</h3>");
    // Every count from 1 to the largest seen (at least 3), so a run without retries shows so.
    let per = stats::attempts_per_delivery(ledger);
    let most = per.keys().max().copied().unwrap_or(0).max(3);
    let attempts: Vec<(String, u64)> = if per.is_empty() {
        Vec::new()
    } else {
        (1..=most)
            .map(|n| (n.to_string(), per.get(&n).copied().unwrap_or(0)))
            .collect()
    };
    if attempts.is_empty() {
        page.push_str("<p class=\"note\">No ledger beside this report.</p>");
    } else {
        chart_or_note(
            page,
            charts::bars(
                &attempts,
                charts::channel_color("line"),
                "send attempts",
                "deliveries",
                540,
            ),
        );
    }
    page.push_str("</div></div></section>");
}

fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

fn workers(page: &mut String, r: &Report) {
    page.push_str("<section id=\"workers\"><h2>Processes</h2>");
    let name = |pid: u32| {
        r.processes
            .iter()
            .find(|p| p.pid == pid)
            .map(|p| p.worker_id.clone().unwrap_or_else(|| p.role.to_string()))
            .unwrap_or_else(|| format!("pid {pid}"))
    };
    if r.sends_by_pid.is_empty() {
        page.push_str(
            "<p class=\"note\">Send attempts per process were not recorded in this report.</p>",
        );
    } else {
        page.push_str("<h3>Send attempts per worker</h3>");
        if let Some(n) = r.sends_unattributed.filter(|n| *n > 0) {
            let gone = r.sends_sender_gone.unwrap_or(0);
            let _ = write!(
                page,
                "<p class=\"note\">{n} send attempts could not be attributed to a process and \
                 are not counted here ({gone} of them: the sender closed its connection, or was \
                 killed, before the provider accepted it).</p>"
            );
        }
        let bars: Vec<(String, u64)> = r
            .sends_by_pid
            .iter()
            .map(|(pid, n)| (name(*pid), *n))
            .collect();
        chart_or_note(
            page,
            charts::bars(
                &bars,
                charts::channel_color("sms"),
                "worker",
                "send attempts",
                1100,
            ),
        );
    }
    let rows: Vec<Vec<String>> = r
        .processes
        .iter()
        .map(|p| {
            let ended = match (p.exit_code, p.signal) {
                (_, Some(sig)) => signal_name(sig),
                (Some(code), None) => format!("exit {code}"),
                (None, None) => "running".into(),
            };
            vec![
                esc(p.role.as_str()).into_owned(),
                esc(p.worker_id.as_deref().unwrap_or("")).into_owned(),
                p.pid.to_string(),
                secs(p.started_ns),
                p.exited_ns.map(secs).unwrap_or_default(),
                esc(&ended).into_owned(),
                p.sigterm_ns.map(secs).unwrap_or_default(),
                if p.killed_after_grace {
                    "<b>yes</b>".into()
                } else {
                    String::new()
                },
                r.sends_by_pid
                    .get(&p.pid)
                    .map(|n| n.to_string())
                    .unwrap_or_default(),
                format!("<a href=\"logs/{0}\">{0}</a>", esc(&p.log)),
            ]
        })
        .collect();
    page.push_str(&table(
        &[
            "role",
            "worker",
            "pid",
            "started (s)",
            "exited (s)",
            "ended by",
            "SIGTERM at (s)",
            "killed after grace",
            "sends",
            "log",
        ],
        &rows,
    ));
    page.push_str("</section>");
}

/// Every chaos step with its outcome and what was seen; a box above it names the required steps
/// that did not take effect (they keep the run from passing).
fn chaos_steps(page: &mut String, r: &Report) {
    let blocking = super::chaos_steps::not_applied(&r.chaos_steps);
    if !blocking.is_empty() {
        let items: Vec<String> = blocking.iter().map(|b| esc(b).into_owned()).collect();
        let _ = write!(
            page,
            "<div class=\"warn-box\">Chaos steps that did not take effect: {}</div>",
            items.join("; ")
        );
    }
    if r.chaos_steps.is_empty() {
        return;
    }
    let rows: Vec<Vec<String>> = r
        .chaos_steps
        .iter()
        .map(|s| {
            let outcome = if s.optional {
                format!("{} (optional)", s.outcome.as_str())
            } else {
                s.outcome.as_str().to_string()
            };
            vec![
                esc(&s.name()).into_owned(),
                s.fired_ns.map(secs).unwrap_or_default(),
                outcome,
                esc(&s.reason).into_owned(),
                esc(&s.observed.join("; ")).into_owned(),
            ]
        })
        .collect();
    page.push_str(&table(
        &["chaos step", "fired at (s)", "outcome", "why", "observed"],
        &rows,
    ));
}
