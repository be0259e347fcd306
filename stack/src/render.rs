//! Rendering a batch's template once per recipient at enqueue time, and the per-delivery
//! identities derived from its key (LINE retry key, e-mail Message-ID).
//!
//! The Mustache subset this stack supports, rendered by `handlebars` in strict mode with none of
//! its helpers registered: escaped variables (`{{name}}`, `{{vars.a}}`) and comments
//! (`{{! … }}`). Every variable is HTML-escaped and a missing one is an error, not an empty
//! string. Anything else — unescaped slots (`{{{var}}}`, `{{&var}}`), sections, block helpers
//! (`{{#each}}`, `{{#if}}`), helper calls, partials, decorators, `{{else}}`, `@data`, whitespace
//! control, delimiter changes — is refused at compile time with the template field named, so
//! recipient data can never reach the output raw and no Handlebars-only feature slips in.
//! This module must never be called on the retry path: workers send the stored payload.

use handlebars::{Handlebars, RenderErrorReason};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

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
    hb: Handlebars<'static>,
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
        let mut hb = Handlebars::new();
        hb.set_strict_mode(true);
        for helper in HANDLEBARS_HELPERS {
            hb.unregister_helper(helper);
        }
        if unescaped {
            hb.register_escape_fn(handlebars::no_escape);
        }
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
        for part in PARTS {
            let Some(s) = src(part) else { continue };
            check_subset(s, unescaped).map_err(|m| err(part, m))?;
            hb.register_template_string(part, s)
                .map_err(|e| err(part, e.reason().to_string()))?;
        }
        Ok(Renderer {
            hb,
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
            let out = self.hb.render(part, ctx).map_err(|e| match e.reason() {
                RenderErrorReason::MissingVariable(Some(v)) => RenderError {
                    field: format!("{var_field}.{v}"),
                    message: format!(
                        "template.{part} uses {{{{{v}}}}} but the recipient has no such variable"
                    ),
                },
                other => RenderError {
                    field: format!("template.{part}"),
                    message: other.to_string(),
                },
            })?;
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
                html: if self.hb.has_template("html") {
                    Some(one("html")?)
                } else {
                    None
                },
            },
        })
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

/// Every helper `Handlebars::new()` may register (the `string_helpers` feature's included): all
/// unregistered, so a name can only ever be a variable.
const HANDLEBARS_HELPERS: [&str; 25] = [
    "if",
    "unless",
    "each",
    "with",
    "lookup",
    "raw",
    "log",
    "eq",
    "ne",
    "gt",
    "gte",
    "lt",
    "lte",
    "and",
    "or",
    "not",
    "len",
    "lowerCamelCase",
    "upperCamelCase",
    "snakeCase",
    "kebabCase",
    "shoutySnakeCase",
    "shoutyKebabCase",
    "titleCase",
    "trainCase",
];

/// Checks that `s` uses only the supported Mustache subset: escaped variables `{{name}}` /
/// `{{a.b}}` and comments `{{! … }}`. Everything else Handlebars would accept is refused with
/// the reason: unescaped slots `{{{x}}}` / `{{&x}}` (unless `unescaped`, the flaw), sections and
/// inverted sections `{{#x}}` / `{{^x}}`, block helpers (`{{#each xs}}`, `{{#if x}}`), helper
/// calls with arguments, partials `{{> p}}`, decorators `{{* d}}`, `{{else}}`, `@data`
/// variables, `this` and parent paths, whitespace control `{{~`, delimiter changes `{{=`, and
/// escaped mustaches `\{{`.
fn check_subset(s: &str, unescaped: bool) -> Result<(), String> {
    let mut rest = s;
    while let Some(pos) = rest.find("{{") {
        if rest[..pos].ends_with('\\') {
            return Err("escaped mustache \\{{ is not supported".into());
        }
        let tag = &rest[pos..];
        let (inner, len) = if let Some(body) = tag.strip_prefix("{{!--") {
            let end = body
                .find("--}}")
                .ok_or_else(|| format!("unclosed comment {}", preview(tag)))?;
            rest = &body[end + 4..];
            continue;
        } else if let Some(body) = tag.strip_prefix("{{{") {
            let end = body
                .find("}}}")
                .ok_or_else(|| format!("unclosed tag {}", preview(tag)))?;
            if !unescaped {
                return Err(format!("unescaped slot {} is not allowed", preview(tag)));
            }
            (&body[..end], 3 + end + 3)
        } else {
            let body = &tag[2..];
            let end = body
                .find("}}")
                .ok_or_else(|| format!("unclosed tag {}", preview(tag)))?;
            (&body[..end], 2 + end + 2)
        };
        let shown = &tag[..len];
        rest = &tag[len..];
        if inner.starts_with('!') {
            continue;
        }
        if inner.starts_with('~') || inner.ends_with('~') {
            return Err(format!("whitespace control in {shown} is not supported"));
        }
        let inner = inner.trim();
        let name = match inner.chars().next() {
            Some('&') if unescaped => inner[1..].trim(),
            Some('&') => return Err(format!("unescaped slot {shown} is not allowed")),
            Some('#') | Some('^') | Some('/') => {
                let what = inner[1..].trim();
                return Err(if what.starts_with('*') {
                    format!("decorator {shown} is not supported")
                } else if what.contains(char::is_whitespace) {
                    format!("block helper {shown} is not supported")
                } else {
                    format!("section {shown} is not supported (variables only)")
                });
            }
            Some('>') => return Err(format!("partial {shown} is not supported")),
            Some('*') => return Err(format!("decorator {shown} is not supported")),
            Some('=') => return Err(format!("delimiter change {shown} is not supported")),
            Some('@') => return Err(format!("data variable {shown} is not supported")),
            _ => inner,
        };
        if name == "else" {
            return Err(format!("{shown} is not supported"));
        }
        if name.contains(char::is_whitespace) {
            return Err(format!("helper call {shown} is not supported"));
        }
        if !is_variable(name) {
            return Err(format!(
                "{shown} is not a variable name (letters, digits, _ and -, dotted)"
            ));
        }
    }
    Ok(())
}

/// `name` or `a.b.c`: segments of ASCII letters, digits, `_` and `-`, starting with a letter or
/// `_`, and not `this`.
fn is_variable(name: &str) -> bool {
    name.split('.').enumerate().all(|(i, seg)| {
        let mut chars = seg.chars();
        let first_ok = match chars.next() {
            Some(c) if i == 0 => c.is_ascii_alphabetic() || c == '_',
            Some(c) => c.is_ascii_alphanumeric() || c == '_' || c == '-',
            None => false,
        };
        first_ok
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            && seg != "this"
    })
}

/// The start of a tag, for error messages.
fn preview(tag: &str) -> String {
    let end = tag
        .char_indices()
        .nth(24)
        .map(|(i, _)| i)
        .unwrap_or(tag.len());
    format!("{:?}", &tag[..end])
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
            ("Hi {{{name}}}", "unescaped slot"),
            ("Hi {{& name}}", "unescaped slot"),
            ("Hi {{{{raw}}}} x {{{{/raw}}}}", "unescaped slot"),
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
            ("{{this}}", "not a variable"),
            ("{{.}}", "not a variable"),
            ("{{../name}}", "not a variable"),
            ("{{vars.[a b]}}", "helper call"),
            ("{{~name}}", "whitespace control"),
            ("{{name~}}", "whitespace control"),
            ("{{=<% %>=}}", "delimiter change"),
            ("\\{{name}}", "escaped mustache"),
            ("{{!-- never closed", "unclosed comment"),
            ("{{name}", "unclosed tag"),
        ];
        for (src, why) in refused {
            match Renderer::compile(&tpl(src), &[Channel::Sms], false) {
                Ok(_) => panic!("{src:?} compiled"),
                Err(e) => {
                    assert_eq!(e.field, "template.sms", "{src}");
                    assert!(e.message.contains(why), "{src}: {}", e.message);
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
