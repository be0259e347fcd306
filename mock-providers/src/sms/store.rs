//! The SMS fake's memory of the messages it accepted, and their Twilio JSON representation.
//!
//! A message's status moves along the timeline its callback plan fixed at creation (queued →
//! sent → delivered / undelivered / failed), so a poll and the callbacks never disagree. The
//! store must never hold a message the ledger does not have as accepted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
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

/// Where a message is on its timeline at some instant.
pub struct StatusAt {
    pub status: &'static str,
    pub date_sent: Option<DateTime<Utc>>,
    pub date_updated: DateTime<Utc>,
    pub error_code: Option<u32>,
}

fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t + chrono::Duration::from_std(d).unwrap_or_else(|_| chrono::Duration::zero())
}

impl Stored {
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
    pub fn resource(&self, now: Instant) -> Value {
        let s = self.status_at(now);
        let segments = self.body.chars().count().div_ceil(160).max(1);
        json!({
            "account_sid": self.account_sid,
            "api_version": API_VERSION,
            "body": self.body,
            "date_created": self.created.to_rfc2822(),
            "date_sent": s.date_sent.map(|d| d.to_rfc2822()),
            "date_updated": s.date_updated.to_rfc2822(),
            "direction": "outbound-api",
            "error_code": s.error_code,
            "error_message": s.error_code.map(|c| crate::sms::error_message(c, &self.to)),
            "from": self.from,
            "messaging_service_sid": self.messaging_service_sid,
            "num_media": "0",
            "num_segments": segments.to_string(),
            "price": null,
            "price_unit": "USD",
            "sid": self.sid,
            "status": s.status,
            "subresource_uris": {
                "media": format!("/{API_VERSION}/Accounts/{}/Messages/{}/Media.json", self.account_sid, self.sid),
            },
            "to": self.to,
            "uri": self.uri(),
        })
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
