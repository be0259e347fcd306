//! Fault profiles of the fake providers: what a scenario's `[providers.*]` tables say and what
//! `PUT /_mock/faults` accepts.
//!
//! Every struct denies unknown fields so a typo in a scenario is reported with its line and column
//! by the TOML parser. Ranges are enforced by the unit types ([`Ratio`], [`HumanDuration`]).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::outage::{Outage, OutageMode};
use crate::units::{HumanDuration, Ratio};

/// The three providers. `seed` is not here: it is the scenario's and is passed to [`crate`] start.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProvidersConfig {
    #[serde(default)]
    pub line: LineConfig,
    #[serde(default)]
    pub smtp: SmtpConfig,
    #[serde(default)]
    pub sms: SmsConfig,
}

/// How long a provider takes to answer. `kind` picks the distribution.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Latency {
    /// Always `value`.
    Fixed { value: HumanDuration },
    /// Uniform between `min` and `max`.
    Uniform {
        min: HumanDuration,
        max: HumanDuration,
    },
    /// Log-normal with the given median and 99th percentile (p99 >= p50).
    Lognormal {
        p50: HumanDuration,
        p99: HumanDuration,
    },
}

impl Default for Latency {
    fn default() -> Self {
        Latency::Fixed {
            value: HumanDuration::ZERO,
        }
    }
}

/// An HTTP-level fault injected on a share of attempts (LINE and SMS).
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HttpFault {
    /// HTTP status to answer with: 429, 500, 502, 503, 504, or a 4xx for permanent faults.
    pub status: u16,
    /// Share of attempts that get this fault.
    pub rate: Ratio,
    /// `Retry-After` header to send (429/503).
    #[serde(default)]
    pub retry_after: Option<HumanDuration>,
    /// Provider error code in the body (Twilio `code`, e.g. 20429, 21610). Defaults per status.
    #[serde(default)]
    pub code: Option<u32>,
    /// LINE only: a 429 that means the monthly quota is spent ("You have reached your monthly
    /// limit."), which is not worth retrying, instead of the transient rate limit.
    #[serde(default)]
    pub monthly_quota: bool,
    /// The provider commits the send to the ledger and then answers with this fault anyway
    /// (a 5xx after commit: the sender cannot know the send landed).
    #[serde(default)]
    pub after_commit: bool,
}

/// "Fail the first `attempts` attempts" for a seeded share of recipients (LINE and SMS): the
/// long retry chains of a real outage on every seed — a backoff that reaches its cap, attempts
/// that run out — which per-attempt rates almost never produce. Which recipients is decided by
/// (seed, provider, recipient), whether an attempt fails by its number: nothing depends on timing.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StickyFault {
    /// Share of recipients affected (the shares of a provider's list add up to at most 100%).
    pub share: Ratio,
    /// How many attempts fail, from the first (at least 1). More than the stack's
    /// `max_attempts` makes the delivery exhaust its attempts.
    pub attempts: u32,
    /// HTTP status of each failure: 429 or a 5xx (a transient error).
    pub status: u16,
    /// `Retry-After` to send with it (LINE and Twilio send whole seconds, rounded up).
    #[serde(default)]
    pub retry_after: Option<HumanDuration>,
}

impl StickyFault {
    /// The fault every affected attempt gets.
    pub fn fault(&self) -> HttpFault {
        HttpFault {
            status: self.status,
            rate: Ratio(1.0),
            retry_after: self.retry_after,
            code: None,
            monthly_quota: false,
            after_commit: false,
        }
    }
}

/// Delivery report behaviour: SMS status callbacks and e-mail delivery events.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CallbackConfig {
    /// Send callbacks at all.
    pub enabled: bool,
    /// Delay between acceptance and the first callback, uniform in `[min, max]`.
    pub delay_min: HumanDuration,
    pub delay_max: HumanDuration,
    /// Share of callbacks sent twice (same idempotency token / event id).
    pub duplicate_rate: Ratio,
    /// Share of messages that get a stale intermediate status (`sent`) after their final one.
    pub stale_rate: Ratio,
    /// Share of messages whose final status is sent before the intermediate ones (SMS `sent`;
    /// e-mail `processed` and `deferred`, which then arrive after `delivered` / `bounced`).
    pub out_of_order_rate: Ratio,
    /// Share of messages that also get a callback with a wrong signature claiming a different
    /// final status.
    pub forged_rate: Ratio,
    /// Share of messages that also cause a correctly signed callback for an unknown message id.
    pub unknown_id_rate: Ratio,
    /// Share of accepted messages whose final status is a failure (`undelivered`/`failed` for SMS,
    /// `bounced` for e-mail) rather than `delivered`.
    pub fail_rate: Ratio,
    /// E-mail only: send a `processed` event (the provider took the message) right after each
    /// accept, as SendGrid does.
    pub processed: bool,
    /// E-mail only: share of messages the receiving server defers (4yz) once or twice before
    /// their final event: one or two `deferred` events, then `delivered` or, for the messages
    /// that fail, a late asynchronous `bounced` (the provider gave up after its 250).
    pub deferred_rate: Ratio,
    /// E-mail only: share of delivered messages the recipient marks as spam: a `complained`
    /// event after `delivered` (informational: the message was delivered).
    pub complaint_rate: Ratio,
    /// Retry a callback the stack answered with 5xx or did not answer within `timeout`.
    pub retry_on_error: bool,
    pub max_retries: u32,
    pub timeout: HumanDuration,
    /// Where to POST (e-mail events only; SMS uses each message's `StatusCallback`). A header
    /// `X-Events-Url` on the SMTP DATA overrides it per message.
    pub url: Option<String>,
}

impl Default for CallbackConfig {
    fn default() -> Self {
        CallbackConfig {
            enabled: false,
            delay_min: HumanDuration::from_millis(50),
            delay_max: HumanDuration::from_millis(500),
            duplicate_rate: Ratio::ZERO,
            stale_rate: Ratio::ZERO,
            out_of_order_rate: Ratio::ZERO,
            forged_rate: Ratio::ZERO,
            unknown_id_rate: Ratio::ZERO,
            fail_rate: Ratio::ZERO,
            processed: false,
            deferred_rate: Ratio::ZERO,
            complaint_rate: Ratio::ZERO,
            retry_on_error: true,
            max_retries: 3,
            timeout: HumanDuration::from_millis(2000),
            url: None,
        }
    }
}

/// `[providers.line]`: the LINE Messaging API push endpoint.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LineConfig {
    pub latency: Latency,
    /// Faults on a seeded share of attempts (`after_commit` ones are commit-then-fail).
    pub transient: Vec<HttpFault>,
    /// Permanent faults on a seeded share of attempts (e.g. monthly quota).
    pub permanent: Vec<HttpFault>,
    /// Recipients whose first attempts all fail (decided before `permanent` and `transient`).
    pub sticky: Vec<StickyFault>,
    /// Seeded share of the user-id space that is invalid (400, permanent).
    pub bad_addresses: Ratio,
    /// Requests per second before answering 429 (token bucket; timing-based by nature).
    pub rate_limit: Option<f64>,
    /// Honour `X-Line-Retry-Key` (409 on a repeat of an accepted key). LINE does; default on.
    pub idempotency: bool,
    /// The channel access token expected as `Authorization: Bearer …`.
    pub channel_token: String,
    /// A provider-wide outage in force (set mid-run by the harness's `provider_outage` step or
    /// `PUT /_mock/faults`; timing-based by nature): every send answered 503 or never.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outage: Option<Outage>,
}

impl Default for LineConfig {
    fn default() -> Self {
        LineConfig {
            latency: Latency::default(),
            transient: Vec::new(),
            permanent: Vec::new(),
            sticky: Vec::new(),
            bad_addresses: Ratio::ZERO,
            rate_limit: None,
            idempotency: true,
            channel_token: "ting-line-token".into(),
            outage: None,
        }
    }
}

/// SMTP transaction stages at which a fault or latency can be injected.
#[derive(
    Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "snake_case")]
pub enum SmtpStage {
    Greeting,
    Mail,
    Rcpt,
    Data,
    DataEnd,
}

impl SmtpStage {
    /// The stage's name as scenarios spell it (`data_end`), also part of its fault-plan salt.
    pub fn as_str(self) -> &'static str {
        match self {
            SmtpStage::Greeting => "greeting",
            SmtpStage::Mail => "mail",
            SmtpStage::Rcpt => "rcpt",
            SmtpStage::Data => "data",
            SmtpStage::DataEnd => "data_end",
        }
    }
}

/// A reply injected at one SMTP stage on a seeded share of attempts.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SmtpFault {
    pub stage: SmtpStage,
    /// Basic reply code: 421/554 (greeting), 451/452/550/553 (mail), 450/451/452/550/551/552/553
    /// (rcpt), 554 (data), 451/452/552/554 (data_end).
    pub code: u16,
    /// Enhanced status code (RFC 3463), e.g. "4.3.0". Defaults per code.
    #[serde(default)]
    pub enhanced: Option<String>,
    pub rate: Ratio,
}

/// `[providers.smtp]`: a real SMTP server on TCP.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SmtpConfig {
    /// Latency before the reply to the end of DATA (the commit point).
    pub latency: Latency,
    /// Extra latency before the reply at other stages.
    pub stage_latency: BTreeMap<SmtpStage, Latency>,
    pub faults: Vec<SmtpFault>,
    /// Seeded share of the mailbox space that does not exist (RCPT 550 5.1.1).
    pub bad_addresses: Ratio,
    /// Share of attempts whose connection is dropped in the middle of DATA (nothing committed).
    pub drop_mid_data_rate: Ratio,
    /// Share of attempts committed to the ledger whose connection closes before the 250 is
    /// written (the RFC 1047 window: the sender cannot know).
    pub accept_then_drop_rate: Ratio,
    /// Largest message accepted (SIZE); bigger → 552.
    pub max_size: usize,
    /// Delivery events (webhooks) after acceptance, HMAC-SHA256 signed with `events_secret`.
    pub events: CallbackConfig,
    pub events_secret: String,
    /// A provider-wide outage in force (see [`LineConfig::outage`]): every RCPT answered `421`
    /// and the connection closed, or never answered. Read at each MAIL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outage: Option<Outage>,
}

impl Default for SmtpConfig {
    fn default() -> Self {
        SmtpConfig {
            latency: Latency::default(),
            stage_latency: BTreeMap::new(),
            faults: Vec::new(),
            bad_addresses: Ratio::ZERO,
            drop_mid_data_rate: Ratio::ZERO,
            accept_then_drop_rate: Ratio::ZERO,
            max_size: 10 * 1024 * 1024,
            events: CallbackConfig::default(),
            events_secret: "ting-smtp-events-secret".into(),
            outage: None,
        }
    }
}

/// `[providers.sms]`: a Twilio-compatible subset.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SmsConfig {
    pub latency: Latency,
    pub transient: Vec<HttpFault>,
    pub permanent: Vec<HttpFault>,
    /// Recipients whose first attempts all fail (decided before `permanent` and `transient`).
    pub sticky: Vec<StickyFault>,
    /// Seeded share of the number space that is invalid (21211) or unsubscribed (21610).
    pub bad_addresses: Ratio,
    pub rate_limit: Option<f64>,
    /// Honour an `Idempotency-Key` header. Twilio has none; default off (duplicates happen).
    pub idempotency: bool,
    pub account_sid: String,
    pub auth_token: String,
    /// Status callbacks to each message's `StatusCallback`.
    pub callbacks: CallbackConfig,
    /// A provider-wide outage in force (see [`LineConfig::outage`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outage: Option<Outage>,
}

impl Default for SmsConfig {
    fn default() -> Self {
        SmsConfig {
            latency: Latency::default(),
            transient: Vec::new(),
            permanent: Vec::new(),
            sticky: Vec::new(),
            bad_addresses: Ratio::ZERO,
            rate_limit: None,
            idempotency: false,
            account_sid: "AC00000000000000000000000000000000".into(),
            auth_token: "ting-sms-auth-token".into(),
            callbacks: CallbackConfig::default(),
            outage: None,
        }
    }
}
