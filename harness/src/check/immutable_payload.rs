//! `immutable_payload`: a retry resends the same message, and recipient data arrives escaped.
//!
//! Two rules. **payload_changed**: every send attempt of one delivery carries the same
//! `payload_hash` (compared by its first 64 bits, [`super::PayloadHash`]; a stack that re-renders on retry, after a template edit, sends a different
//! message than the first attempt). **unescaped_html** / **escaped_name_missing**: for e-mail
//! to a recipient whose name contains HTML-special characters (`<`, `>`, `&`, `"`), the HTML part
//! of an accepted send must not contain the raw name, and decoding its character references once
//! must give the name back (so any correct escaping passes — Mustache implementations differ on
//! `'`, `=`, `/` and `` ` `` — while a double-escaped name does not). The second half is skipped
//! when the template's HTML does not mention `name` at all. Judged: deliveries with a hashed
//! attempt (`payload_changed`, needs one); accepted e-mails to HTML-special names
//! (`unescaped_html`, needs one when there are such e-mails, each with its HTML part). Must never
//! look at the stack's own `payload_sha256`: the provider's hash of what arrived is the truth.

use std::collections::BTreeMap;

use mock_providers::ledger::Outcome;
use serde_json::{json, Value};

use super::common::{delivery_json, figures, Findings};
use super::{Input, Verdict};
use crate::scenario::Channel;

pub const NAME: &str = "immutable_payload";

/// `s` HTML-escaped as Mustache implementations do, with `'` written as `apos`.
pub fn escape(s: &str, apos: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str(apos),
            c => out.push(c),
        }
    }
    out
}

/// Whether a name would be dangerous to insert into HTML unescaped.
fn is_html_special(name: &str) -> bool {
    name.contains(['<', '>', '&', '"'])
}

/// The e-mails whose HTML part this checker reads: those to the run's recipients (batches and
/// orders) with an HTML-special name. A run keeps only these in memory ([`super::Entry`]).
pub fn html_kept(scenario: &crate::scenario::Scenario) -> super::Keep {
    let addresses = crate::load::recipients::of_run_each(scenario)
        .filter(|r| r.tricky && is_html_special(&r.name))
        .map(|r| r.email.to_ascii_lowercase())
        .collect();
    super::Keep::HtmlOf(std::sync::Arc::new(addresses))
}

/// Whether a Mustache template has a `{{name}}`-like tag (escaped or not).
fn mentions_name(template: &str) -> bool {
    template.split("{{").skip(1).any(|rest| {
        let tag = rest.split("}}").next().unwrap_or("");
        tag.trim_matches(|c: char| c == '{' || c == '}' || c == '&' || c.is_whitespace()) == "name"
    })
}

/// Up to 60 characters either side of byte offset `at`.
fn excerpt(s: &str, at: usize, len: usize) -> String {
    let start = s[..at].char_indices().rev().nth(59).map_or(0, |(i, _)| i);
    let end = s[at + len..]
        .char_indices()
        .nth(60)
        .map_or(s.len(), |(i, _)| at + len + i);
    s[start..end].to_string()
}

pub fn check(input: &Input) -> Verdict {
    let sends = input.sends();
    let needs_escaped = mentions_name(&input.scenario.load.template.html);
    let mut findings = Findings::default();
    let (mut changed, mut html_checked) = (0u64, 0u64);
    // Deliveries with at least one hashed attempt; accepted e-mails to HTML-special names.
    let (mut hashed, mut html_due) = (0u64, 0u64);

    for e in input.expected {
        let attempts = sends.of_expected(e);
        let mut hashes: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for s in attempts {
            if let Some(h) = s.payload_hash() {
                hashes
                    .entry(h.to_string())
                    .or_default()
                    .push(json!({"seq": s.seq, "attempt": s.attempt}));
            }
        }
        hashed += u64::from(!hashes.is_empty());
        if hashes.len() > 1 {
            changed += 1;
            let mut c = delivery_json(e);
            c.insert("rule".into(), json!("payload_changed"));
            c.insert("hashes".into(), json!(hashes));
            findings.push(Value::Object(c));
        }

        let Some(name) = e.tricky_name.as_deref().filter(|n| is_html_special(n)) else {
            continue;
        };
        if e.channel != Channel::Email {
            continue;
        }
        for s in attempts.iter().filter(|s| s.outcome == Outcome::Accepted) {
            html_due += 1;
            let Some(html) = s.html() else {
                continue;
            };
            html_checked += 1;
            let mut c = delivery_json(e);
            c.insert("name".into(), json!(name));
            c.insert("seq".into(), json!(s.seq));
            if let Some(at) = html.find(name) {
                c.insert("rule".into(), json!("unescaped_html"));
                c.insert("excerpt".into(), json!(excerpt(html, at, name.len())));
                findings.push(Value::Object(c));
            } else if needs_escaped && !html_escape::decode_html_entities(html).contains(name) {
                c.insert("rule".into(), json!("escaped_name_missing"));
                c.insert("expected".into(), json!(escape(name, "&#39;")));
                c.insert("excerpt".into(), json!(excerpt(html, 0, 0)));
                findings.push(Value::Object(c));
            }
        }
    }

    let summary = format!(
        "{} deliveries: {changed} with a changed payload; {html_checked} e-mails to HTML-special names checked, {} badly escaped",
        input.expected.len(),
        findings.total() as u64 - changed
    );
    let figs = figures(json!({
        "deliveries": input.expected.len(),
        "payload_changed": changed,
        "html_checked": html_checked,
    }));
    findings.judged("payload_changed", hashed);
    if html_due > 0 {
        // An accepted e-mail whose HTML the ledger did not keep cannot be judged.
        findings.unjudged(
            "unescaped_html",
            html_due,
            html_due - html_checked,
            0.0,
            "accepted e-mails with no HTML part recorded",
        );
        findings.judged("unescaped_html", html_checked);
    }
    findings.verdict(NAME, summary, figs)
}

#[cfg(test)]
mod tests {
    use mock_providers::ledger::Outcome::*;

    use super::*;
    use crate::check::testkit::*;
    use crate::check::Status;
    use crate::scenario::Channel::*;

    const NAME_: &str = "Ana <b>&</b> O'Neil";

    fn tricky(w: &mut World, html: &str) {
        let a = w.expect("r1", Email);
        w.expected[0].tricky_name = Some(NAME_.into());
        w.send(Email, &a, Accepted, 0).html(html);
    }

    #[test]
    fn escape_matches_mustache() {
        assert_eq!(
            escape(NAME_, "&#39;"),
            "Ana &lt;b&gt;&amp;&lt;/b&gt; O&#39;Neil"
        );
        assert!(mentions_name("<p>Hi {{ name }}</p>") && mentions_name("{{{name}}}"));
        assert!(!mentions_name("<p>Hi {{first_name}}</p>"));
        assert_eq!(excerpt("ab山cd", 2, 3), "ab山cd");
    }

    #[test]
    fn same_payload_and_escaped_names_hold() {
        // Each accepted `'` spelling, escaping of more than the minimum (mustache.js and ramhorns
        // also escape `=`, `/`, `` ` ``), and a name without HTML-special characters shown raw.
        let extra = escape(NAME_, "&#39;").replace('/', "&#x2F;");
        for html in ["&#39;", "&#x27;", "'"]
            .map(|apos| format!("<p>Hi {},</p>", escape(NAME_, apos)))
            .into_iter()
            .chain([format!("<p>Hi {extra},</p>")])
        {
            let apos = &html;
            let mut w = World::new();
            tricky(&mut w, &html);
            let b = w.expect("r2", Line);
            w.expected[1].tricky_name = Some("山田 O'Neil".into());
            w.send(Line, &b, Transient, 0);
            w.send(Line, &b, Accepted, 200);
            let v = check(&w.input());
            assert_eq!(v.status, Status::Holds, "{apos}: {v:#?}");
            assert_eq!(v.figures["html_checked"], 1);
        }
    }

    #[test]
    fn changed_payload_is_a_violation() {
        let mut w = World::new();
        let a = w.expect("r1", Sms);
        // SHA-256 hex, as the fakes record it: shown by its first 16 digits.
        let first = format!("{}{}", "aaaa0000aaaa0000", "f".repeat(48));
        let second = format!("{}{}", "bbbb0000bbbb0000", "f".repeat(48));
        w.send(Sms, &a, Transient, 0).hash(&first);
        w.send(Sms, &a, Accepted, 200).hash(&second);
        let v = check(&w.input());
        assert_eq!(rules(&v), ["payload_changed"]);
        let h = &v.counterexamples[0]["hashes"];
        assert_eq!(h["aaaa0000aaaa0000"][0]["attempt"], 1);
        assert_eq!(h["bbbb0000bbbb0000"][0]["attempt"], 2);
    }

    #[test]
    fn bad_escaping_is_a_violation() {
        // (html sent, rule)
        let raw = format!("<p>Hi {NAME_},</p>");
        let double = format!("<p>Hi {},</p>", escape(&escape(NAME_, "&#39;"), "&#39;"));
        let cases = [
            (raw.as_str(), "unescaped_html"),
            (double.as_str(), "escaped_name_missing"),
        ];
        for (html, rule) in cases {
            let mut w = World::new();
            tricky(&mut w, html);
            let v = check(&w.input());
            assert_eq!(v.status, Status::Violated, "{html}");
            assert_eq!(rules(&v), [rule], "{html}");
            assert!(v.counterexamples[0]["excerpt"]
                .as_str()
                .unwrap()
                .contains("Hi "));
        }
    }

    #[test]
    fn missing_escaped_name_is_not_required_when_template_has_no_name() {
        let mut w = World::new();
        w.scenario.load.template.html = "<p>Your order shipped.</p>".into();
        tricky(&mut w, "<p>Your order shipped.</p>");
        assert_eq!(check(&w.input()).status, Status::Holds);
    }

    #[test]
    fn escaping_without_the_html_recorded_is_insufficient() {
        // An accepted e-mail to an HTML-special name whose HTML part was not recorded.
        let mut w = World::new();
        let a = w.expect("r1", Email);
        w.expected[0].tricky_name = Some(NAME_.into());
        w.send(Email, &a, Accepted, 0);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Insufficient, "{v:#?}");
        // No HTML-special names at all: the escaping rule does not apply.
        let mut w = World::new();
        let a = w.expect("r1", Email);
        w.send(Email, &a, Accepted, 0);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        assert!(!v.judged.contains_key("unescaped_html"));
    }
}
