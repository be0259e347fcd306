//! `headers`: what the providers received is exactly what a correct rendering of the template
//! produces, however hostile the recipient's data — no header or recipient smuggled in through a
//! name, the Subject whole, SMS bodies within the provider's limit.
//!
//! The load gives a share of recipients names and variables with CR/LF followed by a header line
//! (`Bcc: attacker@injected.invalid`, `X-Ting-Injected: …`), NUL, right-to-left marks and very long
//! text (`load::recipients`). Rules, on every accepted e-mail (the SMTP fake keeps its envelope
//! and every header in order) and SMS:
//!
//! - **header_injection**: a header field named `X-Ting-Injected` (only hostile data spells it),
//!   or a second `Subject`, `From`, `To`, `Cc`, `Message-ID` or `Date` (RFC 5322 §3.6 allows one).
//! - **extra_recipient**: an address in the envelope (`RCPT TO`) or in a `To`/`Cc`/`Bcc` header
//!   that is no recipient of the run.
//! - **malformed_header**: a header value with a control character other than tab (RFC 5322
//!   §2.2: a field body is printable characters and white space; a NUL or a bare CR is neither).
//! - **subject_changed**: the Subject, RFC 2047 encoded-words decoded and folding undone, is not
//!   the template's subject rendered with the recipient's data. Compared without white space,
//!   control and invisible formatting characters (a stack may fold a line break into a space,
//!   drop a NUL or an RTL override, and must fold a long subject), and with the data either
//!   HTML-escaped (as every body is) or not (a subject is plain text): what is left is the text,
//!   which must arrive whole — cut at an injected line break, it does not.
//! - **sms_too_long**: an SMS sent with a body of more than 1,600 characters, the most a Twilio
//!   message may carry (the fake refuses it, error 21617, keeping the body it was sent; without
//!   this rule the delivery would just end unsent).
//!
//! Must never judge a header a stack adds on its own (`X-Mailer`, `List-Unsubscribe`…): only
//! what the data could have put there.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use super::{Entry, Field, Name};
use mock_providers::ledger::{EntryKind, HeaderField, Outcome, Provider};
use serde_json::{json, Value};

use super::common::{figures, not_checked, Findings, MAX_UNJUDGED_SHARE};
use super::immutable_payload::escape;
use super::{Input, Verdict};
use crate::load::recipients::{self, Recipient, INJECTED_HEADER};
use crate::scenario::Channel;

pub const NAME: &str = "headers";

/// Twilio's limit on a message body, in characters.
pub const SMS_MAX_CHARS: usize = 1_600;

/// Fields RFC 5322 §3.6 allows at most once.
const ONCE: [&str; 6] = ["subject", "from", "to", "cc", "message-id", "date"];

pub fn check(input: &Input) -> Verdict {
    let load = &input.scenario.load;
    // Each e-mail's Subject is its own batch's: `[load] template_edit` POSTs later batches with
    // an edited template, and a stack that renders at send time from the template as it is now
    // sends the edit to earlier batches too.
    let edited: HashSet<Cow<str>> = input
        .expected
        .iter()
        .filter(|e| e.template_edited)
        .map(|e| lower(&e.address))
        .collect();
    let subject_templates = [
        load.template_of(false).subject.clone(),
        load.template_of(true).subject.clone(),
    ];
    // The run's people one at a time (the trickle's orders too: their recipients follow the
    // batches' in one seeded sequence), keeping of each only its e-mail address and the subject
    // its template renders for it.
    let mut subject_of: HashMap<String, Option<Rendered>> = HashMap::new();
    for person in recipients::of_run_each(input.scenario) {
        let address = person.email.to_ascii_lowercase();
        let template = &subject_templates[usize::from(edited.contains(address.as_str()))];
        let rendered = Rendered::new(template, &person);
        subject_of.insert(address, rendered);
    }
    // Every e-mail address of the load, also of a batch the stack did not accept in time (nothing
    // is expected for it, but a stack that took it late sends it to the load's own recipients).
    let expected_emails: HashSet<Cow<str>> = input
        .expected
        .iter()
        .filter(|e| e.channel == Channel::Email)
        .map(|e| lower(&e.address))
        .collect();
    let of_run = |a: &str| expected_emails.contains(a) || subject_of.contains_key(a);

    let mut findings = Findings::default();
    let (mut emails, mut subjects, mut sms) = (0u64, 0u64, 0u64);
    let sends = input.ledger.iter().filter(|e| e.kind == EntryKind::Send);
    for e in sends {
        match e.provider {
            Provider::Smtp if e.outcome == Outcome::Accepted => {
                let Some(detail) = e.email() else {
                    continue;
                };
                emails += 1;
                for (rule, what) in header_findings(&detail.headers, &detail.rcpt_to, &of_run) {
                    findings.push(finding(e, rule, what));
                }
                let address = e.recipient.to_ascii_lowercase();
                if let Some(want) = subject_of.get(&address).and_then(Option::as_ref) {
                    subjects += 1;
                    let got = e.subject().unwrap_or_default();
                    if !want.matches(got) {
                        findings.push(finding(
                            e,
                            "subject_changed",
                            json!({"subject": got, "expected": want.raw}),
                        ));
                    }
                }
            }
            Provider::Sms => {
                sms += 1;
                let chars = e.body_chars() as usize;
                if chars > SMS_MAX_CHARS {
                    findings.push(finding(
                        e,
                        "sms_too_long",
                        json!({"chars": chars, "limit": SMS_MAX_CHARS}),
                    ));
                }
            }
            Provider::Smtp | Provider::Line => {}
        }
    }
    let on = |c: Channel| load.channels.contains(&c);
    if !on(Channel::Email) && !on(Channel::Sms) {
        return not_checked(NAME, "the load sends no e-mail and no SMS");
    }
    // The fake keeps the headers of every e-mail it accepts; with none accepted there is nothing
    // these rules could have looked at (`no_loss` says why).
    if on(Channel::Email) && emails > 0 {
        for rule in ["header_injection", "extra_recipient", "malformed_header"] {
            findings.judged(rule, emails);
        }
        // A subject template with more than variables and comments is not rendered here: the
        // rule does not apply. Otherwise every e-mail's recipient must be one of the load's.
        if subject_templates.iter().all(|t| renderable(t)) {
            findings.judged("subject_changed", subjects);
            findings.unjudged(
                "subject_changed",
                emails,
                emails - subjects,
                MAX_UNJUDGED_SHARE,
                "e-mails to an address the load did not generate",
            );
        }
    }
    if on(Channel::Sms) {
        findings.judged("sms_too_long", sms);
    }
    let summary = format!(
        "{emails} e-mails (headers, recipients; {subjects} subjects against the template) and \
         {sms} SMS checked: {} findings",
        findings.total()
    );
    let figs = figures(json!({
        "emails": emails,
        "subjects": subjects,
        "sms": sms,
    }));
    findings.verdict(NAME, summary, figs)
}

fn finding(e: &Entry, rule: &str, what: Value) -> Value {
    let mut c = json!({
        "rule": rule,
        "address": e.recipient,
        "seq": e.seq,
        "attempt": e.attempt,
    });
    if let (Value::Object(c), Value::Object(w)) = (&mut c, what) {
        c.extend(w);
    }
    c
}

/// The fields of one message's header a rule of this file can flag, whatever the run: an
/// address list, the injected header, a value with a control character, and a field RFC 5322
/// allows once when the message has it more than once. The ledger keeps only these in memory
/// ([`super::Entry`]); [`header_findings`] finds nothing in the rest (a `Subject` or
/// `Message-ID` written once, with no control character, is left out: each e-mail has its own).
pub(crate) fn judged_fields(headers: &[HeaderField]) -> impl Iterator<Item = &HeaderField> {
    let repeated = |name: &str| {
        ONCE.contains(&name)
            && headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(name))
                .nth(1)
                .is_some()
    };
    headers.iter().filter(move |h| {
        let name = h.name.to_ascii_lowercase();
        ADDRESS_LISTS.contains(&name.as_str())
            || name == INJECTED_HEADER.to_ascii_lowercase()
            || h.value.chars().any(|c| c.is_control() && c != '\t')
            || repeated(&name)
    })
}

/// Fields whose addresses must be recipients of the run.
const ADDRESS_LISTS: [&str; 3] = ["to", "cc", "bcc"];

/// The header rules of one accepted message: (rule, details). `of_run` tells a (lower-case)
/// address of the run's recipients.
fn header_findings(
    headers: &[Field],
    rcpt_to: &[Name],
    of_run: &dyn Fn(&str) -> bool,
) -> Vec<(&'static str, Value)> {
    let mut out = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for h in headers {
        let name = h.name.to_ascii_lowercase();
        *seen.entry(name.clone()).or_default() += 1;
        if name == INJECTED_HEADER.to_ascii_lowercase() {
            out.push((
                "header_injection",
                json!({"header": format!("{}: {}", h.name, h.value)}),
            ));
        }
        if h.value.chars().any(|c| c.is_control() && c != '\t') {
            out.push((
                "malformed_header",
                json!({"header": h.name, "value": h.value}),
            ));
        }
    }
    for name in ONCE {
        if seen.get(name).is_some_and(|n| *n > 1) {
            let all: Vec<String> = headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| format!("{}: {}", h.name, h.value))
                .collect();
            out.push(("header_injection", json!({"repeated": all})));
        }
    }
    let header_addresses = headers
        .iter()
        .filter(|h| ADDRESS_LISTS.contains(&h.name.to_ascii_lowercase().as_str()))
        .flat_map(|h| {
            addresses(&h.value)
                .into_iter()
                .map(move |a| (h.name.to_string(), a))
        });
    let envelope = rcpt_to
        .iter()
        .map(|a| ("RCPT TO".to_string(), a.to_string()));
    for (place, address) in envelope.chain(header_addresses) {
        if !of_run(&address.to_ascii_lowercase()) {
            out.push(("extra_recipient", json!({"in": place, "extra": address})));
        }
    }
    out
}

/// `s` in lower case, borrowed when it already is.
fn lower(s: &str) -> Cow<'_, str> {
    if s.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(s.to_ascii_lowercase())
    } else {
        Cow::Borrowed(s)
    }
}

/// The addr-specs of an address-list header value: quoted strings and comments dropped, then
/// each `<addr>`, or each bare item with an `@`.
fn addresses(value: &str) -> Vec<String> {
    let mut plain = String::with_capacity(value.len());
    let (mut quoted, mut depth, mut escaped) = (false, 0u32, false);
    for c in value.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted || depth > 0 => escaped = true,
            '"' if depth == 0 => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted && depth > 0 => depth -= 1,
            _ if quoted || depth > 0 => {}
            c => plain.push(c),
        }
    }
    plain
        .split([',', ';'])
        .filter_map(|item| {
            let item = item.trim();
            let addr = match (item.find('<'), item.rfind('>')) {
                (Some(a), Some(b)) if a < b => &item[a + 1..b],
                _ => item.rsplit(':').next().unwrap_or(item),
            };
            let addr = addr.trim();
            addr.contains('@').then(|| addr.to_string())
        })
        .collect()
}

/// A template's subject rendered with one recipient's data, both ways a correct stack may write
/// it; `None` when the template uses anything but variables and comments.
struct Rendered {
    raw: String,
    escaped: String,
}

impl Rendered {
    fn new(template: &str, r: &Recipient) -> Option<Rendered> {
        let value = |name: &str| -> Option<String> {
            match name {
                "name" => Some(r.name.clone()),
                "id" => Some(r.id.clone()),
                _ => match r.vars.get(name)? {
                    Value::String(s) => Some(s.clone()),
                    other => Some(other.to_string()),
                },
            }
        };
        let (mut raw, mut escaped) = (String::new(), String::new());
        let mut rest = template;
        while let Some(open) = rest.find("{{") {
            raw.push_str(&rest[..open]);
            escaped.push_str(&rest[..open]);
            let after = &rest[open + 2..];
            let close = after.find("}}")?;
            let tag = after[..close].trim();
            rest = &after[close + 2..];
            if tag.starts_with('!') {
                continue;
            }
            if !tag.chars().all(|c| c.is_alphanumeric() || c == '_') {
                return None;
            }
            let v = value(tag)?;
            escaped.push_str(&escape(&v, "&#39;"));
            raw.push_str(&v);
        }
        raw.push_str(rest);
        escaped.push_str(rest);
        Some(Rendered { raw, escaped })
    }

    /// `got` (a decoded Subject) carries the same text, escaped or not.
    fn matches(&self, got: &str) -> bool {
        let decoded = html_escape::decode_html_entities(got);
        let wanted = [
            visible(&html_escape::decode_html_entities(&self.escaped)),
            visible(&self.raw),
        ];
        [visible(&decoded), visible(got)]
            .iter()
            .any(|g| wanted.contains(g))
    }
}

/// Whether the harness renders `template` (variables and comments only).
fn renderable(template: &str) -> bool {
    let anyone = recipients::generate(0, 1, 0.0).remove(0);
    Rendered::new(template, &anyone).is_some()
}

/// `s` without white space, control characters and invisible formatting marks (zero-width
/// characters, bidirectional marks, overrides and isolates, the byte-order mark).
fn visible(s: &str) -> String {
    s.chars()
        .filter(|c| {
            !(c.is_whitespace()
                || c.is_control()
                || matches!(*c as u32, 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2069 | 0xFEFF))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;
    use crate::check::Status;

    fn field(name: &str, value: &str) -> Field {
        Field {
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn addresses_skip_display_names_and_comments() {
        assert_eq!(
            addresses("\"Ana, Bcc: attacker@injected.invalid\" <r1@example.test>, b@x.test (c@d)"),
            ["r1@example.test", "b@x.test"]
        );
        assert_eq!(addresses("undisclosed-recipients:;"), Vec::<String>::new());
        assert_eq!(
            addresses("Team: a@x.test, b@x.test;"),
            ["a@x.test", "b@x.test"]
        );
    }

    #[test]
    fn injected_headers_and_recipients_are_named() {
        let run = |a: &str| a == "r1@example.test";
        let headers = [
            field("From", "ting@example.test"),
            field("To", "r1@example.test"),
            field("Subject", "Welcome Ana"),
            field("Bcc", "attacker@injected.invalid"),
            field("X-Ting-Injected", "name"),
            field("Subject", "again"),
            field("X-Mailer", "my stack 1.0"),
        ];
        let rules: Vec<&str> = header_findings(&headers, &["r1@example.test".into()], &run)
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        assert_eq!(
            rules,
            ["header_injection", "header_injection", "extra_recipient"]
        );
        let clean = [
            field(
                "To",
                "\"Ana Bcc: attacker@injected.invalid\" <r1@example.test>",
            ),
            field("Subject", "=?utf-8?b?V2VsY29tZSBBbmEgQmNjOg==?="),
            field("X-Mailer", "my stack\t1.0"),
        ];
        assert!(header_findings(&clean, &["R1@example.test".into()], &run).is_empty());
        let nul = [field("Subject", "a\0b")];
        assert_eq!(header_findings(&nul, &[], &run)[0].0, "malformed_header");
    }

    fn person(name: &str) -> Recipient {
        let mut r = recipients::generate(1, 1, 0.0).remove(0);
        r.name = name.into();
        r
    }

    /// A correct stack may escape the subject or not, fold its line breaks into spaces, drop NUL
    /// and invisible marks, and fold a long subject: all the same text. Cut at an injected line
    /// break, or with other text, it is not.
    #[test]
    fn subject_must_carry_the_rendered_text() {
        let ana = person("Ana <b>\r\nBcc: attacker@injected.invalid\0 \u{202E}x");
        let want = Rendered::new("Welcome {{name}} {{! note }}", &ana).unwrap();
        for ok in [
            "Welcome Ana &lt;b&gt; Bcc: attacker@injected.invalid x",
            "Welcome Ana <b> Bcc: attacker@injected.invalid \u{202E}x",
            "Welcome Ana <b>\r\nBcc: attacker@injected.invalid\u{202E}x",
            "Welcome Ana &lt;b&gt;Bcc:\n attacker@injected.invalid x",
        ] {
            assert!(want.matches(ok), "{ok:?}");
        }
        for bad in [
            "Welcome Ana <b>",
            "Welcome Ana &amp;lt;b&amp;gt; Bcc: attacker@injected.invalid x",
            "",
        ] {
            assert!(!want.matches(bad), "{bad:?}");
        }
        assert!(Rendered::new("{{#x}}y{{/x}}", &ana).is_none());
        assert!(Rendered::new("{{nope}}", &ana).is_none());
    }

    /// `[load] template_edit`: every e-mail's Subject is its own batch's template. A stack that
    /// keeps templates by id and renders at send time sends the edit to the batch before it (or
    /// one that keeps the first version it saw withholds the edit from the batch after it).
    #[test]
    fn each_email_carries_its_own_batch_s_template() {
        let mut w = World::new();
        w.scenario.load.channels = vec![Channel::Email];
        w.scenario.load.template_edit = Some(crate::scenario::TemplateEdit { from_batch: 2 });
        let people = recipients::of_run(&w.scenario);
        let subject = |p: &Recipient, edited: bool| {
            let t = w.scenario.load.template_of(edited);
            Rendered::new(&t.subject, p).unwrap().raw
        };
        // (subject of batch 1's e-mail, of batch 2's, rules expected)
        let cases = [
            (false, true, vec![]),
            (true, true, vec!["subject_changed"]),
            (false, false, vec!["subject_changed"]),
        ];
        for (first, second, want) in cases {
            let mut w = World::new();
            w.scenario.load.channels = vec![Channel::Email];
            w.scenario.load.template_edit = Some(crate::scenario::TemplateEdit { from_batch: 2 });
            for (i, (batch, edited, sent_edited)) in [("b1", false, first), ("b2", true, second)]
                .into_iter()
                .enumerate()
            {
                let p = &people[i];
                w.expected.push(crate::check::Expected {
                    recipient: p.id.as_str().into(),
                    channel: Channel::Email,
                    address: p.email.as_str().into(),
                    bad: false,
                    tricky_name: None,
                    batch_id: batch.into(),
                    template_edited: edited,
                });
                w.send(Channel::Email, &p.email, Outcome::Accepted, 10)
                    .subject(&subject(p, sent_edited));
            }
            let v = check(&w.input());
            assert_eq!(rules(&v), want, "sent edited: {first} {second}: {v:#?}");
            if let Some(c) = v.counterexamples.first() {
                assert_eq!(c["address"], people[usize::from(!first)].email);
            }
        }
    }

    /// A batch the stack accepted only after the load gave up is not expected, but its
    /// recipients are the load's: an e-mail to one adds no recipient; one to a stranger does.
    #[test]
    fn a_recipient_of_a_batch_not_accepted_is_no_extra_recipient() {
        let mut w = World::new();
        w.scenario.load.channels = vec![Channel::Email];
        let late = recipients::of_run(&w.scenario)[0].clone();
        let subject = Rendered::new(&w.scenario.load.template.subject, &late)
            .unwrap()
            .raw;
        w.send(Channel::Email, &late.email, Outcome::Accepted, 10)
            .subject(&subject);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        w.send(
            Channel::Email,
            "stranger@example.test",
            Outcome::Accepted,
            20,
        )
        .subject("x");
        assert_eq!(
            rules(&check(&w.input())),
            ["extra_recipient", "extra_recipient"]
        );
    }

    #[test]
    fn a_long_sms_is_flagged_and_an_empty_run_judges_nothing() {
        let mut w = World::new();
        assert_eq!(check(&w.input()).status, Status::Insufficient);
        w.scenario.load.channels = vec![Channel::Line];
        assert_eq!(check(&w.input()).status, Status::NotChecked);
        w.scenario.load.channels = vec![Channel::Sms];
        let a = w.expect("r1", Channel::Sms);
        w.send(Channel::Sms, &a, Outcome::Accepted, 10)
            .body(&"x".repeat(SMS_MAX_CHARS));
        assert_eq!(check(&w.input()).status, Status::Holds);
        // As the fake records it: refused (400, error 21617), the body kept.
        let b = w.expect("r2", Channel::Sms);
        w.send(Channel::Sms, &b, Outcome::ProtocolError, 10)
            .status("400")
            .body(&"x".repeat(SMS_MAX_CHARS + 1));
        let v = check(&w.input());
        assert_eq!(
            (v.status, rules(&v)),
            (Status::Violated, vec!["sms_too_long".to_string()])
        );
    }
}
