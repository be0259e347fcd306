//! Tests of the retry decision (`decide.rs`), kept apart so the policy reads in one sitting.

use super::*;
use crate::backoff::Backoff;
use crate::config::Flaws;

fn cfg() -> Config {
    let mut cfg = Config::for_tests("postgres://unused");
    cfg.max_attempts = 3;
    cfg.max_age = Duration::from_secs(3600);
    cfg.sms_poll_after = Duration::from_millis(1000);
    cfg.backoff = Backoff {
        base: Duration::from_millis(100),
        factor: 2.0,
        max: Duration::from_millis(1000),
        jitter: 0.5,
    };
    cfg
}

fn claimed(channel: Channel, attempts: i32, created_at: DateTime<Utc>) -> Claimed {
    let payload = Payload {
        text: "hello".into(),
        ..Payload::default()
    };
    Claimed {
        id: 1,
        key: "b:r:x".into(),
        channel,
        address: "a".into(),
        payload_sha256: payload.sha256(),
        payload,
        correlation_id: "c".into(),
        attempts,
        lease_owner: "w".into(),
        lease_token: 1,
        created_at,
        last_error_class: None,
        attempt_started_at: None,
        from_state: State::Pending,
    }
}

const MS: fn(u64) -> Duration = Duration::from_millis;

fn accepted(done: bool) -> Outcome {
    Outcome::Accepted {
        provider_id: Some("p1".into()),
        done,
    }
}
fn retry(class: &'static str, retry_after: Option<Duration>) -> Outcome {
    Outcome::Retry {
        class,
        error: "503 busy".into(),
        retry_after,
    }
}
fn permanent() -> Outcome {
    Outcome::Permanent {
        error: "550 5.1.1 mailbox unknown".into(),
    }
}
fn unknown() -> Outcome {
    Outcome::Unknown {
        error: "connection lost after DATA".into(),
    }
}

/// Every outcome class × attempts below / at the cap × age below / near / past the cap.
/// Expected: (state, retry gap, error class, counted class).
#[test]
fn decide_table() {
    let cfg = cfg();
    let now: DateTime<Utc> = "2026-11-30T12:00:00Z".parse().unwrap();
    let young = now - chrono::Duration::minutes(1);
    let old = now - chrono::Duration::hours(2);
    // 150 ms of age left: the first gap (100 ms) fits, the second (200 ms) does not.
    let near = now - chrono::Duration::milliseconds(3_600_000 - 150);
    type Want = (State, Option<Duration>, Option<&'static str>, &'static str);
    let retryable = |gap, cls| (State::Retryable, Some(gap), Some(cls), cls);
    let failed = |cls| (State::Failed, None, Some(class::EXHAUSTED), cls);
    let t = class::TRANSIENT;
    let a = class::AMBIGUOUS;
    let ra = |ms| Some(MS(ms));
    let cases: Vec<(&str, Outcome, i32, DateTime<Utc>, Want)> = vec![
        // Accepted: never depends on attempts or age.
        (
            "line ok",
            accepted(true),
            1,
            young,
            (State::Delivered, None, None, "accepted"),
        ),
        (
            "line ok at cap",
            accepted(true),
            3,
            old,
            (State::Delivered, None, None, "accepted"),
        ),
        (
            "sms ok",
            accepted(false),
            1,
            young,
            (State::Submitted, None, None, "accepted"),
        ),
        // Permanent and unknowable: same at any attempt or age.
        (
            "permanent",
            permanent(),
            1,
            young,
            (
                State::PermanentFailure,
                None,
                Some("permanent"),
                "permanent",
            ),
        ),
        (
            "permanent at cap",
            permanent(),
            3,
            old,
            (
                State::PermanentFailure,
                None,
                Some("permanent"),
                "permanent",
            ),
        ),
        (
            "unknown",
            unknown(),
            1,
            young,
            (State::Unknown, None, Some(a), a),
        ),
        (
            "unknown at cap",
            unknown(),
            3,
            old,
            (State::Unknown, None, Some(a), a),
        ),
        // Transient / ambiguous below both caps: backoff (unit 0.5 = no jitter).
        (
            "transient 1",
            retry(t, None),
            1,
            young,
            retryable(MS(100), t),
        ),
        (
            "transient 2",
            retry(t, None),
            2,
            young,
            retryable(MS(200), t),
        ),
        (
            "ambiguous 1",
            retry(a, None),
            1,
            young,
            retryable(MS(100), a),
        ),
        // At the attempt cap: failed, whatever the age.
        ("transient at cap", retry(t, None), 3, young, failed(t)),
        ("ambiguous at cap", retry(a, None), 3, young, failed(a)),
        ("transient past cap", retry(t, None), 4, young, failed(t)),
        // Past the age cap: failed, whatever the attempts.
        ("transient too old", retry(t, None), 1, old, failed(t)),
        ("ambiguous too old", retry(a, None), 1, old, failed(a)),
        ("too old at cap", retry(t, None), 3, old, failed(t)),
        // Near the age cap: a gap that still fits is kept, one that does not fails now.
        (
            "fits before the age cap",
            retry(t, None),
            1,
            near,
            retryable(MS(100), t),
        ),
        ("would pass the age cap", retry(t, None), 2, near, failed(t)),
        // Retry-After: a longer wait wins, a shorter one does not shorten the backoff...
        (
            "retry-after longer",
            retry(t, ra(600_000)),
            1,
            young,
            retryable(MS(600_000), t),
        ),
        (
            "retry-after shorter",
            retry(t, ra(10)),
            2,
            young,
            retryable(MS(200), t),
        ),
        // ...and one that would land past the age cap fails now instead of being cut short.
        (
            "retry-after past the age cap",
            retry(t, ra(3_600_000)),
            1,
            young,
            failed(t),
        ),
        (
            "retry-after near the age cap",
            retry(t, ra(200)),
            1,
            near,
            failed(t),
        ),
        ("retry-after at cap", retry(t, ra(50)), 3, young, failed(t)),
    ];
    for (name, outcome, attempts, created, want) in cases {
        let channel = match outcome {
            Outcome::Accepted { done: false, .. } => Channel::Sms,
            _ => Channel::Line,
        };
        let d = claimed(channel, attempts - 1, created);
        let got = decide_at(&cfg, &d, attempts, &outcome, 0.5, now);
        let got_want: Want = (
            got.to,
            got.set.retry_in,
            got.set.error.as_ref().map(|(c, _)| match c.as_str() {
                "transient" => class::TRANSIENT,
                "ambiguous" => class::AMBIGUOUS,
                "permanent" => class::PERMANENT,
                "exhausted" => class::EXHAUSTED,
                other => panic!("{name}: class {other}"),
            }),
            got.set.outcome_class.unwrap_or("none"),
        );
        assert_eq!(got_want, want, "{name}: {got:?}");
        // The provider's own text is what `last_error` keeps, exhausted or not.
        if let Some((_, text)) = &got.set.error {
            let provider_text = match &outcome {
                Outcome::Retry { error, .. }
                | Outcome::Permanent { error }
                | Outcome::Unknown { error } => error,
                Outcome::Accepted { .. } => unreachable!(),
            };
            assert_eq!(text, provider_text, "{name}");
        }
        if got.to == State::Failed {
            assert!(
                got.detail.starts_with("gave up after"),
                "{name}: {}",
                got.detail
            );
        }
    }
}

#[test]
fn decide_with_flaws() {
    let now = Utc::now();
    let d = claimed(Channel::Line, 5, now - chrono::Duration::hours(2));
    let mut cfg = cfg();
    cfg.flaws = Flaws::default().with(Flaw::RetryStorm);
    let got = decide_at(&cfg, &d, 6, &retry(class::TRANSIENT, None), 0.5, now);
    assert_eq!(
        (got.to, got.set.retry_in),
        (State::Retryable, Some(Duration::ZERO))
    );
    assert_eq!(exhausted_before_send(&cfg, &d, now), None);
    cfg.flaws = Flaws::default().with(Flaw::DropOnFailure);
    let young = claimed(Channel::Line, 0, now);
    let got = decide_at(&cfg, &young, 1, &retry(class::TRANSIENT, None), 0.5, now);
    assert_eq!(got.to, State::Failed);
    cfg.flaws = Flaws::default().with(Flaw::RetryPermanent);
    let got = decide_at(&cfg, &young, 1, &permanent(), 0.5, now);
    assert_eq!(got.to, State::Retryable);
    assert_eq!(
        got.set.outcome_class,
        Some("permanent"),
        "counted as what it was"
    );
}

/// Checked before anything is sent: rows whose attempts or age are spent are not sent again.
#[test]
fn the_cap_and_limit_flaws() {
    let now = Utc::now();
    let young = claimed(Channel::Line, 0, now);
    let mut c = cfg();
    // Attempt 6 failed: 100 ms × 2^5 = 3.2 s, capped at 1 s (± 50% jitter: 0.5 at 0.5).
    let gap = |cfg: &Config| {
        decide_at(cfg, &young, 6, &retry(class::TRANSIENT, None), 0.5, now)
            .set
            .retry_in
    };
    c.max_attempts = 10;
    assert_eq!(gap(&c), Some(Duration::from_millis(1000)));
    c.flaws = Flaws::default().with(Flaw::NoBackoffCap);
    assert_eq!(gap(&c), Some(Duration::from_millis(3200)));

    // Limit 3: attempt 3 failing gives up; with the flaw it retries, and attempts once more.
    let mut c = cfg();
    let third =
        |cfg: &Config| decide_at(cfg, &young, 3, &retry(class::TRANSIENT, None), 0.5, now).to;
    assert_eq!(third(&c), State::Failed);
    let spent = claimed(Channel::Line, 3, now);
    assert!(exhausted_before_send(&c, &spent, now).is_some());
    c.flaws = Flaws::default().with(Flaw::AttemptsOffByOne);
    assert_eq!(third(&c), State::Retryable);
    assert_eq!(exhausted_before_send(&c, &spent, now), None);
}

#[test]
fn exhausted_before_send_table() {
    let cfg = cfg();
    let now: DateTime<Utc> = "2026-11-30T12:00:00Z".parse().unwrap();
    let cases = [
        (0, chrono::Duration::zero(), false),
        (2, chrono::Duration::minutes(59), false),
        (3, chrono::Duration::minutes(1), true),
        (7, chrono::Duration::minutes(1), true),
        (0, chrono::Duration::minutes(60), true),
        (1, chrono::Duration::hours(5), true),
    ];
    for (attempts, age, stop) in cases {
        let d = claimed(Channel::Sms, attempts, now - age);
        let got = exhausted_before_send(&cfg, &d, now);
        assert_eq!(
            got.is_some(),
            stop,
            "{attempts} attempts, age {age}: {got:?}"
        );
    }
    // The last allowed attempt (3 here), lost mid-way, is reconciled once more on LINE and SMS
    // (same retry key; lookup first); e-mail is not; one past the cap never is.
    let young = now - chrono::Duration::minutes(1);
    for (channel, attempts, stop) in [
        (Channel::Line, 3, false),
        (Channel::Sms, 3, false),
        (Channel::Email, 3, true),
        (Channel::Sms, 4, true),
    ] {
        let mut d = claimed(channel, attempts, young);
        d.last_error_class = Some(class::AMBIGUOUS.to_string());
        let got = exhausted_before_send(&cfg, &d, now);
        assert_eq!(got.is_some(), stop, "{channel:?} {attempts}: {got:?}");
    }
}

#[test]
fn the_first_sms_poll_is_jittered() {
    let cfg = cfg();
    // (unit, expected) around TING_SMS_POLL_AFTER_MS = 1000.
    for (unit, want) in [(0.0, 500), (0.25, 750), (0.5, 1000), (0.999, 1499)] {
        assert_eq!(first_poll(&cfg, unit).as_millis(), want, "{unit}");
    }
    assert!(first_poll(&cfg, 1.0) <= MS(1500));
    let now = Utc::now();
    let d = claimed(Channel::Sms, 0, now);
    let got = decide_at(&cfg, &d, 1, &accepted(false), 0.0, now);
    assert_eq!(got.set.poll_in, Some(MS(500)));
    let line = claimed(Channel::Line, 0, now);
    assert_eq!(
        decide_at(&cfg, &line, 1, &accepted(true), 0.0, now)
            .set
            .poll_in,
        None
    );
}

/// What a retry sends hashes to what was stored at enqueue; the `rerender-on-retry` flaw is
/// what breaks that (so the check can fail).
#[test]
fn a_retry_sends_the_stored_payload() {
    let mut cfg = cfg();
    let d = claimed(Channel::Line, 1, Utc::now());
    for attempts in [1, 2, 5] {
        let p = payload_to_send(&cfg, &d, attempts);
        assert_eq!(p.sha256(), d.payload_sha256, "attempt {attempts}");
    }
    cfg.flaws = Flaws::default().with(Flaw::RerenderOnRetry);
    assert_eq!(payload_to_send(&cfg, &d, 1).sha256(), d.payload_sha256);
    assert_ne!(payload_to_send(&cfg, &d, 2).sha256(), d.payload_sha256);
}
