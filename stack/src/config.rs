//! Configuration of the stack's processes, read once from the `TING_*` environment variables of
//! the stack contract (`docs/stack-contract.md`) and validated here.
//!
//! Parse at the boundary: nothing downstream re-reads the environment or re-validates a value.
//! This module must never read anything but the environment map it is given.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use crate::backoff::Backoff;
use crate::channels::Channel;

/// An environment variable that is present but unusable. Missing variables take defaults.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{var}: {reason} (got {value:?})")]
    Invalid {
        var: &'static str,
        value: String,
        reason: String,
    },
}

/// What to do with an e-mail whose outcome cannot be known (`TING_EMAIL_UNKNOWN_POLICY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnknownPolicy {
    /// Wait for a delivery event or a human (default).
    Hold,
    /// Resend with the same Message-ID once the horizon has passed.
    Resend,
}

/// One classic mistake the reference stack can be told to make (`TING_STACK_FLAWS`), so the
/// harness can prove its checkers catch it. All are off by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Flaw {
    InlineSend,
    DropOnFailure,
    RetryStorm,
    RetryPermanent,
    RestartFromFirst,
    NoRescue,
    RacyClaim,
    WholeBatchReplay,
    RerenderOnRetry,
    NaiveCallbacks,
    TrustForgedCallbacks,
    AbortOnSigterm,
    ZombieSend,
    ResendUncertain,
    UnescapedTemplate,
    StatusWithoutMessageId,
    NoHeartbeat,
    EmailEventRegression,
    SubjectHeaderInjection,
    NoBackoffCap,
    AttemptsOffByOne,
    FifoByBatch,
    NonIdempotentBatch,
    NoLeaseDeadline,
    /// Provider HTTP clients with no connect or read timeout: a provider that never answers
    /// holds the worker's send (and its concurrency slot) for ever.
    NoProviderTimeout,
    /// The API answers 202 before the batch is committed (a write-behind): a kill or a deploy
    /// just after the answer loses the batch.
    ApiLosesBatch,
    /// Any SMTP failure once the attempt started holds the e-mail `unknown`, also a broken
    /// connection before the body went out (when nothing can have been sent): the e-mail is
    /// never resent, and the customer never gets it.
    UnknownBeforeBody,
}

impl Flaw {
    pub const ALL: [(&'static str, Flaw); 27] = [
        ("inline-send", Flaw::InlineSend),
        ("drop-on-failure", Flaw::DropOnFailure),
        ("retry-storm", Flaw::RetryStorm),
        ("retry-permanent", Flaw::RetryPermanent),
        ("restart-from-first", Flaw::RestartFromFirst),
        ("no-rescue", Flaw::NoRescue),
        ("racy-claim", Flaw::RacyClaim),
        ("whole-batch-replay", Flaw::WholeBatchReplay),
        ("rerender-on-retry", Flaw::RerenderOnRetry),
        ("naive-callbacks", Flaw::NaiveCallbacks),
        ("trust-forged-callbacks", Flaw::TrustForgedCallbacks),
        ("abort-on-sigterm", Flaw::AbortOnSigterm),
        ("zombie-send", Flaw::ZombieSend),
        ("resend-uncertain", Flaw::ResendUncertain),
        ("unescaped-template", Flaw::UnescapedTemplate),
        ("status-without-message-id", Flaw::StatusWithoutMessageId),
        ("no-heartbeat", Flaw::NoHeartbeat),
        ("email-event-regression", Flaw::EmailEventRegression),
        ("subject-header-injection", Flaw::SubjectHeaderInjection),
        ("no-backoff-cap", Flaw::NoBackoffCap),
        ("attempts-off-by-one", Flaw::AttemptsOffByOne),
        ("fifo-by-batch", Flaw::FifoByBatch),
        ("non-idempotent-batch", Flaw::NonIdempotentBatch),
        ("no-lease-deadline", Flaw::NoLeaseDeadline),
        ("no-provider-timeout", Flaw::NoProviderTimeout),
        ("api-loses-batch", Flaw::ApiLosesBatch),
        ("unknown-before-body", Flaw::UnknownBeforeBody),
    ];

    pub fn name(self) -> &'static str {
        Flaw::ALL
            .iter()
            .find(|(_, f)| *f == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }
}

/// The set of flaws switched on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Flaws(Vec<Flaw>);

impl Flaws {
    pub fn has(&self, flaw: Flaw) -> bool {
        self.0.contains(&flaw)
    }
    pub fn with(mut self, flaw: Flaw) -> Self {
        if !self.has(flaw) {
            self.0.push(flaw);
        }
        self
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromStr for Flaws {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = Flaws::default();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let flaw = Flaw::ALL
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, f)| *f)
                .ok_or_else(|| format!("unknown flaw {name:?}"))?;
            out = out.with(flaw);
        }
        Ok(out)
    }
}

/// Optional per-channel limits (`None`: the shared `TING_CHANNEL_CONCURRENCY`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelLimits {
    pub line: Option<usize>,
    pub email: Option<usize>,
    pub sms: Option<usize>,
}

impl ChannelLimits {
    pub fn get(&self, channel: Channel) -> Option<usize> {
        match channel {
            Channel::Line => self.line,
            Channel::Email => self.email,
            Channel::Sms => self.sms,
        }
    }
}

/// Everything a stack process needs. Build it with [`Config::from_env`] or, in tests, start from
/// [`Config::for_tests`] and override fields.
#[derive(Clone, Debug)]
pub struct Config {
    pub database_url: String,
    pub api_addr: String,
    pub line_api_base: String,
    pub line_channel_token: String,
    pub smtp_addr: String,
    pub smtp_events_secret: String,
    pub email_from: String,
    pub sms_api_base: String,
    pub sms_account_sid: String,
    pub sms_auth_token: String,
    pub sms_from: String,
    pub worker_id: String,
    pub lease: Duration,
    pub heartbeat: Duration,
    pub claim_batch: i64,
    pub max_attempts: i32,
    pub backoff: Backoff,
    pub shutdown_grace: Duration,
    pub email_unknown_policy: UnknownPolicy,
    pub flaws: Flaws,
    /// Sends in flight per worker (`TING_WORKER_CONCURRENCY`, default 32).
    pub concurrency: usize,
    /// Sends in flight per worker and channel (`TING_CHANNEL_CONCURRENCY`; 0, the default, means
    /// `concurrency`); read it through [`Config::channel_limit`].
    pub channel_concurrency: usize,
    /// Per-channel overrides of `channel_concurrency` (`TING_CHANNEL_CONCURRENCY_LINE`, `_EMAIL`,
    /// `_SMS`); read them through [`Config::channel_limit`].
    pub channel_overrides: ChannelLimits,
    /// Idle wait between empty claims (`TING_POLL_MS`, default 50 ms).
    pub poll_interval: Duration,
    /// A delivery older than this is not retried any more (`TING_MAX_AGE_MS`, default 1 h).
    pub max_age: Duration,
    /// Timeout of one provider request (`TING_PROVIDER_TIMEOUT_MS`, default 10 s).
    pub provider_timeout: Duration,
    /// SMS stuck in `submitted` this long get polled (`TING_SMS_POLL_AFTER_MS`, default 5 s).
    pub sms_poll_after: Duration,
    /// Polling and waiting for e-mail events stop after this (`TING_RECONCILE_HORIZON_MS`, 10 min).
    pub reconcile_horizon: Duration,
    /// Largest `POST /v1/batches` body (`TING_MAX_BODY_BYTES`, default 16 MiB).
    pub max_body_bytes: usize,
    /// Most recipients in one batch (`TING_MAX_RECIPIENTS`, default 10 000).
    pub max_recipients: usize,
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_map(&std::env::vars().collect())
    }

    /// Reads the given variables (tests pass a map instead of mutating the process environment).
    pub fn from_map(env: &HashMap<String, String>) -> Result<Config, ConfigError> {
        let s = |k: &str, d: &str| env.get(k).cloned().unwrap_or_else(|| d.to_string());
        let ms = |k: &'static str, d: u64| -> Result<Duration, ConfigError> {
            match num::<u64>(env, k, d)? {
                // Deadlines are `Instant::now() + d`: a span past any run (u64::MAX ms) would
                // overflow the clock mid-run instead of failing here.
                v if v > MAX_MS => Err(invalid(k, &v.to_string(), "must be at most a year")),
                v => Ok(Duration::from_millis(v)),
            }
        };
        let api_addr = s("TING_API_ADDR", "127.0.0.1:8080");
        let cfg = Config {
            database_url: s(
                "TING_DATABASE_URL",
                "postgres://postgres@127.0.0.1:5432/ting",
            ),
            line_api_base: s("TING_LINE_API_BASE", "http://127.0.0.1:9001"),
            line_channel_token: s("TING_LINE_CHANNEL_TOKEN", "ting-line-token"),
            smtp_addr: s("TING_SMTP_ADDR", "127.0.0.1:2525"),
            smtp_events_secret: s("TING_SMTP_EVENTS_SECRET", "ting-smtp-events-secret"),
            email_from: s("TING_EMAIL_FROM", "ting@example.test"),
            sms_api_base: s("TING_SMS_API_BASE", "http://127.0.0.1:9003"),
            sms_account_sid: s("TING_SMS_ACCOUNT_SID", "AC00000000000000000000000000000000"),
            sms_auth_token: s("TING_SMS_AUTH_TOKEN", "ting-sms-auth-token"),
            sms_from: s("TING_SMS_FROM", "+15550001000"),
            worker_id: s("TING_WORKER_ID", &format!("w-{}", std::process::id())),
            lease: ms("TING_LEASE_MS", 30_000)?,
            heartbeat: ms("TING_HEARTBEAT_MS", 5_000)?,
            claim_batch: num(env, "TING_CLAIM_BATCH", 16)?,
            max_attempts: num(env, "TING_MAX_ATTEMPTS", 5)?,
            backoff: Backoff {
                base: ms("TING_BACKOFF_BASE_MS", 1_000)?,
                factor: num(env, "TING_BACKOFF_FACTOR", 2.0)?,
                max: ms("TING_BACKOFF_MAX_MS", 60_000)?,
                jitter: num(env, "TING_BACKOFF_JITTER", 0.2)?,
            },
            shutdown_grace: ms("TING_SHUTDOWN_GRACE_MS", 10_000)?,
            email_unknown_policy: match s("TING_EMAIL_UNKNOWN_POLICY", "hold").as_str() {
                "hold" => UnknownPolicy::Hold,
                "resend" => UnknownPolicy::Resend,
                other => return Err(invalid("TING_EMAIL_UNKNOWN_POLICY", other, "hold|resend")),
            },
            flaws: s("TING_STACK_FLAWS", "")
                .parse()
                .map_err(|e: String| invalid("TING_STACK_FLAWS", &s("TING_STACK_FLAWS", ""), &e))?,
            concurrency: num(env, "TING_WORKER_CONCURRENCY", 32)?,
            channel_concurrency: num(env, "TING_CHANNEL_CONCURRENCY", 0)?,
            channel_overrides: ChannelLimits {
                line: opt_num(env, "TING_CHANNEL_CONCURRENCY_LINE")?,
                email: opt_num(env, "TING_CHANNEL_CONCURRENCY_EMAIL")?,
                sms: opt_num(env, "TING_CHANNEL_CONCURRENCY_SMS")?,
            },
            poll_interval: ms("TING_POLL_MS", 50)?,
            max_age: ms("TING_MAX_AGE_MS", 3_600_000)?,
            provider_timeout: ms("TING_PROVIDER_TIMEOUT_MS", 10_000)?,
            sms_poll_after: ms("TING_SMS_POLL_AFTER_MS", 5_000)?,
            reconcile_horizon: ms("TING_RECONCILE_HORIZON_MS", 600_000)?,
            max_body_bytes: num(env, "TING_MAX_BODY_BYTES", 16 << 20)?,
            max_recipients: num(env, "TING_MAX_RECIPIENTS", 10_000)?,
            api_addr,
        };
        cfg.validated()
    }

    fn validated(self) -> Result<Config, ConfigError> {
        let pos = |var: &'static str, ok: bool, v: String| {
            if ok {
                Ok(())
            } else {
                Err(invalid(var, &v, "must be positive"))
            }
        };
        pos(
            "TING_LEASE_MS",
            !self.lease.is_zero(),
            format!("{:?}", self.lease),
        )?;
        pos(
            "TING_HEARTBEAT_MS",
            !self.heartbeat.is_zero(),
            format!("{:?}", self.heartbeat),
        )?;
        pos(
            "TING_CLAIM_BATCH",
            self.claim_batch > 0,
            self.claim_batch.to_string(),
        )?;
        pos(
            "TING_MAX_ATTEMPTS",
            self.max_attempts > 0,
            self.max_attempts.to_string(),
        )?;
        pos(
            "TING_WORKER_CONCURRENCY",
            self.concurrency > 0,
            self.concurrency.to_string(),
        )?;
        if self.heartbeat >= self.lease {
            return Err(invalid(
                "TING_HEARTBEAT_MS",
                &self.heartbeat.as_millis().to_string(),
                "must be shorter than TING_LEASE_MS",
            ));
        }
        if !(0.0..=1.0).contains(&self.backoff.jitter) {
            return Err(invalid(
                "TING_BACKOFF_JITTER",
                &self.backoff.jitter.to_string(),
                "must be in [0,1]",
            ));
        }
        // `nan` and `inf` parse as numbers; neither is a growth factor.
        if !(self.backoff.factor.is_finite() && self.backoff.factor >= 1.0) {
            return Err(invalid(
                "TING_BACKOFF_FACTOR",
                &self.backoff.factor.to_string(),
                "must be a finite number >= 1",
            ));
        }
        for (var, v) in [
            ("TING_CHANNEL_CONCURRENCY_LINE", self.channel_overrides.line),
            (
                "TING_CHANNEL_CONCURRENCY_EMAIL",
                self.channel_overrides.email,
            ),
            ("TING_CHANNEL_CONCURRENCY_SMS", self.channel_overrides.sms),
        ] {
            pos(var, v != Some(0), format!("{v:?}"))?;
        }
        Ok(self)
    }

    /// Sends of `channel` one worker may have in flight: its `TING_CHANNEL_CONCURRENCY_<CHANNEL>`
    /// if set, else `TING_CHANNEL_CONCURRENCY`, never more than `TING_WORKER_CONCURRENCY` and
    /// never less than 1.
    pub fn channel_limit(&self, channel: Channel) -> usize {
        let shared = if self.channel_concurrency == 0 {
            self.concurrency
        } else {
            self.channel_concurrency
        };
        self.channel_overrides
            .get(channel)
            .unwrap_or(shared)
            .min(self.concurrency)
            .max(1)
    }

    /// A config with short timings for in-process tests; point the URLs at your fakes.
    pub fn for_tests(database_url: &str) -> Config {
        let mut env = HashMap::new();
        env.insert("TING_DATABASE_URL".into(), database_url.into());
        env.insert("TING_LEASE_MS".into(), "2000".into());
        env.insert("TING_HEARTBEAT_MS".into(), "200".into());
        env.insert("TING_BACKOFF_BASE_MS".into(), "10".into());
        env.insert("TING_BACKOFF_MAX_MS".into(), "50".into());
        env.insert("TING_POLL_MS".into(), "10".into());
        env.insert("TING_PROVIDER_TIMEOUT_MS".into(), "2000".into());
        env.insert("TING_SHUTDOWN_GRACE_MS".into(), "5000".into());
        Config::from_map(&env).expect("test config is valid")
    }

    /// The URL given to the SMS provider for status callbacks.
    pub fn sms_status_callback(&self) -> String {
        format!("http://{}/v1/callbacks/sms", self.api_addr)
    }
}

/// The longest span a `TING_*_MS` variable may give: a year.
const MAX_MS: u64 = 365 * 24 * 3600 * 1000;

fn num<T: FromStr>(
    env: &HashMap<String, String>,
    var: &'static str,
    default: T,
) -> Result<T, ConfigError> {
    match env.get(var) {
        None => Ok(default),
        Some(v) if v.trim().is_empty() => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| invalid(var, v, "not a number")),
    }
}

/// An optional number: unset or empty is `None`.
fn opt_num<T: FromStr>(
    env: &HashMap<String, String>,
    var: &'static str,
) -> Result<Option<T>, ConfigError> {
    match env.get(var).map(|v| v.trim()) {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| invalid(var, v, "not a number")),
    }
}

fn invalid(var: &'static str, value: &str, reason: &str) -> ConfigError {
    ConfigError::Invalid {
        var,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_valid() {
        let cfg = Config::from_map(&HashMap::new()).unwrap();
        assert_eq!(cfg.email_unknown_policy, UnknownPolicy::Hold);
        assert!(cfg.flaws.is_empty());
        assert!(Channel::ALL
            .iter()
            .all(|c| cfg.channel_limit(*c) == cfg.concurrency));
    }

    #[test]
    fn bad_values_name_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("TING_LEASE_MS", "abc")], "TING_LEASE_MS"),
            (&[("TING_LEASE_MS", "0")], "TING_LEASE_MS"),
            (
                &[("TING_LEASE_MS", "100"), ("TING_HEARTBEAT_MS", "100")],
                "TING_HEARTBEAT_MS",
            ),
            (&[("TING_CLAIM_BATCH", "0")], "TING_CLAIM_BATCH"),
            (
                &[("TING_EMAIL_UNKNOWN_POLICY", "drop")],
                "TING_EMAIL_UNKNOWN_POLICY",
            ),
            (
                &[("TING_STACK_FLAWS", "racy-claim,nope")],
                "TING_STACK_FLAWS",
            ),
            (&[("TING_BACKOFF_JITTER", "1.5")], "TING_BACKOFF_JITTER"),
            (&[("TING_BACKOFF_JITTER", "nan")], "TING_BACKOFF_JITTER"),
            // A bad factor is named as itself (it was reported as the jitter), and `nan` or
            // `inf`, which parse as numbers, are no factor.
            (&[("TING_BACKOFF_FACTOR", "0.5")], "TING_BACKOFF_FACTOR"),
            (&[("TING_BACKOFF_FACTOR", "nan")], "TING_BACKOFF_FACTOR"),
            (&[("TING_BACKOFF_FACTOR", "inf")], "TING_BACKOFF_FACTOR"),
            (
                &[("TING_SHUTDOWN_GRACE_MS", "18446744073709551615")],
                "TING_SHUTDOWN_GRACE_MS",
            ),
        ];
        for (pairs, var) in cases {
            let err = Config::from_map(&env(pairs)).unwrap_err().to_string();
            assert!(err.starts_with(var), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn per_channel_concurrency_overrides_the_shared_limit() {
        let limits = |pairs: &[(&str, &str)]| {
            let cfg = Config::from_map(&env(pairs)).unwrap();
            Channel::ALL.map(|c| cfg.channel_limit(c))
        };
        // [line, email, sms]
        type Case<'a> = (&'a [(&'a str, &'a str)], [usize; 3]);
        let cases: &[Case] = &[
            (&[], [32, 32, 32]),
            (&[("TING_WORKER_CONCURRENCY", "8")], [8, 8, 8]),
            (&[("TING_CHANNEL_CONCURRENCY", "4")], [4, 4, 4]),
            (
                &[
                    ("TING_CHANNEL_CONCURRENCY", "4"),
                    ("TING_CHANNEL_CONCURRENCY_LINE", "16"),
                    ("TING_CHANNEL_CONCURRENCY_SMS", "1"),
                ],
                [16, 4, 1],
            ),
            // An override never exceeds the worker's own limit.
            (
                &[
                    ("TING_WORKER_CONCURRENCY", "8"),
                    ("TING_CHANNEL_CONCURRENCY_EMAIL", "100"),
                ],
                [8, 8, 8],
            ),
            (&[("TING_CHANNEL_CONCURRENCY_EMAIL", " ")], [32, 32, 32]),
        ];
        for (pairs, want) in cases {
            assert_eq!(limits(pairs), *want, "{pairs:?}");
        }
        for var in [
            "TING_CHANNEL_CONCURRENCY_LINE",
            "TING_CHANNEL_CONCURRENCY_EMAIL",
            "TING_CHANNEL_CONCURRENCY_SMS",
        ] {
            for bad in ["0", "x", "-1"] {
                let err = Config::from_map(&env(&[(var, bad)]))
                    .unwrap_err()
                    .to_string();
                assert!(err.starts_with(var), "{var}={bad}: {err}");
            }
        }
        // Tests set the fields directly; the limit follows.
        let mut cfg = Config::from_map(&HashMap::new()).unwrap();
        cfg.concurrency = 4;
        cfg.channel_concurrency = 2;
        cfg.channel_overrides.sms = Some(3);
        assert_eq!(Channel::ALL.map(|c| cfg.channel_limit(c)), [2, 2, 3]);
    }

    #[test]
    fn flaws_parse() {
        let cfg =
            Config::from_map(&env(&[("TING_STACK_FLAWS", " racy-claim, zombie-send ,")])).unwrap();
        assert!(cfg.flaws.has(Flaw::RacyClaim));
        assert!(cfg.flaws.has(Flaw::ZombieSend));
        assert!(!cfg.flaws.has(Flaw::NoRescue));
        for (name, flaw) in Flaw::ALL {
            assert_eq!(flaw.name(), name);
        }
    }
}
