//! Provider clients and the classification of what they answered.
//!
//! Each channel module speaks one wire protocol (LINE push API, SMTP via lettre, Twilio-style
//! SMS API) and turns the answer into an [`Outcome`]; the worker decides the state from it. This
//! module must never touch the database: the caller records the attempt before and the outcome
//! after.

pub mod email;
pub mod line;
pub mod sms;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::claim::Claimed;
use crate::config::Config;

/// A delivery channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Channel {
    Line,
    Email,
    Sms,
}

impl Channel {
    pub const ALL: [Channel; 3] = [Channel::Line, Channel::Email, Channel::Sms];

    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Line => "line",
            Channel::Email => "email",
            Channel::Sms => "sms",
        }
    }

    pub fn parse(s: &str) -> Option<Channel> {
        Channel::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// Outcome classes: stored in `last_error_class` (all but `accepted`) and, per attempt, as the
/// `outcome_class` of the transition that ended it (`delivery_transitions`), which `/metrics`
/// counts as `ting_attempts_total{channel,class}`.
pub mod class {
    /// The provider took the message (LINE 200 or 409 for our own retry key, Twilio 201, SMTP
    /// 250, or an SMS found by the lookup before a resend).
    pub const ACCEPTED: &str = "accepted";
    /// Not sent; safe to retry (429, connection refused, SMTP 4yz).
    pub const TRANSIENT: &str = "transient";
    /// May or may not have landed (timeout, 5xx, connection lost mid-request).
    pub const AMBIGUOUS: &str = "ambiguous";
    pub const PERMANENT: &str = "permanent";
    /// Not an outcome: the error class of a delivery that ran out of attempts or age (`failed`).
    pub const EXHAUSTED: &str = "exhausted";
}

impl Outcome {
    /// The class this outcome is counted under (`unknown` e-mail outcomes count as ambiguous).
    pub fn class(&self) -> &'static str {
        match self {
            Outcome::Accepted { .. } => class::ACCEPTED,
            Outcome::Retry { class, .. } => class,
            Outcome::Permanent { .. } => class::PERMANENT,
            Outcome::Unknown { .. } => class::AMBIGUOUS,
        }
    }
}

/// What one provider call came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The provider took the message. `done` means no later report will come (LINE).
    Accepted {
        provider_id: Option<String>,
        done: bool,
    },
    /// Worth another attempt after the gap (or `retry_after`). `class` is [`class::TRANSIENT`] or
    /// [`class::AMBIGUOUS`].
    Retry {
        class: &'static str,
        error: String,
        retry_after: Option<Duration>,
    },
    /// Will never work: the provider's own text.
    Permanent { error: String },
    /// The outcome cannot be known and a resend is not safe (e-mail without a reply to DATA).
    Unknown { error: String },
}

/// The three provider clients, shared by all senders of one worker.
#[derive(Clone)]
pub struct Providers {
    pub line: line::LineClient,
    pub email: email::EmailClient,
    pub sms: sms::SmsClient,
}

impl Providers {
    pub fn new(cfg: &Arc<Config>) -> anyhow::Result<Providers> {
        let mut http = reqwest::Client::builder().pool_max_idle_per_host(cfg.concurrency);
        if !cfg.flaws.has(crate::config::Flaw::NoProviderTimeout) {
            http = http
                .timeout(cfg.provider_timeout)
                .connect_timeout(cfg.provider_timeout);
        }
        // Flaw (no-provider-timeout): no timeout at all, so a provider that never answers holds
        // the send for ever.
        let http = http.build().context("building the http client")?;
        Ok(Providers {
            line: line::LineClient::new(http.clone(), cfg.clone()),
            email: email::EmailClient::new(cfg.clone())?,
            sms: sms::SmsClient::new(http, cfg.clone()),
        })
    }

    /// Makes the channel ready for one send of `d` *before* its attempt start is recorded (an
    /// SMTP connection, greeted). An error means nothing was sent: the attempt fails with it.
    pub async fn ready(&self, d: &Claimed) -> Result<Ready, Outcome> {
        match d.channel {
            Channel::Email => self.email.checkout().await.map(Ready::Smtp),
            Channel::Line | Channel::Sms => Ok(Ready::Http),
        }
    }

    /// Sends the stored payload of `d` once, on what [`Providers::ready`] prepared. An e-mail runs
    /// `before_body` just before its body goes out and sends it only if that returns `true` (see
    /// [`email`]); the other channels never run it.
    pub async fn send(
        &self,
        d: &Claimed,
        ready: Ready,
        before_body: impl std::future::Future<Output = bool>,
    ) -> Outcome {
        match (d.channel, ready) {
            (Channel::Line, _) => self.line.push(d).await,
            (Channel::Email, Ready::Smtp(conn)) => self.email.send(d, conn, before_body).await,
            (Channel::Email, Ready::Http) => match self.email.checkout().await {
                Ok(conn) => self.email.send(d, conn, before_body).await,
                Err(o) => o,
            },
            (Channel::Sms, _) => self.sms.create(d).await,
        }
    }
}

/// What a channel needs ready before an attempt starts.
pub enum Ready {
    /// HTTP clients connect inside the request; their pool keeps connections warm.
    Http,
    Smtp(email::Checkout),
}

/// `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP-date, as a wait from now, capped
/// at an hour. A date in the past means "now".
pub(crate) fn retry_after(h: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = h.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    parse_retry_after(v, chrono::Utc::now())
}

/// [`retry_after`] on the header's value, with the clock passed in.
pub fn parse_retry_after(v: &str, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    const CAP: f64 = 3600.0;
    let v = v.trim();
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(CAP)));
    }
    let at = http_date(v)?;
    let wait = (at - now).to_std().unwrap_or(Duration::ZERO);
    Some(wait.min(Duration::from_secs_f64(CAP)))
}

/// The three HTTP-date forms: IMF-fixdate, obsolete RFC 850 and asctime, all in GMT.
fn http_date(v: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    use chrono::{NaiveDateTime, TimeZone, Utc};
    if let Ok(d) = chrono::DateTime::parse_from_rfc2822(v) {
        return Some(d.with_timezone(&Utc));
    }
    let naive = NaiveDateTime::parse_from_str(v, "%A, %d-%b-%y %H:%M:%S GMT")
        .or_else(|_| NaiveDateTime::parse_from_str(v, "%a %b %e %H:%M:%S %Y"))
        .ok()?;
    Some(Utc.from_utc_datetime(&naive))
}

/// Transport errors of an HTTP call: refused connections never reached the provider; anything
/// else (timeouts, resets) may have landed.
pub(crate) fn http_error(e: &reqwest::Error) -> Outcome {
    let class = if e.is_connect() {
        class::TRANSIENT
    } else {
        class::AMBIGUOUS
    };
    Outcome::Retry {
        class,
        error: format!("{e:#}"),
        retry_after: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_forms() {
        let now: chrono::DateTime<chrono::Utc> = "2026-11-30T08:49:30Z".parse().unwrap();
        let s = Duration::from_secs;
        // (header value, expected wait)
        let cases: &[(&str, Option<Duration>)] = &[
            ("3", Some(s(3))),
            (" 1.5 ", Some(Duration::from_millis(1500))),
            ("0", Some(s(0))),
            ("99999", Some(s(3600))),
            ("-1", None),
            ("soon", None),
            ("", None),
            // IMF-fixdate, 7 s ahead of `now`.
            ("Mon, 30 Nov 2026 08:49:37 GMT", Some(s(7))),
            // Obsolete RFC 850 and asctime forms of the same instant.
            ("Monday, 30-Nov-26 08:49:37 GMT", Some(s(7))),
            ("Mon Nov 30 08:49:37 2026", Some(s(7))),
            // Already past: retry now, not never.
            ("Mon, 30 Nov 2026 08:00:00 GMT", Some(s(0))),
            // Far future: capped like the seconds form.
            ("Tue, 01 Dec 2026 08:49:30 GMT", Some(s(3600))),
        ];
        for (v, want) in cases {
            assert_eq!(parse_retry_after(v, now), *want, "{v:?}");
        }
    }

    #[test]
    fn outcome_classes() {
        let retry = |class| Outcome::Retry {
            class,
            error: String::new(),
            retry_after: None,
        };
        let cases = [
            (
                Outcome::Accepted {
                    provider_id: None,
                    done: true,
                },
                "accepted",
            ),
            (retry(class::TRANSIENT), "transient"),
            (retry(class::AMBIGUOUS), "ambiguous"),
            (
                Outcome::Permanent {
                    error: String::new(),
                },
                "permanent",
            ),
            (
                Outcome::Unknown {
                    error: String::new(),
                },
                "ambiguous",
            ),
        ];
        for (o, want) in cases {
            assert_eq!(o.class(), want, "{o:?}");
        }
    }
}
