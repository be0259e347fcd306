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

/// Error classes stored in `last_error_class` and counted in `/metrics`.
pub mod class {
    /// Not sent; safe to retry (429, connection refused, SMTP 4yz).
    pub const TRANSIENT: &str = "transient";
    /// May or may not have landed (timeout, 5xx, connection lost mid-request).
    pub const AMBIGUOUS: &str = "ambiguous";
    pub const PERMANENT: &str = "permanent";
    pub const EXHAUSTED: &str = "exhausted";
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
        let http = reqwest::Client::builder()
            .timeout(cfg.provider_timeout)
            .connect_timeout(cfg.provider_timeout)
            .pool_max_idle_per_host(cfg.concurrency)
            .build()
            .context("building the http client")?;
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

    /// Sends the stored payload of `d` once, on what [`Providers::ready`] prepared.
    pub async fn send(&self, d: &Claimed, ready: Ready) -> Outcome {
        match (d.channel, ready) {
            (Channel::Line, _) => self.line.push(d).await,
            (Channel::Email, Ready::Smtp(conn)) => self.email.send(d, conn).await,
            (Channel::Email, Ready::Http) => match self.email.checkout().await {
                Ok(conn) => self.email.send(d, conn).await,
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

/// `Retry-After` in seconds (integer or fractional); HTTP dates are not worth the code here.
pub(crate) fn retry_after(h: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = h.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    let secs: f64 = v.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(3600.0)))
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
