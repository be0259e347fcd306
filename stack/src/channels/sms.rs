//! Twilio-style SMS: create (`POST …/Messages.json`, form-encoded, HTTP Basic), fetch one
//! (`GET …/Messages/{sid}.json`) for polling, and list (`GET …/Messages.json?To=…&DateSent>=…`)
//! to reconcile an attempt whose answer was lost. Also Twilio's callback signature.
//!
//! Twilio has no idempotency key, so a create after an ambiguous attempt must be preceded by a
//! list lookup (done by the worker and the rescuer). This module must never decide states.

use std::sync::Arc;

use base64::Engine;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::Deserialize;

use super::{class, http_error, retry_after, Outcome};
use crate::claim::Claimed;
use crate::config::Config;

#[derive(Clone)]
pub struct SmsClient {
    http: reqwest::Client,
    cfg: Arc<Config>,
}

/// One message as the provider reports it.
#[derive(Clone, Debug, Deserialize)]
pub struct Message {
    pub sid: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub to: Option<String>,
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub body: Option<String>,
    /// RFC 2822, as Twilio spells it.
    #[serde(default)]
    pub date_created: Option<String>,
    #[serde(default)]
    pub error_code: Option<serde_json::Value>,
    #[serde(default)]
    pub error_message: Option<String>,
}

/// What a reported status means for the delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    Delivered,
    Failed(String),
    /// queued / sending / sent / accepted: nothing final yet.
    Pending,
}

impl Message {
    pub fn report(&self) -> Report {
        report(
            &self.status,
            self.error_code.as_ref().map(|c| c.to_string()),
            self.error_message.as_deref(),
        )
    }
}

/// Twilio `MessageStatus` → report.
pub fn report(status: &str, code: Option<String>, message: Option<&str>) -> Report {
    match status {
        "delivered" | "read" => Report::Delivered,
        "undelivered" | "failed" | "canceled" => Report::Failed(format!(
            "{status} {}{}",
            code.map(|c| c.trim_matches('"').to_string())
                .unwrap_or_default(),
            message.map(|m| format!(": {m}")).unwrap_or_default()
        )),
        _ => Report::Pending,
    }
}

/// One page of `GET …/Messages.json`.
#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    messages: Vec<Message>,
    /// Twilio's link to the next page (a path on the API host), absent or null on the last one.
    #[serde(default)]
    next_page_uri: Option<String>,
}

/// Most pages one lookup reads (1 000 messages each) before it gives up as "cannot tell".
pub const MAX_LOOKUP_PAGES: usize = 20;

impl SmsClient {
    pub fn new(http: reqwest::Client, cfg: Arc<Config>) -> SmsClient {
        SmsClient { http, cfg }
    }

    fn messages_url(&self) -> String {
        format!(
            "{}/2010-04-01/Accounts/{}/Messages",
            self.cfg.sms_api_base.trim_end_matches('/'),
            self.cfg.sms_account_sid
        )
    }

    /// Creates the message. The status callback carries the delivery id so a report that
    /// overtakes the worker's own bookkeeping still finds its row.
    pub async fn create(&self, d: &Claimed) -> Outcome {
        let callback = format!("{}?d={}", self.cfg.sms_status_callback(), d.id);
        let form = [
            ("To", d.address.as_str()),
            ("From", self.cfg.sms_from.as_str()),
            ("Body", d.payload.text.as_str()),
            ("StatusCallback", callback.as_str()),
        ];
        let resp = self
            .http
            .post(format!("{}.json", self.messages_url()))
            .basic_auth(&self.cfg.sms_account_sid, Some(&self.cfg.sms_auth_token))
            .form(&form)
            .send()
            .await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => return http_error(&e),
        };
        let status = resp.status().as_u16();
        let ra = retry_after(resp.headers());
        let text = resp.text().await.unwrap_or_default();
        classify(status, &text, ra)
    }

    /// `GET …/Messages/{sid}.json`.
    pub async fn fetch(&self, sid: &str) -> anyhow::Result<Message> {
        let resp = self
            .http
            .get(format!("{}/{sid}.json", self.messages_url()))
            .basic_auth(&self.cfg.sms_account_sid, Some(&self.cfg.sms_auth_token))
            .send()
            .await?
            .error_for_status()?;
        Ok(resp.json().await?)
    }

    /// Every message to `to` with exactly `body`, from our number, created at or after `since`,
    /// oldest first: the candidates an uncertain attempt may have created. Reads every page
    /// (`next_page_uri`), up to [`MAX_LOOKUP_PAGES`]; more than that is an error (the caller
    /// then cannot tell, and does not resend).
    ///
    /// The provider-side filter is `DateSent>=` the day of `since` (Twilio filters by day); the
    /// exact bound is applied here on `date_created`. A message without a readable
    /// `date_created` is kept: missing one that landed would send it twice.
    pub async fn find(
        &self,
        to: &str,
        body: &str,
        since: DateTime<Utc>,
    ) -> anyhow::Result<Vec<Message>> {
        let date = since.format("%Y-%m-%d").to_string();
        let first = reqwest::Url::parse_with_params(
            &format!("{}.json", self.messages_url()),
            &[
                ("To", to),
                ("DateSent>", date.as_str()),
                ("PageSize", "1000"),
            ],
        )?;
        let mut url = first.clone();
        let mut found: Vec<(Option<DateTime<Utc>>, Message)> = Vec::new();
        for _ in 0..MAX_LOOKUP_PAGES {
            let page: Page = self
                .http
                .get(url.clone())
                .basic_auth(&self.cfg.sms_account_sid, Some(&self.cfg.sms_auth_token))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            for m in page.messages {
                let created = m
                    .date_created
                    .as_deref()
                    .and_then(|d| DateTime::parse_from_rfc2822(d).ok())
                    .map(|d| d.with_timezone(&Utc));
                let ours = m.body.as_deref() == Some(body)
                    && m.to.as_deref().is_none_or(|t| t == to)
                    && m.from.as_deref().is_none_or(|f| f == self.cfg.sms_from)
                    && created.is_none_or(|c| c >= since);
                if ours && !found.iter().any(|(_, f)| f.sid == m.sid) {
                    found.push((created, m));
                }
            }
            match page.next_page_uri.filter(|u| !u.trim().is_empty()) {
                // A path on the API's host (or, from some fakes, a full URL).
                Some(next) => url = first.join(&next)?,
                None => {
                    found.sort_by_key(|a| a.0);
                    return Ok(found.into_iter().map(|(_, m)| m).collect());
                }
            }
        }
        anyhow::bail!("more than {MAX_LOOKUP_PAGES} pages of messages to {to}")
    }
}

/// The create answer → outcome.
pub fn classify(status: u16, body: &str, retry_after: Option<std::time::Duration>) -> Outcome {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let code = v["code"].as_u64();
    let message = v["message"].as_str().unwrap_or("").to_string();
    let error = match code {
        Some(c) => format!("{status} {c}: {message}"),
        None => format!("{status} {message}"),
    };
    match status {
        200..=299 => Outcome::Accepted {
            provider_id: v["sid"].as_str().map(str::to_string),
            done: false,
        },
        429 => Outcome::Retry {
            class: class::TRANSIENT,
            error,
            retry_after,
        },
        // A 5xx may come after the provider committed the message: resend only after a lookup.
        500..=599 => Outcome::Retry {
            class: class::AMBIGUOUS,
            error,
            retry_after,
        },
        _ => Outcome::Permanent { error },
    }
}

/// Twilio's `X-Twilio-Signature`: base64(HMAC-SHA1(auth_token, url + every POST parameter's
/// name and value, sorted by name)).
pub fn twilio_signature(auth_token: &str, url: &str, params: &[(String, String)]) -> String {
    base64::engine::general_purpose::STANDARD
        .encode(twilio_mac(auth_token, url, params).finalize().into_bytes())
}

fn twilio_mac(auth_token: &str, url: &str, params: &[(String, String)]) -> Hmac<sha1::Sha1> {
    let mut sorted: Vec<&(String, String)> = params.iter().collect();
    sorted.sort();
    let mut mac =
        Hmac::<sha1::Sha1>::new_from_slice(auth_token.as_bytes()).expect("hmac takes any key");
    mac.update(url.as_bytes());
    for (k, v) in sorted {
        mac.update(k.as_bytes());
        mac.update(v.as_bytes());
    }
    mac
}

/// Checks a received signature in constant time (`Mac::verify_slice`, as the e-mail events'
/// check does); a signature that is not base64 is simply wrong.
pub fn verify_twilio(auth_token: &str, url: &str, params: &[(String, String)], got: &str) -> bool {
    let Ok(sig) = base64::engine::general_purpose::STANDARD.decode(got.trim()) else {
        return false;
    };
    twilio_mac(auth_token, url, params)
        .verify_slice(&sig)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twilio_published_vector() {
        // From Twilio's security documentation and its helper libraries' test suites.
        let params: Vec<(String, String)> = [
            ("CallSid", "CA1234567890ABCDE"),
            ("Caller", "+12349013030"),
            ("Digits", "1234"),
            ("From", "+12349013030"),
            ("To", "+18005551212"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let url = "https://mycompany.com/myapp.php?foo=1&bar=2";
        assert_eq!(
            twilio_signature("12345", url, &params),
            "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
        );
        assert!(verify_twilio(
            "12345",
            url,
            &params,
            "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
        ));
        assert!(!verify_twilio(
            "12345",
            url,
            &params,
            "1/KCTR6DLpKmkAf8muzZqo1nDgQ="
        ));
        assert!(!verify_twilio("12345", url, &params, "not base64 at all"));
        assert!(!verify_twilio("12345", url, &params, ""));
        assert!(!verify_twilio(
            "54321",
            url,
            &params,
            "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
        ));
        // The twilio-python variant of the same vector.
        let other: Vec<(String, String)> = params
            .iter()
            .map(|(k, v)| (k.clone(), v.replace("+12349013030", "+14158675309")))
            .collect();
        assert_eq!(
            twilio_signature("12345", url, &other),
            "RSOYDt4T1cUTdK1PDd93/VVr8B8="
        );
    }

    #[test]
    fn classification_table() {
        let cases: &[(u16, &str, &str)] = &[
            (201, r#"{"sid":"SM1","status":"queued"}"#, "accepted"),
            (
                429,
                r#"{"code":20429,"message":"Too Many Requests"}"#,
                "transient",
            ),
            (500, "", "ambiguous"),
            (503, "", "ambiguous"),
            (
                400,
                r#"{"code":21211,"message":"The 'To' number is not a valid phone number."}"#,
                "permanent",
            ),
            (
                400,
                r#"{"code":21610,"message":"Attempt to send to unsubscribed recipient"}"#,
                "permanent",
            ),
        ];
        for (status, body, want) in cases {
            let got = match classify(*status, body, None) {
                Outcome::Accepted { .. } => "accepted",
                Outcome::Retry { class, .. } => class,
                Outcome::Permanent { .. } => "permanent",
                Outcome::Unknown { .. } => "unknown",
            };
            assert_eq!(got, *want, "{status} {body}");
        }
        match classify(400, r#"{"code":21610,"message":"unsubscribed"}"#, None) {
            Outcome::Permanent { error } => assert_eq!(error, "400 21610: unsubscribed"),
            o => panic!("{o:?}"),
        }
        assert_eq!(report("delivered", None, None), Report::Delivered);
        assert_eq!(report("sent", None, None), Report::Pending);
        assert!(
            matches!(report("undelivered", Some("30003".into()), None), Report::Failed(e) if e.contains("30003"))
        );
    }
}
