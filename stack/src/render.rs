//! Rendering a batch's template once per recipient at enqueue time, and the per-delivery
//! identities derived from its key (LINE retry key, e-mail Message-ID).
//!
//! Mustache-style `{{var}}` via `handlebars` in strict mode: every variable is HTML-escaped and a
//! missing variable is an error, not an empty string. Templates with an unescaped slot
//! (`{{{var}}}`, `{{&var}}`) are refused, so recipient data can never reach the output raw.
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
            if !unescaped {
                if let Some(slot) = unescaped_slot(s) {
                    return Err(err(part, format!("unescaped slot {slot:?} is not allowed")));
                }
            }
            hb.register_template_string(part, s)
                .map_err(|e| err(part, e.reason().to_string()))?;
        }
        Ok(Renderer { hb })
    }

    /// Renders one recipient's payload for `channel` with `ctx` (its vars plus `id` and `name`).
    /// `var_field` prefixes the field named in a missing-variable error (`recipients[3].vars`).
    pub fn render(
        &self,
        channel: Channel,
        ctx: &serde_json::Value,
        var_field: &str,
    ) -> Result<Payload, RenderError> {
        let one = |part: &str| -> Result<String, RenderError> {
            self.hb.render(part, ctx).map_err(|e| match e.reason() {
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
            })
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
                subject: Some(one("subject")?),
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

/// The first `{{{`, `{{&` (or their `~` whitespace-control forms) in `s`.
fn unescaped_slot(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut i = 0;
    while let Some(pos) = s[i..].find("{{") {
        let start = i + pos;
        let mut j = start + 2;
        if b.get(j) == Some(&b'~') {
            j += 1;
        }
        if matches!(b.get(j), Some(b'{') | Some(b'&')) {
            return Some(s[start..(j + 1).min(s.len())].to_string());
        }
        i = start + 2;
    }
    None
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `batch:recipient:channel`.
pub fn delivery_key(batch: &str, recipient: &str, channel: Channel) -> String {
    format!("{batch}:{recipient}:{}", channel.as_str())
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
