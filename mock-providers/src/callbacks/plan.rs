//! The seeded schedule of delivery reports for one accepted message: when each callback goes
//! out, what it claims, and which variant (genuine, duplicate, stale, forged, unknown id) it is.
//!
//! A plan is a pure function of (seed, provider, recipient, attempt, profile), so the same seed
//! sends the same reports whatever the interleaving. Every draw is made whatever the rates are,
//! so changing one rate never reshuffles the other decisions. This module never does I/O.

use std::time::Duration;

use rand::Rng;
use uuid::Uuid;

use crate::config::CallbackConfig;
use crate::faults;
use crate::ledger::{CallbackVariant, Provider};

/// One report to send.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// When to send it, after the message was accepted.
    pub at: Duration,
    /// When the reported event happened, after acceptance (what an e-mail event's `timestamp`
    /// says). A duplicate keeps its original's.
    pub stamp: Duration,
    /// SMS: `sent` / `delivered` / `undelivered` / `failed`; e-mail: `processed` / `deferred` /
    /// `delivered` / `bounced` / `complained` ([`EMAIL_EVENTS`]).
    pub status: &'static str,
    pub variant: CallbackVariant,
    /// `I-Twilio-Idempotency-Token` or the e-mail event `id`; a duplicate repeats its original's.
    pub token: Uuid,
    /// The message the report is about (a made-up one for [`CallbackVariant::UnknownId`]).
    pub message_id: String,
}

impl Planned {
    /// SMS failures: Twilio's `ErrorCode` ([`error_code`]).
    pub fn error_code(&self) -> Option<u32> {
        error_code(self.status)
    }

    /// E-mail bounces and deferrals: the reason given ([`reason`]).
    pub fn reason(&self) -> Option<&'static str> {
        reason(self.status)
    }
}

/// Twilio's `ErrorCode` in a report that an SMS is `status`: a failure's code, else none.
pub fn error_code(status: &str) -> Option<u32> {
    SMS_FAILURES
        .iter()
        .find(|(s, _)| *s == status)
        .map(|(_, code)| *code)
}

/// The reason an e-mail event of type `status` gives: a bounce's or a deferral's, else none.
pub fn reason(status: &str) -> Option<&'static str> {
    match status {
        "bounced" => Some("550 5.1.1 mailbox unavailable"),
        "deferred" => Some("451 4.2.0 mailbox busy, will retry"),
        _ => None,
    }
}

/// Share of forged reports sent with no signature at all ([`CallbackVariant::Unsigned`]); the
/// others carry a signature made with a wrong key ([`CallbackVariant::ForgedSignature`]). A
/// stack must refuse both: one that verifies a signature only when the header is present
/// believes every unsigned one.
pub const UNSIGNED_SHARE: f64 = 0.5;

/// The variant of a forged report, from its draw.
fn forgery(draw: f64) -> CallbackVariant {
    if draw < UNSIGNED_SHARE {
        CallbackVariant::Unsigned
    } else {
        CallbackVariant::ForgedSignature
    }
}

/// The true fate of an accepted SMS and the reports about it.
#[derive(Clone, Debug, PartialEq)]
pub struct SmsPlan {
    pub timeline: SmsTimeline,
    /// The callbacks to send, in time order; empty when callbacks are off.
    pub reports: Vec<Planned>,
}

/// An accepted SMS's status over time: what a poll sees and what its reports say. The SMS
/// store keeps this alone of a message's plan (its reports are scheduled apart), for each of a
/// hundred thousand messages: 24 bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SmsTimeline {
    /// When the message becomes `sent`, and then final, after acceptance, in nanoseconds.
    sent_after_ns: u64,
    final_after_ns: u64,
    /// How it ends: 0 delivered, else one past its position in [`SMS_FAILURES`].
    end: u8,
}

impl SmsTimeline {
    /// Ends `delivered` without a failure (a position in [`SMS_FAILURES`]); times saturate at
    /// 584 years.
    pub(crate) fn new(
        failure: Option<usize>,
        sent_after: Duration,
        final_after: Duration,
    ) -> SmsTimeline {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        SmsTimeline {
            sent_after_ns: ns(sent_after),
            final_after_ns: ns(final_after),
            end: failure.map_or(0, |i| i as u8 + 1),
        }
    }

    /// When the message becomes `sent`, after acceptance.
    pub fn sent_after(&self) -> Duration {
        Duration::from_nanos(self.sent_after_ns)
    }

    /// When the message reaches its final status, after acceptance.
    pub fn final_after(&self) -> Duration {
        Duration::from_nanos(self.final_after_ns)
    }

    pub fn final_status(&self) -> &'static str {
        match self.end {
            0 => "delivered",
            n => SMS_FAILURES[usize::from(n - 1)].0,
        }
    }

    /// Twilio's error code for a message that did not arrive.
    pub fn error_code(&self) -> Option<u32> {
        error_code(self.final_status())
    }
}

/// Twilio error codes for a message that did not arrive.
const SMS_FAILURES: [(&str, u32); 2] = [("undelivered", 30003), ("failed", 30008)];

/// Whether an SMS status is one of the final failures a message can end in.
pub fn is_sms_failure(status: &str) -> bool {
    SMS_FAILURES.iter().any(|(s, _)| *s == status)
}

fn uniform(rng: &mut impl Rng, min: Duration, max: Duration) -> Duration {
    if max <= min {
        return min;
    }
    Duration::from_secs_f64(rng.gen_range(min.as_secs_f64()..=max.as_secs_f64()))
}

fn token(rng: &mut impl Rng) -> Uuid {
    uuid::Builder::from_random_bytes(rng.gen()).into_uuid()
}

/// Plans the status callbacks of SMS `sid`, accepted as `attempt` to `recipient`.
pub fn sms(seed: u64, recipient: &str, attempt: u32, sid: &str, cfg: &CallbackConfig) -> SmsPlan {
    let mut rng = faults::rng(seed, Provider::Sms, recipient, attempt, "callbacks");
    let (min, max) = (cfg.delay_min.0, cfg.delay_max.0);
    let (d1, d2) = (uniform(&mut rng, min, max), uniform(&mut rng, min, max));
    let (sent_after, final_after) = (d1.min(d2), d1.max(d2));
    let fail = rng.gen::<f64>() < cfg.fail_rate.get();
    let which = rng.gen_range(0..SMS_FAILURES.len());
    let timeline = SmsTimeline::new(fail.then_some(which), sent_after, final_after);
    let final_status = timeline.final_status();
    // The reports say what a poll sees: the times as the store keeps them.
    let (sent_after, final_after) = (timeline.sent_after(), timeline.final_after());
    if !cfg.enabled {
        // The timeline above is all a poll needs; the reports would never be sent. (They are drawn
        // after it, so skipping them changes nothing that was drawn before.)
        return SmsPlan {
            timeline,
            reports: Vec::new(),
        };
    }
    let out_of_order = rng.gen::<f64>() < cfg.out_of_order_rate.get();
    let dup = [rng.gen::<f64>(), rng.gen::<f64>()];
    let dup_gap = [
        uniform(&mut rng, Duration::ZERO, max),
        uniform(&mut rng, Duration::ZERO, max),
    ];
    let stale = rng.gen::<f64>() < cfg.stale_rate.get();
    let stale_gap = uniform(&mut rng, min, max);
    let forged = rng.gen::<f64>() < cfg.forged_rate.get();
    let forged_at = uniform(&mut rng, min, max);
    let unknown = rng.gen::<f64>() < cfg.unknown_id_rate.get();
    let unknown_at = uniform(&mut rng, min, max);
    let tokens: Vec<Uuid> = (0..5).map(|_| token(&mut rng)).collect();
    let unknown_sid = format!("SM{}", hex::encode(rng.gen::<[u8; 16]>()));
    // Drawn last, so every draw above (and the plan of every other report) is what it was.
    let forged_as = forgery(rng.gen::<f64>());

    let genuine = |at: Duration, status: &'static str, token: Uuid| Planned {
        at,
        stamp: at,
        status,
        variant: CallbackVariant::Genuine,
        token,
        message_id: sid.to_string(),
    };
    let (sent_at, final_at) = if out_of_order {
        (final_after, sent_after)
    } else {
        (sent_after, final_after)
    };
    let mut reports = vec![
        genuine(sent_at, "sent", tokens[0]),
        genuine(final_at, final_status, tokens[1]),
    ];
    for i in 0..2 {
        if dup[i] < cfg.duplicate_rate.get() {
            let mut d = reports[i].clone();
            d.at += dup_gap[i];
            d.variant = CallbackVariant::Duplicate;
            reports.push(d);
        }
    }
    if stale {
        let mut s = genuine(sent_at.max(final_at) + stale_gap, "sent", tokens[2]);
        s.variant = CallbackVariant::Stale;
        reports.push(s);
    }
    if forged {
        let status = if fail {
            "delivered"
        } else {
            SMS_FAILURES[which].0
        };
        reports.push(Planned {
            variant: forged_as,
            ..genuine(forged_at, status, tokens[3])
        });
    }
    if unknown {
        reports.push(Planned {
            variant: CallbackVariant::UnknownId,
            message_id: unknown_sid,
            ..genuine(unknown_at, "delivered", tokens[4])
        });
    }
    reports.sort_by_key(|p| p.at);
    SmsPlan { timeline, reports }
}

/// The e-mail event types, as SendGrid and Mailgun send them: the provider took the message
/// (`processed`), the receiving server deferred it and the provider will retry (`deferred`), the
/// receiving server accepted it (`delivered`) or rejected it for good, possibly long after the
/// provider's 250 (`bounced`), the recipient marked it as spam (`complained`, after `delivered`).
/// `delivered` and `bounced` are final, the others informational.
pub const EMAIL_EVENTS: [&str; 5] = [
    "processed",
    "deferred",
    "delivered",
    "bounced",
    "complained",
];

/// Plans the delivery events of e-mail `message_id`, accepted as `attempt` to `recipient`.
///
/// In event order: `processed` (when `processed` is on), one or two `deferred` (a share
/// `deferred_rate`), the final `delivered` or `bounced` (a bounce after deferrals is the classic
/// late asynchronous bounce), and for a share `complaint_rate` of the delivered a `complained`.
/// Each event's `timestamp` is when it happened; out of order (a share `out_of_order_rate`), the
/// intermediate events *arrive* after the final one. The duplicate repeats the final event (same
/// id); the stale variant is a late re-delivery of it under a new event id (it cannot be
/// deduplicated by id, only by the message's state).
pub fn email(
    seed: u64,
    recipient: &str,
    attempt: u32,
    message_id: &str,
    cfg: &CallbackConfig,
) -> Vec<Planned> {
    let mut rng = faults::rng(seed, Provider::Smtp, recipient, attempt, "events");
    let (min, max) = (cfg.delay_min.0, cfg.delay_max.0);
    let at = uniform(&mut rng, min, max);
    let bounced = rng.gen::<f64>() < cfg.fail_rate.get();
    let dup = rng.gen::<f64>() < cfg.duplicate_rate.get();
    let dup_gap = uniform(&mut rng, Duration::ZERO, max);
    let stale = rng.gen::<f64>() < cfg.stale_rate.get();
    let stale_gap = uniform(&mut rng, min, max);
    let forged = rng.gen::<f64>() < cfg.forged_rate.get();
    let forged_at = uniform(&mut rng, min, max);
    let unknown = rng.gen::<f64>() < cfg.unknown_id_rate.get();
    let unknown_at = uniform(&mut rng, min, max);
    let tokens: Vec<Uuid> = (0..4).map(|_| token(&mut rng)).collect();
    let unknown_id = format!("<{}@unknown.ting-chaos.invalid>", token(&mut rng));
    // Drawn after everything above, so a profile without these plans what it planned before.
    let processed_at = uniform(&mut rng, Duration::ZERO, min);
    let deferred = rng.gen::<f64>() < cfg.deferred_rate.get();
    let deferrals = rng.gen_range(1..=2usize);
    let deferred_at = [
        uniform(&mut rng, processed_at, at),
        uniform(&mut rng, processed_at, at),
    ];
    let out_of_order = rng.gen::<f64>() < cfg.out_of_order_rate.get();
    let late_gap: Vec<Duration> = (0..3).map(|_| uniform(&mut rng, min, max)).collect();
    let complained = rng.gen::<f64>() < cfg.complaint_rate.get();
    let complaint_gap = uniform(&mut rng, min, max);
    let more: Vec<Uuid> = (0..4).map(|_| token(&mut rng)).collect();
    let forged_as = forgery(rng.gen::<f64>());

    let event = |bounced: bool, at: Duration, token: Uuid| Planned {
        at,
        stamp: at,
        status: if bounced { "bounced" } else { "delivered" },
        variant: CallbackVariant::Genuine,
        token,
        message_id: message_id.to_string(),
    };
    let genuine = event(bounced, at, tokens[0]);
    let mut out = vec![genuine.clone()];
    let info = |status: &'static str, stamp: Duration, token: Uuid| Planned {
        at: stamp,
        stamp,
        status,
        ..event(false, stamp, token)
    };
    let mut intermediate = Vec::new();
    if cfg.processed {
        intermediate.push(info("processed", processed_at, more[0]));
    }
    if deferred {
        let mut stamps = deferred_at[..deferrals].to_vec();
        stamps.sort();
        for (i, stamp) in stamps.into_iter().enumerate() {
            intermediate.push(info("deferred", stamp, more[1 + i]));
        }
    }
    for (i, mut p) in intermediate.into_iter().enumerate() {
        if out_of_order {
            p.at = at + late_gap[i];
        }
        out.push(p);
    }
    if complained && !bounced {
        out.push(info("complained", at + complaint_gap, more[3]));
    }
    if dup {
        out.push(Planned {
            at: at + dup_gap,
            variant: CallbackVariant::Duplicate,
            ..genuine.clone()
        });
    }
    if stale {
        out.push(Planned {
            at: at + stale_gap,
            variant: CallbackVariant::Stale,
            token: tokens[1],
            ..genuine.clone()
        });
    }
    if forged {
        out.push(Planned {
            variant: forged_as,
            ..event(!bounced, forged_at, tokens[2])
        });
    }
    if unknown {
        out.push(Planned {
            variant: CallbackVariant::UnknownId,
            message_id: unknown_id,
            ..event(false, unknown_at, tokens[3])
        });
    }
    out.sort_by_key(|p| p.at);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::{HumanDuration, Ratio};

    fn cfg(rate: f64) -> CallbackConfig {
        CallbackConfig {
            enabled: true,
            delay_min: HumanDuration::from_millis(10),
            delay_max: HumanDuration::from_millis(100),
            duplicate_rate: Ratio(rate),
            stale_rate: Ratio(rate),
            out_of_order_rate: Ratio(rate),
            forged_rate: Ratio(rate),
            unknown_id_rate: Ratio(rate),
            fail_rate: Ratio(rate),
            ..CallbackConfig::default()
        }
    }

    #[test]
    fn sms_plan_shapes() {
        // (rate, expected number of reports)
        let cases = [(0.0, 2), (1.0, 2 + 2 + 1 + 1 + 1)];
        for (rate, n) in cases {
            let p = sms(1, "+15550000001", 1, "SM1", &cfg(rate));
            assert_eq!(p.reports.len(), n, "rate {rate}: {p:?}");
            assert!(p.timeline.sent_after() <= p.timeline.final_after());
            let genuine: Vec<_> = p
                .reports
                .iter()
                .filter(|r| r.variant == CallbackVariant::Genuine)
                .collect();
            assert_eq!(genuine.len(), 2);
            let sent = genuine.iter().find(|r| r.status == "sent").unwrap();
            let fin = genuine.iter().find(|r| r.status != "sent").unwrap();
            assert_eq!(fin.status, p.timeline.final_status());
            if rate == 1.0 {
                assert!(fin.at <= sent.at, "out of order: final first");
                let forged = p.reports.iter().find(|r| r.variant.is_forged()).unwrap();
                assert_ne!(forged.status, p.timeline.final_status());
                let stale = p
                    .reports
                    .iter()
                    .find(|r| r.variant == CallbackVariant::Stale)
                    .unwrap();
                assert!(stale.at >= fin.at && stale.status == "sent");
            } else {
                assert!(sent.at <= fin.at);
                assert_eq!(fin.status, "delivered");
            }
        }
    }

    #[test]
    fn with_callbacks_off_the_timeline_is_the_same_and_nothing_is_planned() {
        for r in ["+15550000001", "+15550000002", "+15550000003"] {
            let on = sms(7, r, 1, "SMx", &cfg(0.5));
            let off = sms(
                7,
                r,
                1,
                "SMx",
                &CallbackConfig {
                    enabled: false,
                    ..cfg(0.5)
                },
            );
            assert!(off.reports.is_empty());
            assert_eq!(on.timeline, off.timeline);
        }
    }

    #[test]
    fn plans_are_deterministic_and_seed_dependent() {
        let c = cfg(0.5);
        assert_eq!(sms(3, "+1555", 2, "SMa", &c), sms(3, "+1555", 2, "SMa", &c));
        assert_ne!(sms(3, "+1555", 2, "SMa", &c), sms(4, "+1555", 2, "SMa", &c));
        assert_eq!(
            email(3, "a@x", 1, "<m@x>", &c),
            email(3, "a@x", 1, "<m@x>", &c)
        );
    }

    #[test]
    fn email_events_in_event_order_and_out_of_order_arrival() {
        // (fail_rate, out_of_order_rate, final event, complained expected)
        let cases = [
            (0.0, 0.0, "delivered", true),
            (0.0, 1.0, "delivered", true),
            (1.0, 1.0, "bounced", false),
        ];
        for (fail, ooo, fin, complained) in cases {
            let c = CallbackConfig {
                processed: true,
                deferred_rate: Ratio(1.0),
                complaint_rate: Ratio(1.0),
                fail_rate: Ratio(fail),
                out_of_order_rate: Ratio(ooo),
                ..cfg(0.0)
            };
            let p = email(5, "a@example.test", 1, "<m1@x>", &c);
            let mut by_stamp = p.clone();
            by_stamp.sort_by_key(|e| e.stamp);
            let kinds: Vec<_> = by_stamp.iter().map(|e| e.status).collect();
            let deferrals = kinds.iter().filter(|k| **k == "deferred").count();
            assert!((1..=2).contains(&deferrals), "{kinds:?}");
            let mut want = vec!["processed"];
            want.extend(std::iter::repeat_n("deferred", deferrals));
            want.push(fin);
            if complained {
                want.push("complained");
            }
            assert_eq!(kinds, want, "fail {fail} ooo {ooo}");
            assert!(p.iter().all(|e| EMAIL_EVENTS.contains(&e.status)));
            let final_at = p.iter().find(|e| e.status == fin).unwrap().at;
            let intermediate_late = p
                .iter()
                .filter(|e| matches!(e.status, "processed" | "deferred"))
                .all(|e| e.at > final_at);
            assert_eq!(
                intermediate_late,
                ooo == 1.0,
                "fail {fail} ooo {ooo}: {p:?}"
            );
        }
    }

    /// Every forgery is one report; about [`UNSIGNED_SHARE`] of them carry no signature at all,
    /// the others a wrong one, and which is drawn last: the rest of the plan does not depend on it.
    #[test]
    fn forged_reports_are_unsigned_or_signed_with_a_wrong_key() {
        let (mut unsigned, mut wrong_key) = (0, 0);
        for i in 0..400 {
            let to = format!("+1555{i:07}");
            let sms_plan = sms(7, &to, 1, "SM1", &cfg(1.0)).reports;
            let mail = email(7, &format!("r{i}@example.test"), 1, "<m@x>", &cfg(1.0));
            for p in sms_plan
                .iter()
                .chain(&mail)
                .filter(|p| p.variant.is_forged())
            {
                match p.variant {
                    CallbackVariant::Unsigned => unsigned += 1,
                    _ => wrong_key += 1,
                }
            }
        }
        assert_eq!(
            unsigned + wrong_key,
            800,
            "one forgery per message at rate 1"
        );
        let share = unsigned as f64 / 800.0;
        assert!(
            (share - UNSIGNED_SHARE).abs() < 0.1,
            "{unsigned} unsigned of 800"
        );
    }

    #[test]
    fn email_plan_variants() {
        let p = email(1, "a@example.test", 1, "<m1@x>", &cfg(1.0));
        let kinds: Vec<_> = p.iter().map(|r| r.variant).collect();
        for v in [
            CallbackVariant::Genuine,
            CallbackVariant::Duplicate,
            CallbackVariant::Stale,
            CallbackVariant::UnknownId,
        ] {
            assert!(kinds.contains(&v), "{v:?} missing from {kinds:?}");
        }
        assert_eq!(
            kinds.iter().filter(|v| v.is_forged()).count(),
            1,
            "{kinds:?}"
        );
        let g = p
            .iter()
            .find(|r| r.variant == CallbackVariant::Genuine)
            .unwrap();
        let d = p
            .iter()
            .find(|r| r.variant == CallbackVariant::Duplicate)
            .unwrap();
        assert_eq!((&g.token, g.stamp, g.status), (&d.token, d.stamp, d.status));
        assert_eq!(g.status, "bounced");
        assert!(g.reason().is_some());
    }
}
