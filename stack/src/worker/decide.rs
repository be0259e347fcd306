//! The pure policy of one attempt: which state an outcome leads to (retries with backoff, the
//! attempt and age caps, exhaustion before a send, the flaws that bend these rules), when an SMS
//! is first polled, and which payload an attempt sends (always the stored one). No I/O: tested by
//! table below.

use std::borrow::Cow;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::channels::{class, Channel, Outcome};
use crate::claim::Claimed;
use crate::config::{Config, Flaw};
use crate::render::Payload;
use crate::state::{State, Updates};

/// The state an outcome leads to and the columns that go with it.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub to: State,
    pub set: Updates,
    pub detail: String,
}

/// What to do after attempt number `attempts` of `d` came to `outcome`. `unit` is a uniform
/// random draw for the backoff jitter (and the first SMS poll's).
pub fn decide(cfg: &Config, d: &Claimed, attempts: i32, outcome: &Outcome, unit: f64) -> Decision {
    decide_at(cfg, d, attempts, outcome, unit, Utc::now())
}

/// [`decide`] with the clock passed in.
///
/// Exhaustion is never silent: a retry that would be attempt `max_attempts + 1`, or whose next
/// attempt (backoff, or the provider's longer `Retry-After`, which is never shortened) would
/// start at or past `created_at + max_age`, ends `failed` now, class `exhausted`, with the
/// provider's text of this attempt.
pub fn decide_at(
    cfg: &Config,
    d: &Claimed,
    attempts: i32,
    outcome: &Outcome,
    unit: f64,
    now: DateTime<Utc>,
) -> Decision {
    let err = |c: &str, e: &str| Some((c.to_string(), e.to_string()));
    let counted = Some(outcome.class());
    match outcome {
        Outcome::Accepted { provider_id, done } => Decision {
            to: if *done {
                State::Delivered
            } else {
                State::Submitted
            },
            set: Updates {
                provider_message_id: provider_id.clone(),
                poll_in: (d.channel == Channel::Sms).then(|| first_poll(cfg, unit)),
                outcome_class: counted,
                ..Updates::default()
            },
            detail: format!("attempt {attempts} accepted"),
        },
        Outcome::Permanent { error } if !cfg.flaws.has(Flaw::RetryPermanent) => Decision {
            to: State::PermanentFailure,
            set: Updates {
                error: err(class::PERMANENT, error),
                outcome_class: counted,
                ..Updates::default()
            },
            detail: error.clone(),
        },
        Outcome::Unknown { error } if !cfg.flaws.has(Flaw::ResendUncertain) => Decision {
            to: State::Unknown,
            set: Updates {
                error: err(class::AMBIGUOUS, error),
                outcome_class: counted,
                ..Updates::default()
            },
            detail: format!("outcome unknowable: {error}"),
        },
        _ => {
            let (cls, error, retry_after) = match outcome {
                Outcome::Retry {
                    class,
                    error,
                    retry_after,
                } => (*class, error.as_str(), *retry_after),
                // Only reached with the retry-permanent / resend-uncertain flaws.
                Outcome::Permanent { error } => (class::TRANSIENT, error.as_str(), None),
                Outcome::Unknown { error } => (class::AMBIGUOUS, error.as_str(), None),
                Outcome::Accepted { .. } => unreachable!("accepted is decided above"),
            };
            if cfg.flaws.has(Flaw::DropOnFailure) {
                // Flaw: a failed send is simply dropped.
                return Decision {
                    to: State::Failed,
                    set: Updates {
                        error: err(cls, error),
                        outcome_class: counted,
                        ..Updates::default()
                    },
                    detail: format!("dropped after attempt {attempts}: {error}"),
                };
            }
            let storm = cfg.flaws.has(Flaw::RetryStorm);
            let mut backoff = cfg.backoff;
            if cfg.flaws.has(Flaw::NoBackoffCap) {
                // Flaw: the gap grows without the `TING_BACKOFF_MAX_MS` cap.
                backoff.max = Duration::from_secs(86_400);
            }
            let gap = if storm {
                Duration::ZERO
            } else {
                backoff.delay(attempts, unit, retry_after)
            };
            let gave_up = if storm {
                None
            } else if spent(cfg, attempts) {
                Some(format!(
                    "gave up after {attempts} attempts (max {})",
                    cfg.max_attempts
                ))
            } else if gap >= age_left(cfg, d, now) {
                Some(format!(
                    "gave up after {attempts} attempts: the next one (in {}ms) would be past \
                     the age cap of {}ms",
                    gap.as_millis(),
                    cfg.max_age.as_millis()
                ))
            } else {
                None
            };
            if let Some(why) = gave_up {
                return Decision {
                    to: State::Failed,
                    set: Updates {
                        error: err(class::EXHAUSTED, error),
                        outcome_class: counted,
                        ..Updates::default()
                    },
                    detail: format!("{why}: {error}"),
                };
            }
            Decision {
                to: State::Retryable,
                set: Updates {
                    retry_in: Some(gap),
                    error: err(cls, error),
                    outcome_class: counted,
                    ..Updates::default()
                },
                detail: format!(
                    "attempt {attempts} failed ({cls}), retry in {}ms: {error}",
                    gap.as_millis()
                ),
            }
        }
    }
}

/// Whether `attempts` made use up the limit of `TING_MAX_ATTEMPTS`.
fn spent(cfg: &Config, attempts: i32) -> bool {
    if cfg.flaws.has(Flaw::AttemptsOffByOne) {
        // Flaw: `>` where `>=` belongs, so one attempt more than the limit is made.
        return attempts > cfg.max_attempts;
    }
    attempts >= cfg.max_attempts
}

/// Time left before `d` reaches the age cap (`created_at + max_age`); zero once it has.
fn age_left(cfg: &Config, d: &Claimed, now: DateTime<Utc>) -> Duration {
    let age = now
        .signed_duration_since(d.created_at)
        .to_std()
        .unwrap_or_default();
    cfg.max_age.saturating_sub(age)
}

/// The first status poll of an SMS just accepted: `TING_SMS_POLL_AFTER_MS` × [0.5, 1.5), so the
/// rows of one batch do not all poll at the same instant.
pub fn first_poll(cfg: &Config, unit: f64) -> Duration {
    cfg.sms_poll_after
        .mul_f64(0.5 + unit.clamp(0.0, 1.0 - f64::EPSILON))
}

/// Why `d` must not be attempted again, checked before anything is sent: its attempts are spent
/// or it is past the age cap. `None`: go ahead.
pub fn exhausted_before_send(cfg: &Config, d: &Claimed, now: DateTime<Utc>) -> Option<String> {
    if cfg.flaws.has(Flaw::RetryStorm) {
        return None;
    }
    // The last allowed attempt of a LINE or SMS delivery, lost mid-way, is reconciled once more
    // (same retry key; lookup before any resend): it may have landed.
    let reconciling = d.attempts == cfg.max_attempts
        && d.channel != Channel::Email
        && d.last_error_class.as_deref() == Some(class::AMBIGUOUS);
    if spent(cfg, d.attempts) && !reconciling {
        return Some(format!(
            "not attempted again: {} attempts made (max {})",
            d.attempts, cfg.max_attempts
        ));
    }
    if age_left(cfg, d, now).is_zero() {
        return Some(format!(
            "not attempted again: older than the age cap of {}ms",
            cfg.max_age.as_millis()
        ));
    }
    None
}

/// The payload attempt number `attempts` of `d` sends: the one stored at enqueue, always (its
/// SHA-256 is `d.payload_sha256`). Only the `rerender-on-retry` flaw returns anything else.
pub fn payload_to_send<'a>(cfg: &Config, d: &'a Claimed, attempts: i32) -> Cow<'a, Payload> {
    if cfg.flaws.has(Flaw::RerenderOnRetry) && attempts > 1 {
        // Flaw: a retry renders the message again from live data instead of sending the
        // stored payload; simulated by what changed since (the attempt), so the bytes differ.
        let mut again = d.payload.clone();
        again.text = format!("{} [{}]", d.payload.text, attempts);
        return Cow::Owned(again);
    }
    Cow::Borrowed(&d.payload)
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
