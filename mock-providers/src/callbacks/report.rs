//! One delivery report as it waits in the queue: small, and rendered into its request only when
//! a try begins.
//!
//! A flood keeps a hundred thousand reports or more due at once, so a waiting report holds no
//! body, header or URL of its own, and no allocation of its own but the made-up message id of
//! an unknown-id report: what every report about one
//! accepted message repeats (its receiver's URL, the recipient, the SMS's numbers, the signing
//! key, the retry policy, when its reports were scheduled and in which epoch) is one shared
//! [`Message`] — for an SMS, the packed SID and number and the SMS store's own shared origin and
//! URL, not copies — and a [`Report`] keeps only what differs (status, event id, variant, time),
//! 48 bytes inline in the queue: the status one byte ([`Status`]), the rare made-up id behind
//! one pointer. Twilio's error code and an e-mail event's reason follow from the status
//! ([`plan::error_code`], [`plan::reason`]). [`Report::request`] renders the same bytes every
//! time it is called, so a retry or a duplicate is byte-identical to its original, as when the
//! body was fixed at scheduling.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use uuid::Uuid;

use super::plan::{self, Planned};
use crate::ledger::{CallbackVariant, Provider};
use crate::packed::{Phone, Sid};
use crate::signing;
use crate::sms::store::Origin;

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
    pub attempt: u32,
    /// When its reports were scheduled (all at once): their receiver-down patience runs from
    /// there.
    pub since: Instant,
    /// The dispatcher's epoch then: a report of an earlier epoch was cancelled.
    pub epoch: u64,
    /// The receiver's URL, shared with every message that names the same one.
    pub url: Arc<str>,
    pub policy: Policy,
    pub form: Form,
}

/// How a message's reports are written and signed.
#[derive(Debug)]
pub(super) enum Form {
    /// Twilio status callbacks: form-encoded, signed over the URL and the parameters.
    Sms {
        sid: Sid,
        to: Phone,
        /// The account and sender, as the SMS store shares them.
        origin: Arc<Origin>,
        account_sid: Arc<str>,
        auth_token: Arc<str>,
    },
    /// E-mail delivery events: JSON, signed over the body with the events secret.
    Email {
        /// The RCPT address and then the Message-ID, in one allocation ([`Form::email`]).
        texts: Box<str>,
        recipient_len: u32,
        /// When the message was accepted: an event's `timestamp` is this plus its stamp.
        accepted: DateTime<Utc>,
        secret: Arc<str>,
    },
}

impl Form {
    /// An e-mail's form: `recipient` and `message_id` kept in one allocation.
    pub fn email(
        recipient: &str,
        message_id: &str,
        accepted: DateTime<Utc>,
        secret: Arc<str>,
    ) -> Form {
        Form::Email {
            texts: [recipient, message_id].concat().into(),
            // A recipient longer than 4 GiB is not an SMTP address; cut at the whole text then.
            recipient_len: u32::try_from(recipient.len()).unwrap_or(u32::MAX),
            accepted,
            secret,
        }
    }
}

impl Message {
    pub fn provider(&self) -> Provider {
        match self.form {
            Form::Sms { .. } => Provider::Sms,
            Form::Email { .. } => Provider::Smtp,
        }
    }

    /// The ledger's recipient: the SMS's `To`, the e-mail's RCPT address.
    pub fn recipient(&self) -> Cow<'_, str> {
        match &self.form {
            Form::Sms { to, .. } => Cow::Owned(to.to_string()),
            Form::Email {
                texts,
                recipient_len,
                ..
            } => Cow::Borrowed(texts.get(..*recipient_len as usize).unwrap_or(texts)),
        }
    }

    /// The message's own id: the SMS sid or the e-mail's Message-ID.
    fn own_id(&self) -> Cow<'_, str> {
        match &self.form {
            Form::Sms { sid, .. } => Cow::Owned(sid.to_string()),
            Form::Email {
                texts,
                recipient_len,
                ..
            } => Cow::Borrowed(texts.get(*recipient_len as usize..).unwrap_or_default()),
        }
    }

    /// Whether `id` is the message's own id.
    fn is_own_id(&self, id: &str) -> bool {
        match &self.form {
            Form::Sms { sid, .. } => Sid::parse(id) == Some(*sid),
            Form::Email { .. } => self.own_id() == id,
        }
    }
}

/// A report's status, one of those the plans give ([`plan`]: an SMS's status, an e-mail
/// event's type): one byte in the queue, the plan's text when rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Status {
    Sent,
    Delivered,
    Undelivered,
    Failed,
    Processed,
    Deferred,
    Bounced,
    Complained,
}

impl Status {
    const ALL: [Status; 8] = [
        Status::Sent,
        Status::Delivered,
        Status::Undelivered,
        Status::Failed,
        Status::Processed,
        Status::Deferred,
        Status::Bounced,
        Status::Complained,
    ];

    /// The status as the plan spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Sent => "sent",
            Status::Delivered => "delivered",
            Status::Undelivered => "undelivered",
            Status::Failed => "failed",
            Status::Processed => "processed",
            Status::Deferred => "deferred",
            Status::Bounced => "bounced",
            Status::Complained => "complained",
        }
    }

    /// The status spelled `text`, if it is one of these.
    fn of(text: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// One report about a [`Message`]: what [`Planned`] says, without its send time (the queue's
/// key) and with the message id only when it is not the message's own (an unknown-id report).
#[derive(Debug)]
pub(super) struct Report {
    pub message: Arc<Message>,
    pub token: Uuid,
    /// When the reported event happened, after acceptance (an e-mail event's `timestamp`), in
    /// nanoseconds (saturating at 584 years).
    stamp_ns: u64,
    /// What only a rare report says: none for most, one pointer for all.
    unusual: Option<Box<Unusual>>,
    /// The status; `None` when it is not a [`Status`] (then `unusual` keeps it).
    status: Option<Status>,
    pub variant: CallbackVariant,
}

/// What a rare report says that neither its [`Message`] nor [`Status`] can: the made-up
/// message id of an unknown-id report, or a status no plan gives (kept so that any [`Planned`]
/// renders as it says).
#[derive(Debug)]
struct Unusual {
    message_id: Option<Box<str>>,
    status: Option<&'static str>,
}

/// A report's request, rendered for one try.
pub(super) struct Request {
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
}

impl Report {
    pub fn new(message: Arc<Message>, p: Planned) -> Report {
        let status = Status::of(p.status);
        let unusual = Unusual {
            message_id: (!message.is_own_id(&p.message_id)).then(|| p.message_id.into()),
            status: status.is_none().then_some(p.status),
        };
        let rare = unusual.message_id.is_some() || unusual.status.is_some();
        Report {
            message,
            token: p.token,
            stamp_ns: u64::try_from(p.stamp.as_nanos()).unwrap_or(u64::MAX),
            unusual: rare.then(|| Box::new(unusual)),
            status,
            variant: p.variant,
        }
    }

    /// The status the report gives, as the plan spelled it.
    pub fn status(&self) -> &'static str {
        let unusual = || self.unusual.as_ref()?.status;
        // `new` keeps every status: as a `Status`, or in `unusual`.
        self.status
            .map(Status::as_str)
            .or_else(unusual)
            .unwrap_or_default()
    }

    /// The made-up message id of an unknown-id report; none for a report about its own message.
    fn other_id(&self) -> Option<&str> {
        self.unusual.as_ref()?.message_id.as_deref()
    }

    /// The message the report is about (a made-up one for [`CallbackVariant::UnknownId`]).
    pub fn message_id(&self) -> Cow<'_, str> {
        match self.other_id() {
            Some(id) => Cow::Borrowed(id),
            None => self.message.own_id(),
        }
    }

    /// The body and headers of a try; the same bytes every time.
    pub fn request(&self) -> Request {
        let status = self.status();
        match &self.message.form {
            Form::Sms {
                to,
                origin,
                account_sid,
                auth_token,
                ..
            } => {
                let id = self.message_id().into_owned();
                let mut params: Vec<(&str, String)> = vec![
                    ("MessageSid", id.clone()),
                    ("SmsSid", id),
                    ("MessageStatus", status.to_string()),
                    ("SmsStatus", status.to_string()),
                    ("AccountSid", account_sid.to_string()),
                    ("To", to.to_string()),
                    ("From", origin.sender().unwrap_or_default()),
                    ("ApiVersion", "2010-04-01".to_string()),
                ];
                if let Some(ms) = &origin.messaging_service_sid {
                    params.push(("MessagingServiceSid", ms.to_string()));
                }
                if let Some(code) = plan::error_code(status) {
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
                    + chrono::Duration::from_std(Duration::from_nanos(self.stamp_ns))
                        .unwrap_or_else(|_| chrono::Duration::zero());
                let body = serde_json::json!({
                    "id": self.token.to_string(),
                    "type": status,
                    "message_id": self.message_id(),
                    "recipient": self.message.recipient(),
                    "timestamp": stamp.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    "reason": plan::reason(status),
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
            attempt: 1,
            since: Instant::now(),
            epoch: 0,
            url: "http://127.0.0.1:1/cb".into(),
            policy: Policy {
                retry_on_error: true,
                max_retries: 2,
                timeout: Duration::from_secs(1),
            },
            form: Form::Sms {
                sid: Sid::parse(SID).unwrap(),
                to: Phone::parse("+15550001").unwrap(),
                origin: Arc::new(Origin {
                    account_sid: "AC1".into(),
                    from: Some("+15559999".into()),
                    messaging_service_sid: None,
                }),
                account_sid: "AC1".into(),
                auth_token: "secret".into(),
            },
        })
    }

    const SID: &str = "SM0000000000000000000000000000000a";

    fn email() -> Arc<Message> {
        Arc::new(Message {
            attempt: 1,
            since: Instant::now(),
            epoch: 0,
            url: "http://127.0.0.1:1/events".into(),
            policy: Policy {
                retry_on_error: false,
                max_retries: 0,
                timeout: Duration::from_secs(1),
            },
            form: Form::email("a@b.test", "<m1@x>", Utc::now(), "s".into()),
        })
    }

    /// A waiting report is a pointer to its message and a few words, with no allocation of its
    /// own unless the plan made up its message id: a flood of them stays small.
    #[test]
    fn a_waiting_report_is_small() {
        let size = std::mem::size_of::<Report>();
        assert!(size <= 48, "Report grew to {size} bytes");
    }

    /// Every status a plan gives is a [`Status`], kept as one byte and rendered as the plan
    /// spelled it; a status no plan gives is kept aside and rendered as given all the same.
    #[test]
    fn statuses_are_kept_as_a_byte_and_rendered_as_planned() {
        let cfg = |rate| crate::config::CallbackConfig {
            enabled: true,
            processed: true,
            fail_rate: crate::units::Ratio(rate),
            deferred_rate: crate::units::Ratio(rate),
            complaint_rate: crate::units::Ratio(rate),
            forged_rate: crate::units::Ratio(rate),
            stale_rate: crate::units::Ratio(rate),
            ..Default::default()
        };
        let mut seen = std::collections::BTreeSet::new();
        for (seed, rate) in (0..20).flat_map(|seed| [(seed, 0.0), (seed, 0.5), (seed, 1.0)]) {
            let sms_plan = plan::sms(seed, "+15550001", 1, SID, &cfg(rate)).reports;
            let reports = sms_plan.into_iter().map(|p| Report::new(sms(), p));
            let mail = plan::email(seed, "a@b.test", 1, "<m1@x>", &cfg(rate));
            for r in reports.chain(mail.into_iter().map(|p| Report::new(email(), p))) {
                let status = r.status.expect("a planned status is a Status");
                assert!(r.unusual.is_none() || r.variant == CallbackVariant::UnknownId);
                assert_eq!(r.status(), status.as_str());
                seen.insert(r.status());
            }
        }
        let all: std::collections::BTreeSet<_> = Status::ALL.map(Status::as_str).into();
        assert_eq!(seen, all, "every Status planned, and no other");
        let mut odd = plan::sms(1, "+15550001", 1, SID, &cfg(0.0))
            .reports
            .remove(0);
        odd.status = "queued";
        let r = Report::new(sms(), odd);
        assert_eq!((r.status, r.status()), (None, "queued"));
        let body = String::from_utf8(r.request().body).unwrap();
        assert!(
            body.contains("MessageStatus=queued&SmsStatus=queued"),
            "{body}"
        );
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
        let plan = plan::sms(7, "+15550001", 1, SID, &cfg);
        assert!(plan.reports.len() >= 3, "genuine reports and an unknown id");
        for p in plan.reports {
            let unknown = p.variant == CallbackVariant::UnknownId;
            let id = p.message_id.clone();
            let r = Report::new(sms(), p);
            assert_eq!(r.other_id().is_some(), unknown);
            assert_eq!(r.message_id(), id);
            let (a, b) = (r.request(), r.request());
            assert_eq!(a.body, b.body);
            assert_eq!(a.headers, b.headers);
            let body = String::from_utf8(a.body).unwrap();
            assert!(body.contains(&format!("MessageSid={id}")), "{body}");
            assert!(body.contains("To=%2B15550001&From=%2B15559999"), "{body}");
        }
    }

    /// The status decides what else a report says: a failed SMS its Twilio error code, a bounce
    /// or deferral its reason; a report of any other status neither.
    #[test]
    fn error_codes_and_reasons_follow_the_status() {
        let cfg = |fail| crate::config::CallbackConfig {
            enabled: true,
            fail_rate: crate::units::Ratio(fail),
            forged_rate: crate::units::Ratio(1.0),
            deferred_rate: crate::units::Ratio(1.0),
            ..Default::default()
        };
        let mut seen = std::collections::BTreeSet::new();
        for fail in [0.0, 1.0] {
            for p in plan::sms(3, "+15550001", 1, SID, &cfg(fail)).reports {
                let status = p.status;
                let body = String::from_utf8(Report::new(sms(), p).request().body).unwrap();
                let code = match status {
                    "undelivered" => Some("ErrorCode=30003"),
                    "failed" => Some("ErrorCode=30008"),
                    _ => None,
                };
                assert_eq!(code.is_some(), body.contains("ErrorCode="), "{body}");
                assert!(code.is_none_or(|c| body.ends_with(c)), "{body}");
                seen.insert(status);
            }
            for p in plan::email(3, "a@b.test", 1, "<m1@x>", &cfg(fail)) {
                let status = p.status;
                let body = Report::new(email(), p).request().body;
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let reason = match status {
                    "bounced" => serde_json::json!("550 5.1.1 mailbox unavailable"),
                    "deferred" => serde_json::json!("451 4.2.0 mailbox busy, will retry"),
                    _ => serde_json::Value::Null,
                };
                assert_eq!(v["reason"], reason, "{v}");
                assert_eq!(v["recipient"], "a@b.test");
                seen.insert(status);
            }
        }
        for status in ["sent", "delivered", "deferred", "bounced"] {
            assert!(seen.contains(status), "{status} not exercised: {seen:?}");
        }
        assert!(
            seen.contains("undelivered") || seen.contains("failed"),
            "{seen:?}"
        );
    }
}
