//! Small HTML building blocks for `report.html`: escaping, JSON values as tables, counterexamples.
//!
//! Every string that reaches the page from a report goes through [`esc`] here — recipient names
//! and scenario names contain HTML on purpose. Nothing in this file may write a report string into
//! the page any other way.

use std::borrow::Cow;
use std::fmt::Write;

use serde_json::{Map, Value};

/// Escapes text for an element body or a quoted attribute value.
pub(crate) fn esc(s: &str) -> Cow<'_, str> {
    html_escape::encode_safe(s)
}

/// A scalar as page text; hashes and ids shortened, with the whole value in the tooltip.
fn scalar(key: &str, v: &Value) -> String {
    match v {
        Value::Null => "<span class=\"note\">—</span>".into(),
        Value::String(s) if key.ends_with("hash") && s.len() > 16 => {
            let short: String = s.chars().take(12).collect();
            format!("<code title=\"{}\">{}…</code>", esc(s), esc(&short))
        }
        Value::String(s) => esc(s).into_owned(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => esc(&other.to_string()).into_owned(),
    }
}

fn is_number(v: &Value) -> bool {
    v.is_number()
}

/// Any JSON value as HTML: objects as key/value tables, arrays of objects as tables with one
/// column per key, arrays of scalars as a list.
pub(crate) fn value(key: &str, v: &Value) -> String {
    match v {
        Value::Object(m) => kv_table(m),
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_object) => {
            objects_table(items)
        }
        Value::Array(items) => items
            .iter()
            .map(|i| value(key, i))
            .collect::<Vec<_>>()
            .join(", "),
        _ => scalar(key, v),
    }
}

/// An object as a two-column table, or as a one-row-per-key grid when every value is an object
/// of scalars (e.g. `by_channel`).
pub(crate) fn kv_table(m: &Map<String, Value>) -> String {
    if m.is_empty() {
        return "<span class=\"note\">—</span>".into();
    }
    let nested = m.values().all(|v| {
        v.as_object()
            .is_some_and(|o| o.values().all(|x| !x.is_object() && !x.is_array()))
    });
    if nested {
        let rows: Vec<Value> = m
            .iter()
            .map(|(k, v)| {
                let mut row = Map::new();
                row.insert(String::new(), Value::String(k.clone()));
                row.extend(
                    v.as_object()
                        .into_iter()
                        .flatten()
                        .map(|(a, b)| (a.clone(), b.clone())),
                );
                Value::Object(row)
            })
            .collect();
        return objects_table(&rows);
    }
    let mut out = String::from("<table class=\"kv\">");
    for (k, v) in m {
        let class = if is_number(v) { " class=\"n\"" } else { "" };
        let _ = write!(
            out,
            "<tr><th>{}</th><td{class}>{}</td></tr>",
            esc(k),
            value(k, v)
        );
    }
    out.push_str("</table>");
    out
}

/// Objects as rows of a table; columns are the union of their keys in first-seen order.
pub(crate) fn objects_table(items: &[Value]) -> String {
    let mut cols: Vec<&str> = Vec::new();
    for item in items {
        for k in item.as_object().into_iter().flat_map(|o| o.keys()) {
            if !cols.contains(&k.as_str()) {
                cols.push(k);
            }
        }
    }
    let mut out = String::from("<table><tr>");
    for c in &cols {
        let _ = write!(out, "<th>{}</th>", esc(c));
    }
    out.push_str("</tr>");
    for item in items {
        out.push_str("<tr>");
        for c in &cols {
            let v = item.get(*c).unwrap_or(&Value::Null);
            let class = if is_number(v) { " class=\"n\"" } else { "" };
            let _ = write!(out, "<td{class}>{}</td>", value(c, v));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

/// The fields a counterexample's one-line summary is made of, in order.
const HEADLINE: [&str; 4] = ["recipient", "channel", "address", "delivery"];
/// Fields tried, in order, for the counterexample's explanation.
const REASON: [&str; 4] = ["reason", "detail", "message", "expected"];

/// One counterexample: a one-line summary (rule, delivery, reason) that opens onto all its fields.
pub(crate) fn counterexample(cx: &Value) -> String {
    let Some(obj) = cx.as_object() else {
        return format!("<div class=\"cx\">{}</div>", value("", cx));
    };
    let text = |k: &str| {
        obj.get(k).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    };
    let mut head = String::new();
    if let Some(rule) = text("rule") {
        let _ = write!(head, "<span class=\"rule\">{}</span>", esc(&rule));
    }
    let who: Vec<String> = HEADLINE.iter().filter_map(|k| text(k)).collect();
    let _ = write!(head, "<b>{}</b>", esc(&who.join(" · ")));
    if let Some(reason) = REASON.iter().find_map(|k| text(k)) {
        let _ = write!(head, " — {}", esc(&reason));
    }
    let rest: Map<String, Value> = obj
        .iter()
        .filter(|(k, _)| k.as_str() != "rule")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    format!(
        "<details class=\"cx\"><summary>{head}</summary>{}</details>",
        kv_table(&rest)
    )
}

/// A table from a header and rows of already-escaped cells; cells starting with a digit or a
/// minus sign are right-aligned.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::from("<table><tr>");
    for h in header {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let numeric = cell.starts_with(|c: char| c.is_ascii_digit() || c == '-');
            let class = if numeric { " class=\"n\"" } else { "" };
            let _ = write!(out, "<td{class}>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_report_string_is_escaped() {
        let evil = "<script>alert(1)</script>";
        let cases = [
            counterexample(&json!({"rule": evil, "recipient": evil, "reason": evil})),
            counterexample(&json!({"rule": "r", "sends": [{evil: evil}]})),
            counterexample(&json!(evil)),
            kv_table(
                json!({"by_channel": {evil: {evil: 1}}})
                    .as_object()
                    .unwrap(),
            ),
            value("payload_hash", &json!(format!("{evil}{evil}"))),
        ];
        for html in cases {
            assert!(!html.contains("<script"), "{html}");
            assert!(html.contains("&lt;script&gt;"), "{html}");
        }
    }

    #[test]
    fn counterexample_headline_names_the_delivery() {
        let html = counterexample(&json!({
            "rule": "open", "recipient": "r1", "channel": "sms", "address": "+1555",
            "reason": "never answered", "sends": [{"attempt": 1, "pid": 42}]
        }));
        assert!(
            html.contains(
                "<span class=\"rule\">open</span><b>r1 · sms · +1555</b> — never answered"
            ),
            "{html}"
        );
        assert!(html.contains("<th>pid</th>"), "{html}");
    }
}
