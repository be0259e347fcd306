//! The one set of cross-field rules for provider settings: what parses but cannot work.
//!
//! Every way a profile gets in goes through here — a scenario's `[providers]` tables
//! (`ting-chaos validate` / `run`), a providers-only `ting-chaos mocks --config` file and
//! `PUT /_mock/faults` — so the three say the same thing about the same value. Single values are
//! range-checked where they are parsed ([`crate::units`]: durations are bounded there); this file
//! holds the rules that need more than one field or a domain (HTTP statuses, SMTP codes).
//!
//! A [`Problem`] names the key it is about as a path relative to the profile checked
//! (`transient[0].status`); callers prefix it (`providers.line.`) and place it in their input.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::{
    CallbackConfig, HttpFault, Latency, LineConfig, ProvidersConfig, SmsConfig, SmtpConfig,
    SmtpFault, StickyFault,
};

/// Longest latency or callback delay a fake may be told to wait: a day. Longer is a typo (and an
/// `Instant` far enough out overflows).
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Tolerance for shares written as percentages that add up to exactly 100%.
const SUM_SLACK: f64 = 1e-9;

/// One rule a profile breaks.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// Keys the problem is about, most specific first (`delay_min`, `delay_max`); relative to the
    /// profile checked. Never empty.
    pub paths: Vec<String>,
    pub message: String,
}

impl Problem {
    fn at(path: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            paths: vec![path.into()],
            message: message.into(),
        }
    }

    /// The key it is about.
    pub fn path(&self) -> &str {
        &self.paths[0]
    }

    /// The same problem, its paths under `prefix` (`line` → `line.transient[0].status`).
    pub fn under(mut self, prefix: &str) -> Problem {
        for p in &mut self.paths {
            *p = format!("{prefix}.{p}");
        }
        self
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}`: {}", self.path(), self.message)
    }
}

/// All three profiles; paths start with `line.`, `smtp.` or `sms.`.
pub fn providers(p: &ProvidersConfig) -> Result<(), Problem> {
    line(&p.line).map_err(|e| e.under("line"))?;
    smtp(&p.smtp).map_err(|e| e.under("smtp"))?;
    sms(&p.sms).map_err(|e| e.under("sms"))
}

pub fn line(c: &LineConfig) -> Result<(), Problem> {
    latency("latency", &c.latency)?;
    http_faults("transient", &c.transient)?;
    http_faults("permanent", &c.permanent)?;
    sticky_faults(&c.sticky)?;
    rate_limit(c.rate_limit)?;
    not_empty("channel_token", &c.channel_token)
}

pub fn sms(c: &SmsConfig) -> Result<(), Problem> {
    latency("latency", &c.latency)?;
    http_faults("transient", &c.transient)?;
    http_faults("permanent", &c.permanent)?;
    sticky_faults(&c.sticky)?;
    rate_limit(c.rate_limit)?;
    not_empty("account_sid", &c.account_sid)?;
    not_empty("auth_token", &c.auth_token)?;
    callbacks("callbacks", &c.callbacks)?;
    email_only("callbacks", &c.callbacks)?;
    if c.callbacks.url.is_some() {
        return Err(Problem::at(
            "callbacks.url",
            "`url` is where e-mail delivery events go: write it under [providers.smtp.events]; \
             SMS status callbacks go to the `StatusCallback` each message names",
        ));
    }
    Ok(())
}

pub fn smtp(c: &SmtpConfig) -> Result<(), Problem> {
    latency("latency", &c.latency)?;
    for (stage, l) in &c.stage_latency {
        latency(&format!("stage_latency.{}", stage.as_str()), l)?;
    }
    smtp_faults(&c.faults)?;
    if c.max_size == 0 {
        return Err(Problem::at(
            "max_size",
            "`max_size` must be at least 1 byte: 0 would refuse every message",
        ));
    }
    not_empty("events_secret", &c.events_secret)?;
    callbacks("events", &c.events)
}

fn latency(table: &str, l: &Latency) -> Result<(), Problem> {
    let (keys, values) = match *l {
        Latency::Fixed { value } => (["value", "value"], [value, value]),
        Latency::Uniform { min, max } => (["min", "max"], [min, max]),
        Latency::Lognormal { p50, p99 } => (["p50", "p99"], [p50, p99]),
    };
    for (k, v) in keys.iter().zip(values) {
        wait(&format!("{table}.{k}"), v.0)?;
    }
    let [lo, hi] = values;
    if lo > hi {
        let [lo_key, hi_key] = keys;
        let kind = match l {
            Latency::Uniform { .. } => "uniform",
            _ => "lognormal",
        };
        return Err(Problem {
            paths: vec![
                format!("{table}.{lo_key}"),
                format!("{table}.{hi_key}"),
                table.to_string(),
            ],
            message: format!("{kind} latency has {lo_key} {lo} > {hi_key} {hi}"),
        });
    }
    Ok(())
}

fn wait(path: &str, d: Duration) -> Result<(), Problem> {
    if d > MAX_WAIT {
        return Err(Problem::at(
            path,
            format!(
                "{} is longer than a fake may wait (at most 24 hours)",
                humantime::format_duration(d)
            ),
        ));
    }
    Ok(())
}

/// HTTP fault statuses that are errors, shares that fit in one draw.
fn http_faults(list: &str, faults: &[HttpFault]) -> Result<(), Problem> {
    let mut sum = 0.0;
    for (i, f) in faults.iter().enumerate() {
        if !(400..=599).contains(&f.status) {
            return Err(Problem::at(
                format!("{list}[{i}].status"),
                format!(
                    "a fault's `status` must be an HTTP error between 400 and 599 (got {})",
                    f.status
                ),
            ));
        }
        if let Some(d) = f.retry_after {
            wait(&format!("{list}[{i}].retry_after"), d.0)?;
        }
        sum += f.rate.get();
        if sum > 1.0 + SUM_SLACK {
            return Err(over_one(list, i, sum, format!("the faults in `{list}`")));
        }
    }
    Ok(())
}

/// Sticky faults: transient statuses, at least one failing attempt, shares that fit in one draw.
fn sticky_faults(faults: &[StickyFault]) -> Result<(), Problem> {
    let mut sum = 0.0;
    for (i, f) in faults.iter().enumerate() {
        if !(f.status == 429 || (500..=599).contains(&f.status)) {
            return Err(Problem::at(
                format!("sticky[{i}].status"),
                format!(
                    "a sticky fault's `status` must be a transient error: 429 or 500-599 (got {})",
                    f.status
                ),
            ));
        }
        if f.attempts == 0 {
            return Err(Problem::at(
                format!("sticky[{i}].attempts"),
                "a sticky fault's `attempts` must be at least 1 (the first attempts that fail)",
            ));
        }
        if let Some(d) = f.retry_after {
            wait(&format!("sticky[{i}].retry_after"), d.0)?;
        }
        sum += f.share.get();
        if sum > 1.0 + SUM_SLACK {
            let v = (sum * 1e6).round() / 1e6;
            return Err(Problem::at(
                format!("sticky[{i}].share"),
                format!(
                    "the `share`s of the sticky faults add up to {v} ({}%); one draw per recipient picks at most one of them, so together they must be at most 100%",
                    (v * 1000.0).round() / 10.0
                ),
            ));
        }
    }
    Ok(())
}

fn smtp_faults(faults: &[SmtpFault]) -> Result<(), Problem> {
    let mut per_stage: BTreeMap<&str, f64> = BTreeMap::new();
    for (i, f) in faults.iter().enumerate() {
        let stage = f.stage.as_str();
        let at = |key: &str| format!("faults[{i}].{key}");
        // RFC 5321 §4.2.1: 4yz is a transient, 5yz a permanent negative reply; the second digit
        // is 0..=5.
        if !(400..=599).contains(&f.code) || (f.code / 10) % 10 > 5 {
            return Err(Problem::at(
                at("code"),
                format!(
                    "SMTP fault at stage `{stage}` has `code` {}, which is not a negative reply: \
                     use a 4yz (transient) or 5yz (permanent) code such as 451 or 550",
                    f.code
                ),
            ));
        }
        if let Some(e) = &f.enhanced {
            // Written to the wire inside the reply line: anything but `class.x.y` digits could
            // forge extra replies (CR/LF) or break the client's parser.
            let parts: Vec<&str> = e.split('.').collect();
            let class = (f.code / 100).to_string();
            let well_formed = parts.len() == 3
                && parts[0] == class
                && parts[1..]
                    .iter()
                    .all(|p| (1..=3).contains(&p.len()) && p.chars().all(|c| c.is_ascii_digit()));
            if !well_formed {
                return Err(Problem::at(
                    at("enhanced"),
                    format!(
                        "`enhanced` {e:?} does not fit `code` {}: write `{class}.x.y` (RFC 3463), e.g. \"{class}.0.0\"",
                        f.code
                    ),
                ));
            }
        }
        let sum = per_stage.entry(stage).or_default();
        *sum += f.rate.get();
        if *sum > 1.0 + SUM_SLACK {
            return Err(over_one(
                "faults",
                i,
                *sum,
                format!("the SMTP faults at stage `{stage}`"),
            ));
        }
    }
    Ok(())
}

fn rate_limit(limit: Option<f64>) -> Result<(), Problem> {
    match limit {
        Some(r) if !(r.is_finite() && r > 0.0) => Err(Problem::at(
            "rate_limit",
            format!(
                "`rate_limit` must be requests per second greater than 0 (got {r}); leave it out for no limit"
            ),
        )),
        _ => Ok(()),
    }
}

fn callbacks(table: &str, c: &CallbackConfig) -> Result<(), Problem> {
    wait(&format!("{table}.delay_min"), c.delay_min.0)?;
    wait(&format!("{table}.delay_max"), c.delay_max.0)?;
    wait(&format!("{table}.timeout"), c.timeout.0)?;
    if let Some(url) = c.url.as_deref().filter(|u| !webhook_url(u)) {
        return Err(Problem::at(
            format!("{table}.url"),
            format!("`url` must be an http:// or https:// URL with a host (got {url:?})"),
        ));
    }
    if c.delay_min > c.delay_max {
        let d = CallbackConfig::default();
        return Err(Problem {
            paths: vec![format!("{table}.delay_min"), format!("{table}.delay_max")],
            message: format!(
                "`delay_min` ({}) must be at most `delay_max` ({}); the defaults are {} and {}",
                c.delay_min, c.delay_max, d.delay_min, d.delay_max
            ),
        });
    }
    Ok(())
}

/// Whether `url` is one a delivery report can be POSTed to: `http://` or `https://` with a host.
/// Reachability is not judged: a stack under test listens on loopback.
pub fn webhook_url(url: &str) -> bool {
    reqwest::Url::parse(url)
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
}

/// E-mail event kinds Twilio has no counterpart for: refused on SMS, where they would do nothing.
fn email_only(table: &str, c: &CallbackConfig) -> Result<(), Problem> {
    let set = [
        ("processed", c.processed),
        ("deferred_rate", c.deferred_rate.get() > 0.0),
        ("complaint_rate", c.complaint_rate.get() > 0.0),
    ];
    match set.into_iter().find(|(_, on)| *on) {
        Some((key, _)) => Err(Problem::at(
            format!("{table}.{key}"),
            format!(
                "`{key}` is about e-mail delivery events: write it under [providers.smtp.events]; \
                 SMS status callbacks have no such event"
            ),
        )),
        None => Ok(()),
    }
}

fn not_empty(key: &str, v: &str) -> Result<(), Problem> {
    if v.trim().is_empty() {
        return Err(Problem::at(
            key,
            format!("`{key}` must not be empty: clients authenticate with it"),
        ));
    }
    Ok(())
}

/// The fault at `list[i]` takes the shares of `list` past 100%.
fn over_one(list: &str, i: usize, sum: f64, what: String) -> Problem {
    let v = (sum * 1e6).round() / 1e6;
    Problem::at(
        format!("{list}[{i}].rate"),
        format!(
            "the `rate`s of {what} add up to {v} ({}%); one draw per attempt picks at most one fault, so together they must be at most 100%",
            (v * 1000.0).round() / 10.0
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// (profile patch as JSON, Ok or the path of the problem).
    fn check_line(patch: serde_json::Value) -> Result<(), String> {
        let c = crate::control::merge(&LineConfig::default(), patch).expect("parses");
        line(&c).map_err(|p| p.path().to_string())
    }

    fn check_smtp(patch: serde_json::Value) -> Result<(), String> {
        let c = crate::control::merge(&SmtpConfig::default(), patch).expect("parses");
        smtp(&c).map_err(|p| p.path().to_string())
    }

    fn check_sms(patch: serde_json::Value) -> Result<(), String> {
        let c = crate::control::merge(&SmsConfig::default(), patch).expect("parses");
        sms(&c).map_err(|p| p.path().to_string())
    }

    #[test]
    fn line_rules() {
        let cases: Vec<(serde_json::Value, Result<(), &str>)> = vec![
            (json!({}), Ok(())),
            (
                json!({"transient": [{"status": 200, "rate": 0.1}]}),
                Err("transient[0].status"),
            ),
            (
                json!({"transient": [{"status": 99, "rate": 0.1}]}),
                Err("transient[0].status"),
            ),
            (
                json!({"permanent": [{"status": 1000, "rate": 0.1}]}),
                Err("permanent[0].status"),
            ),
            (
                json!({"transient": [{"status": 500, "rate": "70%"}, {"status": 503, "rate": "70%"}]}),
                Err("transient[1].rate"),
            ),
            (
                json!({"transient": [{"status": 500, "rate": "50%"}, {"status": 503, "rate": "50%"}]}),
                Ok(()),
            ),
            (json!({"rate_limit": 0.0}), Err("rate_limit")),
            (json!({"rate_limit": -5.0}), Err("rate_limit")),
            (json!({"rate_limit": 0.01}), Ok(())),
            (json!({"channel_token": ""}), Err("channel_token")),
            (
                json!({"sticky": [{"share": 0.1, "attempts": 3, "status": 503}]}),
                Ok(()),
            ),
            (
                json!({"sticky": [{"share": 0.1, "attempts": 3, "status": 400}]}),
                Err("sticky[0].status"),
            ),
            (
                json!({"sticky": [{"share": 0.1, "attempts": 0, "status": 500}]}),
                Err("sticky[0].attempts"),
            ),
            (
                json!({"sticky": [{"share": "60%", "attempts": 2, "status": 503}, {"share": "50%", "attempts": 9, "status": 429}]}),
                Err("sticky[1].share"),
            ),
            (
                json!({"latency": {"kind": "uniform", "min": "2s", "max": "1s"}}),
                Err("latency.min"),
            ),
            (
                json!({"latency": {"kind": "fixed", "value": "25h"}}),
                Err("latency.value"),
            ),
            (
                json!({"latency": {"kind": "lognormal", "p50": "5ms", "p99": "24h"}}),
                Ok(()),
            ),
        ];
        for (patch, want) in cases {
            assert_eq!(
                check_line(patch.clone()),
                want.map_err(String::from),
                "{patch}"
            );
        }
    }

    #[test]
    fn smtp_rules() {
        let cases: Vec<(serde_json::Value, Result<(), &str>)> = vec![
            (json!({}), Ok(())),
            (
                json!({"faults": [{"stage": "rcpt", "code": 250, "rate": 0.1}]}),
                Err("faults[0].code"),
            ),
            (
                json!({"faults": [{"stage": "greeting", "code": 99, "rate": 0.1}]}),
                Err("faults[0].code"),
            ),
            (
                json!({"faults": [{"stage": "rcpt", "code": 461, "rate": 0.1}]}),
                Err("faults[0].code"),
            ),
            (
                json!({"faults": [{"stage": "rcpt", "code": 451, "enhanced": "4.3.0\r\n250 2.0.0 ok", "rate": 0.1}]}),
                Err("faults[0].enhanced"),
            ),
            (
                json!({"faults": [{"stage": "rcpt", "code": 451, "enhanced": "5.3.0", "rate": 0.1}]}),
                Err("faults[0].enhanced"),
            ),
            (
                json!({"faults": [{"stage": "rcpt", "code": 451, "enhanced": "4.3.0", "rate": 0.1}]}),
                Ok(()),
            ),
            (
                json!({"faults": [{"stage": "rcpt", "code": 451, "rate": 0.6}, {"stage": "data_end", "code": 452, "rate": 0.6}]}),
                Ok(()),
            ),
            (
                json!({"faults": [{"stage": "rcpt", "code": 451, "rate": 0.6}, {"stage": "rcpt", "code": 550, "rate": 0.6}]}),
                Err("faults[1].rate"),
            ),
            (json!({"max_size": 0}), Err("max_size")),
            (json!({"events_secret": " "}), Err("events_secret")),
            (
                json!({"stage_latency": {"rcpt": {"kind": "uniform", "min": "3s", "max": "1s"}}}),
                Err("stage_latency.rcpt.min"),
            ),
            (
                json!({"events": {"enabled": true, "delay_min": "2s", "delay_max": "1s"}}),
                Err("events.delay_min"),
            ),
            (
                json!({"events": {"enabled": true, "processed": true, "deferred_rate": 0.2, "complaint_rate": 0.05}}),
                Ok(()),
            ),
            (
                json!({"events": {"enabled": true, "url": "http://127.0.0.1:9/v1/callbacks/email"}}),
                Ok(()),
            ),
            (
                json!({"events": {"enabled": true, "url": "javascript:alert(1)"}}),
                Err("events.url"),
            ),
            (
                json!({"events": {"url": "/v1/callbacks/email"}}),
                Err("events.url"),
            ),
        ];
        for (patch, want) in cases {
            assert_eq!(
                check_smtp(patch.clone()),
                want.map_err(String::from),
                "{patch}"
            );
        }
    }

    #[test]
    fn sms_rules() {
        let cases: Vec<(serde_json::Value, Result<(), &str>)> = vec![
            (json!({}), Ok(())),
            (json!({"account_sid": ""}), Err("account_sid")),
            (json!({"auth_token": ""}), Err("auth_token")),
            (
                json!({"callbacks": {"enabled": true, "delay_max": "30h"}}),
                Err("callbacks.delay_max"),
            ),
            (
                json!({"callbacks": {"enabled": true, "timeout": "2d"}}),
                Err("callbacks.timeout"),
            ),
            (
                json!({"transient": [{"status": 429, "rate": 0.1, "retry_after": "25h"}]}),
                Err("transient[0].retry_after"),
            ),
            (
                json!({"callbacks": {"enabled": true, "complaint_rate": 0.1}}),
                Err("callbacks.complaint_rate"),
            ),
            (
                json!({"callbacks": {"enabled": true, "processed": true}}),
                Err("callbacks.processed"),
            ),
            (
                json!({"callbacks": {"enabled": true, "out_of_order_rate": 0.2}}),
                Ok(()),
            ),
            // SMS reports go to each message's StatusCallback: a `url` would do nothing.
            (
                json!({"callbacks": {"enabled": true, "url": "http://127.0.0.1:9/sms"}}),
                Err("callbacks.url"),
            ),
        ];
        for (patch, want) in cases {
            assert_eq!(
                check_sms(patch.clone()),
                want.map_err(String::from),
                "{patch}"
            );
        }
    }

    #[test]
    fn problems_are_placed_under_their_provider() {
        let mut p = ProvidersConfig::default();
        p.sms.rate_limit = Some(0.0);
        let e = providers(&p).unwrap_err();
        assert_eq!(e.path(), "sms.rate_limit");
        assert!(e.to_string().starts_with("`sms.rate_limit`: "), "{e}");
    }
}
