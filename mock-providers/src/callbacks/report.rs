//! One delivery report as it waits in the queue: small, and rendered into its request only when
//! a try begins.
//!
//! A flood keeps a hundred thousand reports or more due at once, so a waiting report holds no
//! body, header or URL of its own: what every report about one accepted message repeats (its
//! receiver's URL, the recipient, the SMS's numbers, the signing key, the retry policy) is one
//! shared [`Message`], and a [`Report`] keeps only what differs (status, event id, variant,
//! times). [`Report::request`] renders the same bytes every time it is called, so a retry or a
//! duplicate is byte-identical to its original, as when the body was fixed at scheduling.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::plan::Planned;
use crate::ledger::{CallbackVariant, Provider};
use crate::signing;

/// How a report's receiver is retried (the provider's callback profile when it was scheduled).
#[derive(Clone, Copy, Debug)]
pub(super) struct Policy {
    pub retry_on_error: bool,
    pub max_retries: u32,
    pub timeout: Duration,
}

impl Policy {
    /// Tries counted against the receiver at most.
    pub fn tries(&self) -> u32 {
        if self.retry_on_error {
            1 + self.max_retries
        } else {
            1
        }
    }
}

/// What the reports about one accepted message share.
#[derive(Debug)]
pub(super) struct Message {
    pub provider: Provider,
    /// The ledger's recipient: the SMS's `To`, the e-mail's RCPT address.
    pub recipient: Box<str>,
    pub attempt: u32,
    pub url: Box<str>,
    pub policy: Policy,
    pub form: Form,
}

/// How a message's reports are written and signed.
#[derive(Debug)]
pub(super) enum Form {
    /// Twilio status callbacks: form-encoded, signed over the URL and the parameters.
    Sms {
        sid: Box<str>,
        from: Box<str>,
        messaging_service_sid: Option<Box<str>>,
        account_sid: Arc<str>,
        auth_token: Arc<str>,
    },
    /// E-mail delivery events: JSON, signed over the body with the events secret.
    Email {
        message_id: Box<str>,
        /// When the message was accepted: an event's `timestamp` is this plus its stamp.
        accepted: DateTime<Utc>,
        secret: Arc<str>,
    },
}

impl Message {
    /// The message's own id: the SMS sid or the e-mail's Message-ID.
    fn own_id(&self) -> &str {
        match &self.form {
            Form::Sms { sid, .. } => sid,
            Form::Email { message_id, .. } => message_id,
        }
    }
}

/// One report about a [`Message`]: what [`Planned`] says, without its send time (the queue's
/// key) and with the message id only when it is not the message's own (an unknown-id report).
#[derive(Debug)]
pub(super) struct Report {
    pub message: Arc<Message>,
    pub status: &'static str,
    pub token: Uuid,
    pub variant: CallbackVariant,
    pub error_code: Option<u32>,
    pub reason: Option<&'static str>,
    /// When the reported event happened, after acceptance (an e-mail event's `timestamp`).
    pub stamp: Duration,
    other_id: Option<Box<str>>,
}

/// A report's request, rendered for one try.
pub(super) struct Request {
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
}

impl Report {
    pub fn new(message: Arc<Message>, p: Planned) -> Report {
        let other_id = (p.message_id != message.own_id()).then(|| p.message_id.into());
        Report {
            message,
            status: p.status,
            token: p.token,
            variant: p.variant,
            error_code: p.error_code,
            reason: p.reason,
            stamp: p.stamp,
            other_id,
        }
    }

    /// The message the report is about (a made-up one for [`CallbackVariant::UnknownId`]).
    pub fn message_id(&self) -> &str {
        self.other_id
            .as_deref()
            .unwrap_or_else(|| self.message.own_id())
    }

    /// The body and headers of a try; the same bytes every time.
    pub fn request(&self) -> Request {
        match &self.message.form {
            Form::Sms {
                from,
                messaging_service_sid,
                account_sid,
                auth_token,
                ..
            } => {
                let id = self.message_id();
                let mut params: Vec<(&str, String)> = vec![
                    ("MessageSid", id.to_string()),
                    ("SmsSid", id.to_string()),
                    ("MessageStatus", self.status.to_string()),
                    ("SmsStatus", self.status.to_string()),
                    ("AccountSid", account_sid.to_string()),
                    ("To", self.message.recipient.to_string()),
                    ("From", from.to_string()),
                    ("ApiVersion", "2010-04-01".to_string()),
                ];
                if let Some(ms) = messaging_service_sid {
                    params.push(("MessagingServiceSid", ms.to_string()));
                }
                if let Some(code) = self.error_code {
                    params.push(("ErrorCode", code.to_string()));
                }
                let mut headers = Vec::with_capacity(2);
                if let Some(key) = signing_key(self.variant, auth_token) {
                    let signature = signing::twilio_signature(&key, &self.message.url, &params);
                    headers.push(("x-twilio-signature", signature));
                }
                headers.push(("i-twilio-idempotency-token", self.token.to_string()));
                let body = serde_urlencoded::to_string(&params).unwrap_or_default();
                Request {
                    content_type: "application/x-www-form-urlencoded",
                    body: body.into_bytes(),
                    headers,
                }
            }
            Form::Email {
                accepted, secret, ..
            } => {
                let stamp = *accepted
                    + chrono::Duration::from_std(self.stamp)
                        .unwrap_or_else(|_| chrono::Duration::zero());
                let body = serde_json::json!({
                    "id": self.token.to_string(),
                    "type": self.status,
                    "message_id": self.message_id(),
                    "recipient": self.message.recipient,
                    "timestamp": stamp.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    "reason": self.reason,
                });
                let body = serde_json::to_vec(&body).unwrap_or_default();
                let headers = signing_key(self.variant, secret)
                    .map(|key| ("x-ting-signature", signing::ting_signature(&key, &body)))
                    .into_iter()
                    .collect();
                Request {
                    content_type: "application/json",
                    body,
                    headers,
                }
            }
        }
    }
}

/// The key a report is signed with: the provider's own, a wrong one
/// ([`CallbackVariant::ForgedSignature`]), or none, so no signature header at all
/// ([`CallbackVariant::Unsigned`]).
fn signing_key(variant: CallbackVariant, key: &str) -> Option<String> {
    match variant {
        CallbackVariant::Unsigned => None,
        CallbackVariant::ForgedSignature => Some(format!("{key}-forged")),
        _ => Some(key.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sms() -> Arc<Message> {
        Arc::new(Message {
            provider: Provider::Sms,
            recipient: "+15550001".into(),
            attempt: 1,
            url: "http://127.0.0.1:1/cb".into(),
            policy: Policy {
                retry_on_error: true,
                max_retries: 2,
                timeout: Duration::from_secs(1),
            },
            form: Form::Sms {
                sid: "SM1".into(),
                from: "+15559999".into(),
                messaging_service_sid: None,
                account_sid: "AC1".into(),
                auth_token: "secret".into(),
            },
        })
    }

    /// A waiting report is a pointer to its message and a few words: a flood of them stays small.
    #[test]
    fn a_waiting_report_is_small() {
        let size = std::mem::size_of::<Report>();
        assert!(size <= 104, "Report grew to {size} bytes");
    }

    /// Rendered twice, a report is the same bytes; the message id is the message's own unless
    /// the plan made one up.
    #[test]
    fn a_report_renders_the_same_request_every_time() {
        let cfg = crate::config::CallbackConfig {
            enabled: true,
            unknown_id_rate: crate::units::Ratio(1.0),
            ..Default::default()
        };
        let plan = super::super::plan::sms(7, "+15550001", 1, "SM1", &cfg);
        assert!(plan.reports.len() >= 3, "genuine reports and an unknown id");
        for p in plan.reports {
            let unknown = p.variant == CallbackVariant::UnknownId;
            let id = p.message_id.clone();
            let r = Report::new(sms(), p);
            assert_eq!(r.other_id.is_some(), unknown);
            assert_eq!(r.message_id(), id);
            let (a, b) = (r.request(), r.request());
            assert_eq!(a.body, b.body);
            assert_eq!(a.headers, b.headers);
            let body = String::from_utf8(a.body).unwrap();
            assert!(body.contains(&format!("MessageSid={id}")), "{body}");
        }
    }
}
