//! The SMS fake's memory of the messages it accepted, and their Twilio JSON representation.
//!
//! A message's status moves along the timeline its callback plan fixed at creation (queued →
//! sent → delivered / undelivered / failed), so a poll and the callbacks never disagree. The
//! store must never hold a message the ledger does not have as accepted.
//!
//! A run keeps a hundred thousand messages here, so each is kept small: the SID and the `To`
//! number packed ([`crate::packed`]), what most messages repeat (their [`Origin`], the callback
//! URL) shared ([`Store::origin`], [`Store::callback`]), its timeline in 24 bytes, and the
//! indexes keyed by the packed forms.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::callbacks::plan::SmsTimeline;
use crate::packed::{Phone, Sid};
use crate::shared::Shared;

/// Twilio's API version segment.
pub const API_VERSION: &str = "2010-04-01";

/// One accepted message.
#[derive(Debug)]
pub struct Stored {
    pub sid: Sid,
    /// The store only takes a message to an E.164 number.
    pub to: Phone,
    pub origin: Arc<Origin>,
    pub status_callback: Option<Arc<str>>,
    pub body: Box<str>,
    pub created: DateTime<Utc>,
    pub attempt: u32,
    pub created_at: Instant,
    /// Of its plan, the status timeline alone (the reports are scheduled apart).
    pub timeline: SmsTimeline,
}

/// Whose message it is and who sends it: the same for nearly every message of a run.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Origin {
    pub account_sid: Box<str>,
    pub from: Option<Box<str>>,
    pub messaging_service_sid: Option<Box<str>>,
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
    pub sid: String,
    pub status: &'static str,
    pub subresource_uris: SubresourceUris,
    pub to: String,
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

impl Origin {
    /// The sender number: `From`, or the Messaging Service's number ([`service_number`]).
    pub fn sender(&self) -> Option<String> {
        self.from
            .as_deref()
            .map(str::to_string)
            .or_else(|| self.messaging_service_sid.as_deref().map(service_number))
    }
}

impl Stored {
    pub fn status_at(&self, now: Instant) -> StatusAt {
        let age = now.saturating_duration_since(self.created_at);
        let initial = if self.origin.from.is_some() {
            "queued"
        } else {
            "accepted"
        };
        if age < self.timeline.sent_after() {
            return StatusAt {
                status: initial,
                date_sent: None,
                date_updated: self.created,
                error_code: None,
            };
        }
        let sent = after(self.created, self.timeline.sent_after());
        if age < self.timeline.final_after() {
            return StatusAt {
                status: "sent",
                date_sent: Some(sent),
                date_updated: sent,
                error_code: None,
            };
        }
        StatusAt {
            status: self.timeline.final_status(),
            date_sent: Some(sent),
            date_updated: after(self.created, self.timeline.final_after()),
            error_code: self.timeline.error_code(),
        }
    }

    pub fn uri(&self) -> String {
        format!(
            "/{API_VERSION}/Accounts/{}/Messages/{}.json",
            self.origin.account_sid, self.sid
        )
    }

    /// Twilio's Message resource as of `now`.
    pub fn resource(&self, now: Instant) -> Resource<'_> {
        let s = self.status_at(now);
        let to = self.to.to_string();
        let segments = self.body.chars().count().div_ceil(160).max(1);
        Resource {
            account_sid: &self.origin.account_sid,
            api_version: API_VERSION,
            body: &self.body,
            date_created: twilio_date(self.created),
            date_sent: s.date_sent.map(twilio_date),
            date_updated: twilio_date(s.date_updated),
            direction: "outbound-api",
            error_code: s.error_code,
            error_message: s.error_code.map(|c| crate::sms::error_message(c, &to)),
            // A Messaging Service picks the sender when it sends: `null` while `accepted`.
            from: if s.status == "accepted" {
                None
            } else {
                self.origin.sender()
            },
            messaging_service_sid: self.origin.messaging_service_sid.as_deref(),
            num_media: "0",
            num_segments: segments.to_string(),
            price: None,
            price_unit: "USD",
            sid: self.sid.to_string(),
            status: s.status,
            subresource_uris: SubresourceUris {
                media: format!(
                    "/{API_VERSION}/Accounts/{}/Messages/{}/Media.json",
                    self.origin.account_sid, self.sid
                ),
            },
            to,
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
    by_sid: HashMap<Sid, Arc<Stored>>,
    by_to: HashMap<Phone, Vec<Arc<Stored>>>,
    /// `Idempotency-Key` → the message it created.
    keys: HashMap<Box<str>, Arc<Stored>>,
}

/// What the store shares between messages.
#[derive(Default)]
struct Sharing {
    origins: Shared<Origin>,
    callbacks: Shared<str>,
}

/// All accepted messages. Cheap to share behind an `Arc`.
#[derive(Default)]
pub struct Store {
    maps: Mutex<Maps>,
    shared: Mutex<Sharing>,
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, Maps> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sharing(&self) -> std::sync::MutexGuard<'_, Sharing> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `origin` for a new message, shared with the messages before it that had the same (see
    /// [`Shared`]).
    pub fn origin(&self, origin: Origin) -> Arc<Origin> {
        self.sharing().origins.value(origin)
    }

    /// A new message's callback URL, shared likewise.
    pub fn callback(&self, url: &str) -> Arc<str> {
        self.sharing().callbacks.text(url)
    }

    pub fn get(&self, sid: &str) -> Option<Arc<Stored>> {
        let sid = Sid::parse(sid)?;
        self.lock().by_sid.get(&sid).cloned()
    }

    /// The message an idempotency key created, if any.
    pub fn by_key(&self, key: &str) -> Option<Arc<Stored>> {
        self.lock().keys.get(key).cloned()
    }

    /// Stores `msg` unless `key` already created one; returns the message that holds the key.
    pub fn insert(&self, msg: Stored, key: Option<&str>) -> Result<Arc<Stored>, Arc<Stored>> {
        let mut m = self.lock();
        if let Some(orig) = key.and_then(|k| m.keys.get(k)) {
            return Err(orig.clone());
        }
        let msg = Arc::new(msg);
        if let Some(k) = key {
            m.keys.insert(k.into(), msg.clone());
        }
        m.by_sid.insert(msg.sid, msg.clone());
        // Most numbers get one message: room for one, not the four a first push makes.
        m.by_to
            .entry(msg.to)
            .or_insert_with(|| Vec::with_capacity(1))
            .push(msg.clone());
        Ok(msg)
    }

    /// Messages to `to` (all messages if `None`), newest first.
    pub fn list(&self, to: Option<&str>) -> Vec<Arc<Stored>> {
        let m = self.lock();
        let mut v: Vec<Arc<Stored>> = match to {
            // A `To` that is no E.164 number has no message: the store takes none.
            Some(t) => Phone::parse(t)
                .and_then(|t| m.by_to.get(&t).cloned())
                .unwrap_or_default(),
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
        *self.sharing() = Sharing::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
            sid: Sid::parse("SM00000000000000000000000000000000").unwrap(),
            to: Phone::parse("+15550000001").unwrap(),
            origin: Arc::new(Origin {
                account_sid: "AC0".into(),
                from: from.map(Box::from),
                messaging_service_sid: ms.map(Box::from),
            }),
            status_callback: None,
            body: "hello".into(),
            created: created.parse().unwrap(),
            attempt: 1,
            created_at: Instant::now(),
            timeline: SmsTimeline::new(None, Duration::from_secs(60), Duration::from_secs(120)),
        }
    }

    /// A message from `store` as the SMS fake makes one, its origin and callback shared through
    /// the store.
    fn message(store: &Store, sid: &str, to: &str, callback: &str) -> Stored {
        let mut m = stored("2024-05-01T10:00:00Z", None, None);
        m.sid = Sid::parse(sid).unwrap();
        m.to = Phone::parse(to).unwrap();
        m.origin = store.origin(origin("MG1"));
        m.status_callback = Some(store.callback(callback));
        m
    }

    fn origin(service: &str) -> Origin {
        Origin {
            account_sid: "AC0".into(),
            from: Some("+15550009999".into()),
            messaging_service_sid: Some(service.into()),
        }
    }

    const SID_A: &str = "SM0000000000000000000000000000000a";
    const SID_B: &str = "SM0000000000000000000000000000000b";

    #[test]
    fn messages_share_one_copy_of_the_texts_they_repeat() {
        let store = Store::default();
        let cb = "http://127.0.0.1:1/cb";
        let a = store
            .insert(message(&store, SID_A, "+15550000001", cb), None)
            .unwrap();
        let b = store
            .insert(message(&store, SID_B, "+15550000002", cb), None)
            .unwrap();
        assert!(Arc::ptr_eq(&a.origin, &b.origin));
        let callback = |m: &Stored| m.status_callback.clone().unwrap();
        assert!(Arc::ptr_eq(&callback(&a), &callback(&b)));
        // Another origin is its own copy.
        assert!(!Arc::ptr_eq(&store.origin(origin("MG2")), &a.origin));
        // A text that differs per message is kept, in a bounded set: the rest get their own.
        let many: Vec<_> = (0..Shared::<str>::MAX + 10)
            .map(|i| store.callback(&format!("{cb}?d={i}")))
            .collect();
        let again = store.callback(&many[Shared::<str>::MAX + 5]);
        assert_eq!(again, many[Shared::<str>::MAX + 5]);
        assert!(!Arc::ptr_eq(&again, &many[Shared::<str>::MAX + 5]));
        assert!(Arc::ptr_eq(&store.callback(&many[3]), &many[3]));
        // A reset forgets them.
        store.clear();
        assert!(!Arc::ptr_eq(&store.origin(origin("MG1")), &a.origin));
    }

    /// A hundred thousand messages stay here for the whole run (issue 13).
    #[test]
    fn a_stored_message_stays_small() {
        assert!(
            std::mem::size_of::<Stored>() <= 120,
            "{}",
            std::mem::size_of::<Stored>()
        );
    }

    #[test]
    fn a_key_keeps_the_first_message_it_created() {
        let store = Store::default();
        let first = store
            .insert(message(&store, SID_A, "+15550000001", "u"), Some("k1"))
            .unwrap();
        let again = store.insert(message(&store, SID_B, "+15550000001", "u"), Some("k1"));
        assert!(Arc::ptr_eq(&again.unwrap_err(), &first));
        assert!(Arc::ptr_eq(&store.by_key("k1").unwrap(), &first));
        assert!(store.by_key("K1").is_none() && store.by_key("k2").is_none());
        assert!(store.get(SID_B).is_none(), "the repeat was not stored");
        assert_eq!(store.list(None).len(), 1);
    }

    #[test]
    fn messages_are_found_by_their_sid_and_number_texts() {
        let store = Store::default();
        let now = Instant::now();
        let at_now = |mut m: Stored| {
            m.created_at = now;
            m
        };
        let a = store.insert(at_now(message(&store, SID_A, "+15550000001", "u")), None);
        let b = store.insert(at_now(message(&store, SID_B, "+15550000001", "u")), None);
        let (a, b) = (a.unwrap(), b.unwrap());
        let c = store
            .insert(
                message(&store, "SM1000000000000000000000000000000f", "+44201", "u"),
                None,
            )
            .unwrap();
        assert!(Arc::ptr_eq(&store.get(SID_A).unwrap(), &a));
        assert!(
            store.get(&SID_A.replace('a', "A")).is_none(),
            "SIDs are lowercase"
        );
        assert!(store.get("SM0").is_none() && store.get("").is_none());
        // Created at the same instant: the SID breaks the tie, descending, as its text would.
        let to_1: Vec<String> = store
            .list(Some("+15550000001"))
            .iter()
            .map(|m| m.sid.to_string())
            .collect();
        assert_eq!(to_1, [SID_B, SID_A].map(String::from));
        assert!(Arc::ptr_eq(&store.list(Some("+44201"))[0], &c));
        for nothing in ["15550000001", "+015550000001", "+1555000000", ""] {
            assert!(store.list(Some(nothing)).is_empty(), "{nothing:?}");
        }
        assert_eq!(store.list(None).len(), 3);
        let r = b.resource(b.created_at);
        assert_eq!((r.sid.as_str(), r.to.as_str()), (SID_B, "+15550000001"));
        assert_eq!(
            r.uri,
            format!("/2010-04-01/Accounts/AC0/Messages/{SID_B}.json")
        );
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
        assert_eq!(service_number("MG1"), m.origin.sender().unwrap());
        assert_ne!(service_number("MG1"), service_number("MG2"));
    }
}
