//! The SMS fake's memory of the messages it accepted, and their Twilio JSON representation.
//!
//! A message's status moves along the timeline its callback plan fixed at creation (queued →
//! sent → delivered / undelivered / failed), so a poll and the callbacks never disagree. The
//! store must never hold a message the ledger does not have as accepted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::callbacks::plan::SmsPlan;

/// Twilio's API version segment.
pub const API_VERSION: &str = "2010-04-01";

/// One accepted message.
#[derive(Debug)]
pub struct Stored {
    pub sid: String,
    pub account_sid: String,
    pub to: String,
    pub from: Option<String>,
    pub messaging_service_sid: Option<String>,
    pub body: String,
    pub status_callback: Option<String>,
    pub created: DateTime<Utc>,
    pub created_at: Instant,
    pub attempt: u32,
    pub plan: SmsPlan,
}

/// Twilio's Message resource, serialised as Twilio writes it (keys in alphabetical order, as a
/// `serde_json::Map` would put them).
#[derive(Debug, serde::Serialize)]
pub struct Resource<'a> {
    pub account_sid: &'a str,
    pub api_version: &'static str,
    pub body: &'a str,
    pub date_created: String,
    pub date_sent: Option<String>,
    pub date_updated: String,
    pub direction: &'static str,
    pub error_code: Option<u32>,
    pub error_message: Option<String>,
    pub from: Option<String>,
    pub messaging_service_sid: Option<&'a str>,
    pub num_media: &'static str,
    pub num_segments: String,
    pub price: Option<&'static str>,
    pub price_unit: &'static str,
    pub sid: &'a str,
    pub status: &'static str,
    pub subresource_uris: SubresourceUris,
    pub to: &'a str,
    pub uri: String,
}

#[derive(Debug, serde::Serialize)]
pub struct SubresourceUris {
    pub media: String,
}

/// Where a message is on its timeline at some instant.
pub struct StatusAt {
    pub status: &'static str,
    pub date_sent: Option<DateTime<Utc>>,
    pub date_updated: DateTime<Utc>,
    pub error_code: Option<u32>,
}

/// A date as Twilio writes it in a Message resource: RFC 2822 with a two-digit day and `+0000`,
/// e.g. `Wed, 01 May 2024 10:00:00 +0000` (chrono's `to_rfc2822` writes `Wed, 1 May 2024`, which
/// strict RFC 1123 parsers such as Go's `time.RFC1123Z` reject).
pub fn twilio_date(t: DateTime<Utc>) -> String {
    use chrono::{Datelike, Timelike};
    // Written by hand: chrono's `format` parses its pattern on every call, and the SMS resource
    // carries up to three dates on every create, fetch and list entry.
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} +0000",
        DAYS[t.weekday().num_days_from_monday() as usize],
        t.day(),
        MONTHS[t.month0() as usize],
        t.year(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// The number a Messaging Service sends from, in this fake: one fixed number per service SID,
/// derived from it (`+1555` and seven digits), as a service with a one-number sender pool.
pub fn service_number(messaging_service_sid: &str) -> String {
    let d = crate::faults::unit(
        0,
        crate::ledger::Provider::Sms,
        messaging_service_sid,
        "pool",
    );
    format!("+1555{:07}", (d * 10_000_000.0) as u64)
}

fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t + chrono::Duration::from_std(d).unwrap_or_else(|_| chrono::Duration::zero())
}

impl Stored {
    /// The sender number: `From`, or the Messaging Service's number ([`service_number`]).
    pub fn sender(&self) -> Option<String> {
        self.from
            .clone()
            .or_else(|| self.messaging_service_sid.as_deref().map(service_number))
    }

    pub fn status_at(&self, now: Instant) -> StatusAt {
        let age = now.saturating_duration_since(self.created_at);
        let initial = if self.from.is_some() {
            "queued"
        } else {
            "accepted"
        };
        if age < self.plan.sent_after {
            return StatusAt {
                status: initial,
                date_sent: None,
                date_updated: self.created,
                error_code: None,
            };
        }
        let sent = after(self.created, self.plan.sent_after);
        if age < self.plan.final_after {
            return StatusAt {
                status: "sent",
                date_sent: Some(sent),
                date_updated: sent,
                error_code: None,
            };
        }
        StatusAt {
            status: self.plan.final_status,
            date_sent: Some(sent),
            date_updated: after(self.created, self.plan.final_after),
            error_code: self.plan.error_code,
        }
    }

    pub fn uri(&self) -> String {
        format!(
            "/{API_VERSION}/Accounts/{}/Messages/{}.json",
            self.account_sid, self.sid
        )
    }

    /// Twilio's Message resource as of `now`.
    pub fn resource(&self, now: Instant) -> Resource<'_> {
        let s = self.status_at(now);
        let segments = self.body.chars().count().div_ceil(160).max(1);
        Resource {
            account_sid: &self.account_sid,
            api_version: API_VERSION,
            body: &self.body,
            date_created: twilio_date(self.created),
            date_sent: s.date_sent.map(twilio_date),
            date_updated: twilio_date(s.date_updated),
            direction: "outbound-api",
            error_code: s.error_code,
            error_message: s.error_code.map(|c| crate::sms::error_message(c, &self.to)),
            // A Messaging Service picks the sender when it sends: `null` while `accepted`.
            from: if s.status == "accepted" {
                None
            } else {
                self.sender()
            },
            messaging_service_sid: self.messaging_service_sid.as_deref(),
            num_media: "0",
            num_segments: segments.to_string(),
            price: None,
            price_unit: "USD",
            sid: &self.sid,
            status: s.status,
            subresource_uris: SubresourceUris {
                media: format!(
                    "/{API_VERSION}/Accounts/{}/Messages/{}/Media.json",
                    self.account_sid, self.sid
                ),
            },
            to: &self.to,
            uri: self.uri(),
        }
    }

    /// The date a `DateSent` filter compares: when it was sent, or created if not sent yet (so a
    /// stack reconciling an uncertain send finds a message still queued).
    pub fn filter_date(&self, now: Instant) -> DateTime<Utc> {
        self.status_at(now).date_sent.unwrap_or(self.created)
    }
}

#[derive(Default)]
struct Maps {
    by_sid: HashMap<String, Arc<Stored>>,
    by_to: HashMap<String, Vec<Arc<Stored>>>,
    /// `Idempotency-Key` → SID of the message it created.
    keys: HashMap<String, String>,
}

/// All accepted messages. Cheap to share behind an `Arc`.
#[derive(Default)]
pub struct Store {
    maps: Mutex<Maps>,
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, Maps> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, sid: &str) -> Option<Arc<Stored>> {
        self.lock().by_sid.get(sid).cloned()
    }

    /// The message an idempotency key created, if any.
    pub fn by_key(&self, key: &str) -> Option<Arc<Stored>> {
        let m = self.lock();
        m.keys.get(key).and_then(|sid| m.by_sid.get(sid)).cloned()
    }

    /// Stores `msg` unless `key` already created one; returns the message that holds the key.
    pub fn insert(&self, msg: Stored, key: Option<&str>) -> Result<Arc<Stored>, Arc<Stored>> {
        let mut m = self.lock();
        if let Some(k) = key {
            if let Some(orig) = m.keys.get(k).and_then(|sid| m.by_sid.get(sid)) {
                return Err(orig.clone());
            }
            m.keys.insert(k.to_string(), msg.sid.clone());
        }
        let msg = Arc::new(msg);
        m.by_sid.insert(msg.sid.clone(), msg.clone());
        m.by_to.entry(msg.to.clone()).or_default().push(msg.clone());
        Ok(msg)
    }

    /// Messages to `to` (all messages if `None`), newest first.
    pub fn list(&self, to: Option<&str>) -> Vec<Arc<Stored>> {
        let m = self.lock();
        let mut v: Vec<Arc<Stored>> = match to {
            Some(t) => m.by_to.get(t).cloned().unwrap_or_default(),
            None => m.by_sid.values().cloned().collect(),
        };
        v.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then_with(|| b.sid.cmp(&a.sid))
        });
        v
    }

    pub fn clear(&self) {
        *self.lock() = Maps::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::callbacks::plan::SmsPlan;
    use serde_json::Value;

    #[test]
    fn dates_have_two_digit_days_like_twilio() {
        // (instant, Twilio's rendering)
        let cases = [
            ("2024-05-01T10:00:00Z", "Wed, 01 May 2024 10:00:00 +0000"),
            ("2021-10-04T23:32:01Z", "Mon, 04 Oct 2021 23:32:01 +0000"),
            ("2024-12-25T07:08:09Z", "Wed, 25 Dec 2024 07:08:09 +0000"),
        ];
        for (t, want) in cases {
            let t: DateTime<Utc> = t.parse().unwrap();
            assert_eq!(twilio_date(t), want);
            // What a strict RFC 1123 parser expects: the fixed-width form round-trips.
            let back = chrono::NaiveDateTime::parse_from_str(want, "%a, %d %b %Y %H:%M:%S +0000")
                .unwrap()
                .and_utc();
            assert_eq!(back, t);
        }
    }

    fn stored(created: &str, from: Option<&str>, ms: Option<&str>) -> Stored {
        Stored {
            sid: "SM0".into(),
            account_sid: "AC0".into(),
            to: "+15550000001".into(),
            from: from.map(str::to_string),
            messaging_service_sid: ms.map(str::to_string),
            body: "hello".into(),
            status_callback: None,
            created: created.parse().unwrap(),
            created_at: Instant::now(),
            attempt: 1,
            plan: SmsPlan {
                final_status: "delivered",
                error_code: None,
                sent_after: Duration::from_secs(60),
                final_after: Duration::from_secs(120),
                reports: Vec::new(),
            },
        }
    }

    #[test]
    fn resource_dates_and_sender() {
        let m = stored("2024-05-01T10:00:00Z", Some("+15550009999"), None);
        let now = m.created_at;
        let r = serde_json::to_value(m.resource(now)).unwrap();
        assert_eq!(r["date_created"], "Wed, 01 May 2024 10:00:00 +0000");
        assert_eq!(r["date_updated"], "Wed, 01 May 2024 10:00:00 +0000");
        assert_eq!(r["date_sent"], Value::Null);
        assert_eq!(
            (r["status"].as_str(), r["from"].as_str()),
            (Some("queued"), Some("+15550009999"))
        );
        let r = serde_json::to_value(m.resource(now + Duration::from_secs(200))).unwrap();
        assert_eq!(r["date_sent"], "Wed, 01 May 2024 10:01:00 +0000");
        assert_eq!(r["date_updated"], "Wed, 01 May 2024 10:02:00 +0000");

        // A Messaging Service send: no sender while accepted, then the service's number.
        let m = stored("2024-05-09T10:00:00Z", None, Some("MG1"));
        let r = serde_json::to_value(m.resource(m.created_at)).unwrap();
        assert_eq!(
            (r["status"].as_str(), &r["from"]),
            (Some("accepted"), &Value::Null)
        );
        let r = serde_json::to_value(m.resource(m.created_at + Duration::from_secs(90))).unwrap();
        assert_eq!(r["status"], "sent");
        assert_eq!(r["from"].as_str(), Some(service_number("MG1").as_str()));
        assert!(crate::sms::is_e164(&service_number("MG1")));
        assert_eq!(service_number("MG1"), m.sender().unwrap());
        assert_ne!(service_number("MG1"), service_number("MG2"));
    }
}
