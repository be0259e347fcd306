//! Rendering a batch's template once per recipient at enqueue time, and the per-delivery
//! identities derived from its key (LINE retry key, e-mail Message-ID).
//!
//! The template language is `ting-template`'s Mustache subset: escaped variables (`{{name}}`,
//! `{{vars.a}}`) and comments (`{{! … }}`). Every variable is HTML-escaped and a missing one is
//! an error, not an empty string. Anything else — unescaped slots (`{{{var}}}`, `{{&var}}`),
//! sections, helpers, partials, decorators, `{{else}}`, `@data`, whitespace control, delimiter
//! changes — is refused at compile time with the template field and the tag's line:col named, so
//! recipient data can never reach the output raw. Values are looked up in the recipient's JSON
//! and written as Handlebars (which rendered here before) wrote them, so payloads keep their bytes.
//! This module must never be called on the retry path: workers send the stored payload.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use ting_template::{Escape, Lookup, Options, Template, Values};

use crate::channels::Channel;

/// The template of a batch, as posted.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct TemplateIn {
    pub id: String,
    pub version: i32,
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub html: Option<String>,
    #[serde(default)]
    pub line: Option<String>,
    #[serde(default)]
    pub sms: Option<String>,
}

/// What a worker sends, rendered once and stored with its SHA-256.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct Payload {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
}

impl Payload {
    /// Hex SHA-256 of the stored JSON form (field order is fixed by the struct).
    pub fn sha256(&self) -> String {
        sha256_hex(
            serde_json::to_string(self)
                .expect("payload serializes")
                .as_bytes(),
        )
    }
}

/// A template error, naming the template field (`template.sms`) or the recipient variable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {message}")]
pub struct RenderError {
    pub field: String,
    pub message: String,
}

/// The compiled templates of one batch.
pub struct Renderer {
    /// The parsed parts, in [`PARTS`] order.
    parts: [Option<Template>; 5],
    escape: Escape,
    /// The `subject-header-injection` flaw: the subject keeps recipient data's line breaks.
    raw_subject: bool,
}

const PARTS: [&str; 5] = ["subject", "text", "html", "line", "sms"];

impl Renderer {
    /// Compiles the parts the requested channels need; `unescaped` is the `unescaped-template`
    /// flaw (allows `{{{ }}}` and turns escaping off) and must stay false otherwise.
    pub fn compile(
        t: &TemplateIn,
        channels: &[Channel],
        unescaped: bool,
    ) -> Result<Renderer, RenderError> {
        let err = |part: &str, message: String| RenderError {
            field: format!("template.{part}"),
            message,
        };
        let src = |part: &str| match part {
            "subject" => &t.subject,
            "text" => &t.text,
            "html" => &t.html,
            "line" => &t.line,
            _ => &t.sms,
        };
        for ch in channels {
            let needed: &[&str] = match ch {
                Channel::Line => &["line"],
                Channel::Sms => &["sms"],
                Channel::Email => &["subject", "text"],
            };
            for part in needed {
                if src(part).as_deref().is_none_or(|s| s.trim().is_empty()) {
                    return Err(err(part, format!("required for channel {}", ch.as_str())));
                }
            }
        }
        let opts = Options {
            allow_unescaped: unescaped,
        };
        let mut parts: [Option<Template>; 5] = Default::default();
        for (slot, part) in parts.iter_mut().zip(PARTS) {
            if let Some(s) = src(part) {
                *slot = Some(ting_template::parse(s, opts).map_err(|e| err(part, e.to_string()))?);
            }
        }
        Ok(Renderer {
            parts,
            escape: if unescaped {
                Escape::None
            } else {
                Escape::Html
            },
            raw_subject: false,
        })
    }

    /// The `subject-header-injection` flaw: render the subject without folding recipient data's
    /// line breaks into spaces (the e-mail client then writes it into the header raw).
    pub fn with_raw_subject(mut self, raw: bool) -> Renderer {
        self.raw_subject = raw;
        self
    }

    /// Renders one recipient's payload for `channel` with `ctx` (its vars plus `id` and `name`).
    /// `var_field` prefixes the field named in a missing-variable error (`recipients[3].vars`).
    pub fn render(
        &self,
        channel: Channel,
        ctx: &serde_json::Value,
        var_field: &str,
    ) -> Result<Payload, RenderError> {
        // NUL can be neither stored (PostgreSQL text) nor sent (RFC 5322 forbids it anywhere).
        let one = |part: &str| -> Result<String, RenderError> {
            let t = self.part(part).ok_or_else(|| RenderError {
                field: format!("template.{part}"),
                message: "no such template".into(),
            })?;
            let out = ting_template::render(t, &Json(ctx), self.escape)
                .map_err(|e| not_found(part, var_field, e))?;
            Ok(out.replace('\0', ""))
        };
        let subject = || -> Result<String, RenderError> {
            let s = one("subject")?;
            Ok(if self.raw_subject { s } else { one_line(&s) })
        };
        Ok(match channel {
            Channel::Line => Payload {
                text: one("line")?,
                ..Payload::default()
            },
            Channel::Sms => Payload {
                text: one("sms")?,
                ..Payload::default()
            },
            Channel::Email => Payload {
                subject: Some(subject()?),
                text: one("text")?,
                html: if self.part("html").is_some() {
                    Some(one("html")?)
                } else {
                    None
                },
            },
        })
    }
}

impl Renderer {
    fn part(&self, name: &str) -> Option<&Template> {
        let i = PARTS.iter().position(|p| *p == name)?;
        self.parts[i].as_ref()
    }
}

/// A slot that found nothing names the recipient's variable; one that could not be followed (a
/// word as a list index) names the template field.
fn not_found(part: &str, var_field: &str, e: ting_template::Missing) -> RenderError {
    match e.invalid {
        None => RenderError {
            field: format!("{var_field}.{}", e.path),
            message: format!(
                "template.{part} uses {{{{{}}}}} but the recipient has no such variable",
                e.path
            ),
        },
        Some(why) => RenderError {
            field: format!("template.{part}"),
            message: why,
        },
    }
}

/// A subject is one header line: every run of control characters (CR, LF, tab, …) recipient data
/// brought in becomes one space, so no data can end the header and start another.
pub fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_run = false;
    for c in s.chars() {
        if c.is_control() {
            if !in_run {
                out.push(' ');
            }
            in_run = true;
        } else {
            out.push(c);
            in_run = false;
        }
    }
    out
}

/// A recipient's JSON context, looked up and written as Handlebars did: an object by key, an
/// array by index; a string as is, `null` as nothing, an array as `[a, b]`, an object as
/// `[object]`.
struct Json<'a>(&'a Value);

impl Values for Json<'_> {
    fn lookup(&self, path: &[String]) -> Lookup {
        let mut at = self.0;
        for seg in path {
            let next = match at {
                Value::Object(m) => m.get(seg),
                Value::Array(l) => match seg.parse::<usize>() {
                    Ok(i) => l.get(i),
                    Err(_) => {
                        return Lookup::Invalid(format!(
                            "Cannot access array/vector with string index, {seg}"
                        ))
                    }
                },
                _ => None,
            };
            match next {
                Some(v) => at = v,
                None => return Lookup::Missing,
            }
        }
        Lookup::Found(json_text(at))
    }
}

fn json_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(json_text).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(_) => "[object]".to_owned(),
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// What joins the parts of a delivery key; the API refuses batch and recipient ids containing it.
pub const KEY_SEPARATOR: char = ':';

/// `batch:recipient:channel`. Unambiguous because neither id may contain [`KEY_SEPARATOR`].
pub fn delivery_key(batch: &str, recipient: &str, channel: Channel) -> String {
    format!(
        "{batch}{KEY_SEPARATOR}{recipient}{KEY_SEPARATOR}{}",
        channel.as_str()
    )
}

/// The stable `X-Line-Retry-Key`: a version-5-shaped UUID from SHA-256 of the key.
pub fn line_retry_key(key: &str) -> String {
    let d = Sha256::digest(key.as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    uuid::Builder::from_sha1_bytes(b).into_uuid().to_string()
}

/// The deterministic e-mail Message-ID, angle brackets included.
pub fn email_message_id(key: &str) -> String {
    format!("<{}@ting.invalid>", &sha256_hex(key.as_bytes())[..24])
}

/// The correlation id stored per delivery: what a provider echoes back to us.
pub fn correlation_id(key: &str, channel: Channel) -> String {
    match channel {
        Channel::Line => line_retry_key(key),
        Channel::Email => email_message_id(key),
        Channel::Sms => format!("sms-{}", &sha256_hex(key.as_bytes())[..32]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tpl(sms: &str) -> TemplateIn {
        TemplateIn {
            id: "t".into(),
            version: 1,
            subject: Some("Order {{order_id}}".into()),
            text: Some("Hi {{name}}".into()),
            html: Some("<p>Hi {{name}}</p>".into()),
            line: Some("Hi {{name}}".into()),
            sms: Some(sms.into()),
        }
    }

    #[test]
    fn escapes_recipient_data_in_every_part() {
        let r = Renderer::compile(&tpl("Hi {{name}}"), &Channel::ALL, false).unwrap();
        let ctx = json!({"name": "Ana <b>&</b> 山田", "order_id": "A-1", "id": "r1"});
        let p = r
            .render(Channel::Email, &ctx, "recipients[0].vars")
            .unwrap();
        assert_eq!(
            p.html.as_deref(),
            Some("<p>Hi Ana &lt;b&gt;&amp;&lt;/b&gt; 山田</p>")
        );
        assert_eq!(p.text, "Hi Ana &lt;b&gt;&amp;&lt;/b&gt; 山田");
        let s = r.render(Channel::Sms, &ctx, "x").unwrap();
        assert!(!s.text.contains('<'));
    }

    #[test]
    fn rejected_templates_name_the_field() {
        let cases = [
            ("Hi {{{name}}}", "template.sms"),
            ("Hi {{&name}}", "template.sms"),
            ("Hi {{~{name}~}}", "template.sms"),
            ("Hi {{#if}}", "template.sms"),
            ("Hi {{name", "template.sms"),
            ("", "template.sms"),
        ];
        for (src, field) in cases {
            let e = Renderer::compile(&tpl(src), &[Channel::Sms], false)
                .err()
                .unwrap();
            assert_eq!(e.field, field, "{src}");
        }
        // The flaw switch is what lets an unescaped slot through.
        let r = Renderer::compile(&tpl("Hi {{{name}}}"), &[Channel::Sms], true).unwrap();
        let p = r
            .render(Channel::Sms, &json!({"name": "<b>"}), "v")
            .unwrap();
        assert_eq!(p.text, "Hi <b>");
    }

    /// The supported subset is Mustache variables and comments; every Handlebars-only feature
    /// (and every unescaped slot) is refused at compile time, naming the template field.
    #[test]
    fn only_the_mustache_subset_compiles() {
        let refused = [
            ("Hi {{{name}}}", "unescaped"),
            ("Hi {{& name}}", "unescaped"),
            ("Hi {{{{raw}}}} x {{{{/raw}}}}", "unescaped"),
            ("{{#each items}}{{name}}{{/each}}", "block helper"),
            ("{{#if name}}yes{{/if}}", "block helper"),
            ("{{#unless name}}no{{/unless}}", "block helper"),
            ("{{#with vars}}{{a}}{{/with}}", "block helper"),
            ("{{#name}}x{{/name}}", "section"),
            ("{{^name}}x{{/name}}", "section"),
            ("{{lookup vars \"a\"}}", "helper call"),
            ("{{log name}}", "helper call"),
            ("{{len name}}", "helper call"),
            ("{{upper name}}", "helper call"),
            ("{{> footer}}", "partial"),
            ("{{#> layout}}x{{/layout}}", "block helper"),
            ("{{#*inline \"p\"}}x{{/inline}}", "decorator"),
            ("{{*dec}}", "decorator"),
            ("{{else}}", "not supported"),
            ("{{@index}}", "data variable"),
            ("{{this}}", "context path"),
            ("{{.}}", "context path"),
            ("{{../name}}", "context path"),
            ("{{vars.[a b]}}", "helper call"),
            ("{{~name}}", "whitespace control"),
            ("{{name~}}", "whitespace control"),
            ("{{=<% %>=}}", "delimiters"),
            ("\\{{name}}", "escaped mustache"),
            ("{{!-- never closed", "never closed with `--}}`"),
            ("{{name}", "never closed with `}}`"),
        ];
        for (src, why) in refused {
            match Renderer::compile(&tpl(src), &[Channel::Sms], false) {
                Ok(_) => panic!("{src:?} compiled"),
                Err(e) => {
                    assert_eq!(e.field, "template.sms", "{src}");
                    assert!(e.message.contains(why), "{src}: {}", e.message);
                    assert!(e.message.starts_with("1:"), "{src}: {}", e.message);
                }
            }
        }
        // What is supported renders as Mustache would, escaped.
        let ok = "{{! a comment }}Hi {{ name }}, {{vars.city}} {{!-- {{#each}} --}}{{order_id}}";
        let r = Renderer::compile(&tpl(ok), &[Channel::Sms], false).unwrap();
        let ctx = json!({"name": "<A>", "order_id": "1", "vars": {"city": "Q&A"}});
        let p = r.render(Channel::Sms, &ctx, "v").unwrap();
        assert_eq!(p.text, "Hi &lt;A&gt;, Q&amp;A 1");
        // Helper names are plain variables: no helper is registered.
        let r = Renderer::compile(&tpl("{{len}} {{if}}"), &[Channel::Sms], false).unwrap();
        let p = r
            .render(Channel::Sms, &json!({"len": "3", "if": "<"}), "v")
            .unwrap();
        assert_eq!(p.text, "3 &lt;");
    }

    /// Recipient data cannot end the subject header (its line breaks become spaces) unless the
    /// `subject-header-injection` flaw is on; NUL is dropped from every part.
    #[test]
    fn hostile_data_stays_on_one_subject_line_and_nul_is_dropped() {
        let mut t = tpl("Hi {{name}}");
        t.subject = Some("Welcome {{name}}".into());
        let ctx = json!({"name": "Ana\r\nBcc: x@y.invalid\0", "order_id": "A-1", "id": "r1"});
        let r = Renderer::compile(&t, &Channel::ALL, false).unwrap();
        let p = r.render(Channel::Email, &ctx, "v").unwrap();
        assert_eq!(p.subject.as_deref(), Some("Welcome Ana Bcc: x@y.invalid"));
        assert_eq!(p.text, "Hi Ana\r\nBcc: x@y.invalid");
        let raw = Renderer::compile(&t, &Channel::ALL, false)
            .unwrap()
            .with_raw_subject(true);
        let p = raw.render(Channel::Email, &ctx, "v").unwrap();
        assert_eq!(
            p.subject.as_deref(),
            Some("Welcome Ana\r\nBcc: x@y.invalid")
        );
        assert_eq!(one_line("a\t\r\n b\u{7}"), "a  b ");
    }

    /// Values that are not text are written as Handlebars wrote them, and paths follow objects
    /// and arrays.
    #[test]
    fn json_values_render_as_handlebars_wrote_them() {
        let src = "Hi {{num}} {{neg}} {{flt}} {{t}} {{nul}} {{arr}} {{obj}} {{obj.k}} {{arr.1}} {{obj.inner.z}}";
        let r = Renderer::compile(&tpl(src), &[Channel::Sms], false).unwrap();
        let ctx = json!({"num": 42, "neg": -1.5, "flt": 1e21, "t": true, "nul": null,
            "arr": ["a<", 2, null], "obj": {"k": "v&", "inner": {"z": 0}}});
        let p = r.render(Channel::Sms, &ctx, "v").unwrap();
        assert_eq!(
            p.text,
            "Hi 42 -1.5 1e+21 true  [a&lt;, 2, ] [object] v&amp; 2 0"
        );
        let r = Renderer::compile(&tpl("{{arr.x}}"), &[Channel::Sms], false).unwrap();
        let e = r.render(Channel::Sms, &ctx, "v").unwrap_err();
        assert_eq!(e.field, "template.sms");
        let r = Renderer::compile(&tpl("{{obj.none}}"), &[Channel::Sms], false).unwrap();
        let e = r.render(Channel::Sms, &ctx, "v").unwrap_err();
        assert_eq!(e.field, "v.obj.none");
    }

    #[test]
    fn missing_variable_names_the_recipient_var() {
        let r = Renderer::compile(&tpl("Order {{order_id}}"), &[Channel::Sms], false).unwrap();
        let e = r
            .render(Channel::Sms, &json!({"name": "x"}), "recipients[3].vars")
            .unwrap_err();
        assert_eq!(e.field, "recipients[3].vars.order_id");
    }

    #[test]
    fn identities_are_stable_and_valid() {
        let k = delivery_key("b1", "r1", Channel::Line);
        assert_eq!(k, "b1:r1:line");
        assert_eq!(line_retry_key(&k), line_retry_key(&k));
        assert_ne!(line_retry_key(&k), line_retry_key("b1:r2:line"));
        let u = uuid::Uuid::parse_str(&line_retry_key(&k)).unwrap();
        assert_eq!(u.get_version_num(), 5);
        let m = email_message_id("b1:r1:email");
        assert!(
            m.starts_with('<') && m.ends_with("@ting.invalid>") && m.len() == 39,
            "{m}"
        );
        let p = Payload {
            text: "x".into(),
            ..Payload::default()
        };
        assert_eq!(p.sha256(), p.clone().sha256());
    }
}
