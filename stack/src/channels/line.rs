//! LINE Messaging API push (`POST {base}/v2/bot/message/push`) with a stable `X-Line-Retry-Key`
//! per delivery, so a resend after a crash is safe: LINE answers 409 for a key it already
//! accepted (naming the original request), and that counts as accepted; other 409s do not.
//!
//! This module must never generate a fresh retry key: it is derived from the delivery key.

use std::sync::Arc;

use serde_json::json;

use super::{class, http_error, retry_after, Outcome};
use crate::claim::Claimed;
use crate::config::Config;

#[derive(Clone)]
pub struct LineClient {
    http: reqwest::Client,
    cfg: Arc<Config>,
}

impl LineClient {
    pub fn new(http: reqwest::Client, cfg: Arc<Config>) -> LineClient {
        LineClient { http, cfg }
    }

    pub async fn push(&self, d: &Claimed) -> Outcome {
        let url = format!(
            "{}/v2/bot/message/push",
            self.cfg.line_api_base.trim_end_matches('/')
        );
        let body = json!({"to": d.address, "messages": [{"type": "text", "text": d.payload.text}]});
        let resp = self
            .http
            .post(url)
            .bearer_auth(&self.cfg.line_channel_token)
            .header("X-Line-Retry-Key", &d.correlation_id)
            .json(&body)
            .send()
            .await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => return http_error(&e),
        };
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let text = resp.text().await.unwrap_or_default();
        let accepted_request = header("x-line-accepted-request-id");
        classify(
            status,
            &text,
            retry_after(&headers),
            accepted_request.as_deref(),
            || {
                sent_message_id(&text)
                    .or_else(|| accepted_request.clone())
                    .or_else(|| header("x-line-request-id"))
            },
        )
    }
}

fn sent_message_id(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v["sentMessages"][0]["id"].as_str().map(str::to_string)
}

/// The body LINE sends with a 409 for a retry key it already accepted.
const KEY_ACCEPTED: &str = "retry key is already accepted";

/// LINE's answer → outcome. A 409 counts as accepted only when it is about our own retry key:
/// LINE then names the original request (`x-line-accepted-request-id`) and says "The retry key is
/// already accepted". Any other 409 is a conflict we cannot resolve by waiting: permanent, with
/// LINE's text.
pub fn classify(
    status: u16,
    body: &str,
    retry_after: Option<std::time::Duration>,
    accepted_request_id: Option<&str>,
    provider_id: impl FnOnce() -> Option<String>,
) -> Outcome {
    let message = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.chars().take(300).collect());
    let our_key = accepted_request_id.is_some_and(|id| !id.trim().is_empty())
        || message.to_lowercase().contains(KEY_ACCEPTED);
    match status {
        200..=299 => Outcome::Accepted {
            provider_id: provider_id(),
            done: true,
        },
        409 if our_key => Outcome::Accepted {
            provider_id: provider_id(),
            done: true,
        },
        429 if message.to_lowercase().contains("monthly limit") => Outcome::Permanent {
            error: format!("429 {message}"),
        },
        429 => Outcome::Retry {
            class: class::TRANSIENT,
            error: format!("429 {message}"),
            retry_after,
        },
        500..=599 => Outcome::Retry {
            class: class::AMBIGUOUS,
            error: format!("{status} {message}"),
            retry_after,
        },
        _ => Outcome::Permanent {
            error: format!("{status} {message}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_table() {
        let rid = Some("1c6d1a1b-req");
        // (status, body, x-line-accepted-request-id, expected)
        let cases: &[(u16, &str, Option<&str>, &str)] = &[
            (200, r#"{"sentMessages":[{"id":"1"}]}"#, None, "accepted"),
            // A 409 about our own retry key, as LINE sends it (header and text).
            (
                409,
                r#"{"message":"The retry key is already accepted"}"#,
                rid,
                "accepted",
            ),
            // Either sign alone is enough.
            (409, r#"{"message":"Conflict"}"#, rid, "accepted"),
            (
                409,
                r#"{"message":"The retry key is already accepted"}"#,
                None,
                "accepted",
            ),
            // Any other conflict is not ours to count as sent.
            (409, r#"{"message":"Conflict"}"#, None, "permanent"),
            (409, "", None, "permanent"),
            (409, r#"{"message":"Conflict"}"#, Some(" "), "permanent"),
            (429, r#"{"message":"Too many requests"}"#, None, "retry"),
            (
                429,
                r#"{"message":"You have reached your monthly limit."}"#,
                None,
                "permanent",
            ),
            (500, "", None, "retry"),
            (503, "", None, "retry"),
            (
                400,
                r#"{"message":"The property, 'to', in the request body is invalid"}"#,
                None,
                "permanent",
            ),
            (401, "", None, "permanent"),
        ];
        for (status, body, rid, want) in cases {
            let got = match classify(*status, body, None, *rid, || sent_message_id(body)) {
                Outcome::Accepted { .. } => "accepted",
                Outcome::Retry { .. } => "retry",
                Outcome::Permanent { .. } => "permanent",
                Outcome::Unknown { .. } => "unknown",
            };
            assert_eq!(got, *want, "{status} {body} {rid:?}");
        }
        match classify(400, r#"{"message":"bad to"}"#, None, None, || None) {
            Outcome::Permanent { error } => assert_eq!(error, "400 bad to"),
            o => panic!("{o:?}"),
        }
        match classify(409, r#"{"message":"Conflict"}"#, None, None, || None) {
            Outcome::Permanent { error } => assert_eq!(error, "409 Conflict"),
            o => panic!("{o:?}"),
        }
        let ra = Some(std::time::Duration::from_secs(2));
        match classify(429, "{}", ra, None, || None) {
            Outcome::Retry { retry_after, .. } => assert_eq!(retry_after, ra),
            o => panic!("{o:?}"),
        }
    }
}
