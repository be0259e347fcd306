//! Parsing and validating a LINE push request body, with LINE's own error wording.
//!
//! A body that passes here is well-formed; whether its recipient exists is decided later (bad
//! addresses are a seeded fault, not a syntax error). This module must never touch the ledger.

use serde_json::{json, Map, Value};

/// Most messages in one push.
pub const MAX_MESSAGES: usize = 5;
/// Most characters in one text message.
pub const MAX_TEXT: usize = 5000;

/// A valid push request.
#[derive(Debug)]
pub struct Push {
    pub to: String,
    /// The `messages` array as sent.
    pub messages: Vec<Value>,
    /// The text of each text message, for the ledger's `body`.
    pub texts: Vec<String>,
}

impl Push {
    /// The `messages` array re-serialized compactly: what the payload hash covers.
    pub fn messages_json(&self) -> String {
        serde_json::to_string(&self.messages).expect("json values always serialize")
    }
}

/// A body LINE would answer with 400 and an error list.
#[derive(Debug, PartialEq)]
pub struct Invalid {
    /// `to`, when it could be read, so the ledger can attribute the error.
    pub to: Option<String>,
    /// (message, property) pairs.
    pub details: Vec<(String, String)>,
}

impl Invalid {
    /// LINE's error body.
    pub fn body(&self) -> Value {
        json!({
            "message": format!("The request body has {} error(s)", self.details.len()),
            "details": self.details.iter()
                .map(|(m, p)| json!({"message": m, "property": p}))
                .collect::<Vec<_>>(),
        })
    }
}

/// Whether `to` has the shape of a LINE user id: `U` followed by 32 lowercase hex digits.
pub fn is_user_id(to: &str) -> bool {
    to.len() == 33
        && to.starts_with('U')
        && to[1..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Parses and validates a push body.
pub fn parse(body: &[u8]) -> Result<Push, Invalid> {
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Err(Invalid {
                to: None,
                details: vec![(format!("Invalid JSON: {e}"), String::new())],
            })
        }
    };
    let Value::Object(obj) = value else {
        return Err(Invalid {
            to: None,
            details: vec![("must be a JSON object".into(), String::new())],
        });
    };
    let mut details = Vec::new();
    let to = match obj.get("to") {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            details.push(("must be specified".into(), "to".into()));
            None
        }
        Some(_) => {
            details.push(("must be a string".into(), "to".into()));
            None
        }
    };
    if let Some(v) = obj.get("notificationDisabled") {
        if !v.is_boolean() {
            details.push(("must be a boolean".into(), "notificationDisabled".into()));
        }
    }
    let mut texts = Vec::new();
    let messages = check_messages(&obj, &mut details, &mut texts);
    match (to, details.is_empty()) {
        (Some(to), true) => Ok(Push {
            to,
            messages,
            texts,
        }),
        (to, _) => Err(Invalid { to, details }),
    }
}

fn check_messages(
    obj: &Map<String, Value>,
    details: &mut Vec<(String, String)>,
    texts: &mut Vec<String>,
) -> Vec<Value> {
    let list = match obj.get("messages") {
        None | Some(Value::Null) => {
            details.push(("must be specified".into(), "messages".into()));
            return Vec::new();
        }
        Some(Value::Array(a)) => a,
        Some(_) => {
            details.push(("must be an array".into(), "messages".into()));
            return Vec::new();
        }
    };
    if list.is_empty() || list.len() > MAX_MESSAGES {
        details.push((
            format!("Size must be between 1 and {MAX_MESSAGES}"),
            "messages".into(),
        ));
    }
    for (i, m) in list.iter().enumerate() {
        let Some(m) = m.as_object() else {
            details.push(("must be an object".into(), format!("messages[{i}]")));
            continue;
        };
        match m.get("type").and_then(Value::as_str) {
            None => details.push(("must be specified".into(), format!("messages[{i}].type"))),
            Some("text") => match m.get("text").and_then(Value::as_str) {
                None => details.push(("must be specified".into(), format!("messages[{i}].text"))),
                Some(t) if t.chars().count() > MAX_TEXT => details.push((
                    format!("Length must be between 0 and {MAX_TEXT}"),
                    format!("messages[{i}].text"),
                )),
                Some(t) => texts.push(t.to_string()),
            },
            Some(_) => {}
        }
    }
    list.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_table() {
        let long = "あ".repeat(MAX_TEXT + 1);
        let exact = "a".repeat(MAX_TEXT);
        let uid = "U0123456789abcdef0123456789abcdef";
        let text = |t: &str| format!(r#"{{"type":"text","text":"{t}"}}"#);
        let six = vec![text("x"); 6].join(",");
        // (body, Ok(number of texts) or Err(properties))
        let cases: Vec<(String, Result<usize, Vec<&str>>)> = vec![
            (
                format!(r#"{{"to":"{uid}","messages":[{}]}}"#, text("hi")),
                Ok(1),
            ),
            (
                format!(r#"{{"to":"{uid}","messages":[{}]}}"#, text(&exact)),
                Ok(1),
            ),
            (
                format!(r#"{{"to":"{uid}","messages":[{{"type":"sticker","packageId":"1"}}]}}"#),
                Ok(0),
            ),
            ("{not json".into(), Err(vec![""])),
            ("[]".into(), Err(vec![""])),
            (
                format!(r#"{{"messages":[{}]}}"#, text("hi")),
                Err(vec!["to"]),
            ),
            (
                format!(r#"{{"to":"{uid}","messages":[]}}"#),
                Err(vec!["messages"]),
            ),
            (format!(r#"{{"to":"{uid}"}}"#), Err(vec!["messages"])),
            (
                format!(r#"{{"to":"{uid}","messages":[{six}]}}"#),
                Err(vec!["messages"]),
            ),
            (
                format!(r#"{{"to":"{uid}","messages":[{}]}}"#, text(&long)),
                Err(vec!["messages[0].text"]),
            ),
            (
                format!(r#"{{"to":"{uid}","messages":[{{"type":"text"}}]}}"#),
                Err(vec!["messages[0].text"]),
            ),
            (
                format!(r#"{{"to":"{uid}","messages":[{{"text":"x"}}]}}"#),
                Err(vec!["messages[0].type"]),
            ),
            (
                format!(
                    r#"{{"to":"{uid}","messages":[{}],"notificationDisabled":"yes"}}"#,
                    text("x")
                ),
                Err(vec!["notificationDisabled"]),
            ),
            (
                r#"{"to":5,"messages":[]}"#.into(),
                Err(vec!["to", "messages"]),
            ),
        ];
        for (body, want) in cases {
            let got = parse(body.as_bytes())
                .map(|p| p.texts.len())
                .map_err(|e| e.details.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>());
            let want = want.map_err(|v| v.into_iter().map(String::from).collect::<Vec<_>>());
            assert_eq!(got, want, "body {}", &body[..body.len().min(80)]);
        }
    }

    #[test]
    fn user_ids() {
        let cases = [
            ("U0123456789abcdef0123456789abcdef", true),
            ("U0123456789ABCDEF0123456789abcdef", false),
            ("C0123456789abcdef0123456789abcdef", false),
            ("U0123456789abcdef0123456789abcde", false),
            ("", false),
        ];
        for (id, want) in cases {
            assert_eq!(is_user_id(id), want, "{id}");
        }
    }
}
