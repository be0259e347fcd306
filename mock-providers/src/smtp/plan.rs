//! Seeded fault and latency decisions for the fake SMTP server.
//!
//! Pure functions of (seed, config, subject, attempt), built on [`crate::faults`]; they never
//! look at the clock, the peer or arrival order, so the same seed replays the same faults.
//!
//! Keys, documented because replay depends on them:
//! - RCPT: each `RCPT TO` reserves the next attempt number of its recipient and gets its own
//!   decision keyed on (recipient, attempt) — bad address first, then the RCPT faults — also
//!   when it is one of several recipients of a transaction;
//! - DATA, mid-DATA drop, end of DATA, accept-then-drop, and the DATA / end-of-DATA latency:
//!   a transaction gets one reply at each of these stages, so they are decided once per
//!   transaction ([`transaction_plan`]): keyed on (recipient, attempt) for a single-recipient
//!   transaction, and on the set of its accepted (recipient, attempt) pairs — sorted, so RCPT
//!   order does not matter — for several. Every recipient of a transaction shares its fate at
//!   these stages, so a recipient's outcome there depends on which recipients it was batched
//!   with (never on timing), and the configured rates are per transaction, whatever its size;
//! - MAIL, before any recipient is known: keyed on (`"<mail from:SENDER>"`, n), n counting the
//!   `MAIL` commands from that sender. The n-th MAIL from a sender always meets the same fault,
//!   but *which* transaction is the n-th is arrival order when one sender has several
//!   connections in flight: deterministic per sender only when its transactions are serialised.
//!   A MAIL rejection reserves no recipient attempt, so it never shifts a recipient's faults;
//! - greeting, before anything is known: keyed on (`"<greeting>"`, n), n counting connections:
//!   which connection is refused is arrival order by nature. A refused connection reserves no
//!   attempt either.
//!
//! Faults of one stage partition `[0, 1)` in the order the profile lists them (see
//! [`crate::faults::pick`]), so their rates add up.

use std::time::Duration;

use crate::config::{SmtpConfig, SmtpStage};
use crate::faults;
use crate::latency;
use crate::ledger::{Outcome, Provider};

use super::reply::{default_enhanced, fault_text, Reply};

/// Subject the greeting counter and fault draw key on.
pub const GREETING_KEY: &str = "<greeting>";

/// The ledger subject MAIL faults key on for `sender`.
pub fn mail_key(sender: &str) -> String {
    format!("<mail from:{sender}>")
}

/// A reply injected on purpose, with the label the ledger stores as `fault`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectedFault {
    pub stage: SmtpStage,
    pub reply: Reply,
    /// `"rcpt 451"`, `"data_end 554"`, `"greeting 421"`, `"bad_address"`.
    pub label: String,
}

impl InjectedFault {
    /// 4yz → Transient, 5yz → Permanent.
    pub fn outcome(&self) -> Outcome {
        outcome_of(&self.reply)
    }
}

/// The ledger outcome of a rejection reply.
pub fn outcome_of(reply: &Reply) -> Outcome {
    if reply.is_transient() {
        Outcome::Transient
    } else {
        Outcome::Permanent
    }
}

/// What one recipient's attempt will meet after its RCPT was accepted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub data: Option<InjectedFault>,
    pub drop_mid_data: bool,
    pub data_end: Option<InjectedFault>,
    pub accept_then_drop: bool,
}

/// An accepted recipient of the current transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rcpt {
    pub addr: String,
    pub attempt: u32,
    pub plan: Plan,
}

/// The fault (if any) the profile injects at `stage` for attempt `attempt` of `subject`.
pub fn stage_fault(
    seed: u64,
    cfg: &SmtpConfig,
    stage: SmtpStage,
    subject: &str,
    attempt: u32,
) -> Option<InjectedFault> {
    let of_stage: Vec<_> = cfg.faults.iter().filter(|f| f.stage == stage).collect();
    if of_stage.is_empty() {
        return None;
    }
    let name = stage.as_str();
    let salt = format!("smtp:{name}");
    let i = faults::pick(
        seed,
        Provider::Smtp,
        subject,
        attempt,
        &salt,
        of_stage.iter().map(|f| f.rate),
    )?;
    let f = of_stage[i];
    let enhanced = f
        .enhanced
        .clone()
        .unwrap_or_else(|| default_enhanced(stage, f.code));
    Some(InjectedFault {
        stage,
        reply: Reply::new(f.code, &enhanced, fault_text(f.code)),
        label: format!("{name} {}", f.code),
    })
}

/// Decides a recipient's attempt: the RCPT rejection (bad address first, then RCPT faults), or
/// the plan for the later stages.
pub fn plan_recipient(
    seed: u64,
    cfg: &SmtpConfig,
    rcpt: &str,
    attempt: u32,
) -> Result<Plan, InjectedFault> {
    if faults::is_bad_address(seed, Provider::Smtp, rcpt, cfg.bad_addresses) {
        return Err(InjectedFault {
            stage: SmtpStage::Rcpt,
            reply: Reply::new(550, "5.1.1", "mailbox unknown"),
            label: "bad_address".into(),
        });
    }
    if let Some(f) = stage_fault(seed, cfg, SmtpStage::Rcpt, rcpt, attempt) {
        return Err(f);
    }
    Ok(later_stages(seed, cfg, rcpt, attempt))
}

/// The subject and attempt the transaction-wide decisions of `rcpts` (its accepted recipients,
/// at least one) key on: the recipient and its attempt when there is one, otherwise
/// `"<transaction:a@x#1,b@x#3>"` (sorted by address and attempt) and attempt 0.
pub fn transaction_key(rcpts: &[Rcpt]) -> (String, u32) {
    if let [only] = rcpts {
        return (only.addr.clone(), only.attempt);
    }
    let mut pairs: Vec<(&str, u32)> = rcpts.iter().map(|r| (r.addr.as_str(), r.attempt)).collect();
    pairs.sort_unstable();
    let list: Vec<String> = pairs.iter().map(|(a, k)| format!("{a}#{k}")).collect();
    (format!("<transaction:{}>", list.join(",")), 0)
}

/// What the whole transaction of `rcpts` meets after its RCPTs: the recipient's own plan when
/// there is one recipient, otherwise one plan drawn for the set (see the module docs).
pub fn transaction_plan(seed: u64, cfg: &SmtpConfig, rcpts: &[Rcpt]) -> Plan {
    if let [only] = rcpts {
        return only.plan.clone();
    }
    let (subject, attempt) = transaction_key(rcpts);
    later_stages(seed, cfg, &subject, attempt)
}

/// The DATA-and-after decisions for (subject, attempt).
fn later_stages(seed: u64, cfg: &SmtpConfig, subject: &str, attempt: u32) -> Plan {
    let flag = |salt: &str, rate| {
        faults::pick(seed, Provider::Smtp, subject, attempt, salt, [rate]).is_some()
    };
    Plan {
        data: stage_fault(seed, cfg, SmtpStage::Data, subject, attempt),
        drop_mid_data: flag("smtp:drop_mid_data", cfg.drop_mid_data_rate),
        data_end: stage_fault(seed, cfg, SmtpStage::DataEnd, subject, attempt),
        accept_then_drop: flag("smtp:accept_then_drop", cfg.accept_then_drop_rate),
    }
}

/// The delay before the reply at `stage`: `stage_latency[stage]`, plus `latency` (the commit
/// latency) at the end of DATA. Seeded by (subject, attempt, stage).
pub fn delay(
    seed: u64,
    cfg: &SmtpConfig,
    stage: SmtpStage,
    subject: &str,
    attempt: u32,
) -> Duration {
    let salt = format!("smtp:latency:{}", stage.as_str());
    let mut rng = faults::rng(seed, Provider::Smtp, subject, attempt, &salt);
    let mut d = cfg
        .stage_latency
        .get(&stage)
        .map(|p| latency::sample(p, &mut rng))
        .unwrap_or_default();
    if stage == SmtpStage::DataEnd {
        d += latency::sample(&cfg.latency, &mut rng);
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Latency, SmtpFault};
    use crate::units::{HumanDuration, Ratio};

    fn fault(stage: SmtpStage, code: u16, rate: f64) -> SmtpFault {
        SmtpFault {
            stage,
            code,
            enhanced: None,
            rate: Ratio(rate),
        }
    }

    #[test]
    fn certain_faults_fire_with_default_codes() {
        let cfg = SmtpConfig {
            faults: vec![
                fault(SmtpStage::Rcpt, 451, 0.0),
                fault(SmtpStage::Data, 554, 1.0),
                fault(SmtpStage::DataEnd, 452, 1.0),
            ],
            drop_mid_data_rate: Ratio(1.0),
            ..SmtpConfig::default()
        };
        let plan = plan_recipient(1, &cfg, "a@x.test", 1).expect("rcpt accepted");
        let data = plan.data.expect("data fault");
        assert_eq!(
            (data.reply.status(), data.label.as_str()),
            ("554 5.7.1".into(), "data 554")
        );
        let end = plan.data_end.expect("data_end fault");
        assert_eq!(
            (end.reply.status(), end.label.as_str()),
            ("452 4.3.1".into(), "data_end 452")
        );
        assert_eq!(end.outcome(), Outcome::Transient);
        assert!(plan.drop_mid_data && !plan.accept_then_drop);
    }

    #[test]
    fn bad_address_wins_over_rcpt_faults_and_explicit_enhanced_is_kept() {
        let mut cfg = SmtpConfig {
            faults: vec![SmtpFault {
                enhanced: Some("4.7.1".into()),
                ..fault(SmtpStage::Rcpt, 450, 1.0)
            }],
            ..SmtpConfig::default()
        };
        let f = plan_recipient(1, &cfg, "a@x.test", 1).unwrap_err();
        assert_eq!(
            (f.reply.status(), f.label.as_str()),
            ("450 4.7.1".into(), "rcpt 450")
        );
        cfg.bad_addresses = Ratio(1.0);
        let f = plan_recipient(1, &cfg, "a@x.test", 1).unwrap_err();
        assert_eq!(
            (f.reply.status(), f.label.as_str()),
            ("550 5.1.1".into(), "bad_address")
        );
        assert_eq!(f.outcome(), Outcome::Permanent);
    }

    #[test]
    fn decisions_depend_on_recipient_and_attempt_only() {
        let cfg = SmtpConfig {
            faults: vec![
                fault(SmtpStage::Rcpt, 451, 0.3),
                fault(SmtpStage::DataEnd, 554, 0.3),
            ],
            accept_then_drop_rate: Ratio(0.2),
            ..SmtpConfig::default()
        };
        let run = |order: &[u32]| {
            let mut v: Vec<_> = order
                .iter()
                .map(|&k| {
                    (
                        k,
                        plan_recipient(9, &cfg, &format!("r{}@x.test", k % 7), k / 7),
                    )
                })
                .collect();
            v.sort_by_key(|(k, _)| *k);
            v
        };
        let fwd: Vec<u32> = (0..200).collect();
        let rev: Vec<u32> = (0..200).rev().collect();
        let a = run(&fwd);
        assert_eq!(a, run(&rev));
        assert!(a.iter().any(|(_, p)| p.is_err()) && a.iter().any(|(_, p)| p.is_ok()));
        assert!(a
            .iter()
            .any(|(_, p)| matches!(p, Ok(p) if p.data_end.is_some())));
        assert!(a
            .iter()
            .any(|(_, p)| matches!(p, Ok(p) if p.accept_then_drop)));
    }

    #[test]
    fn a_transaction_is_planned_from_its_recipient_set_not_its_rcpt_order() {
        let cfg = SmtpConfig {
            faults: vec![
                fault(SmtpStage::Data, 554, 0.2),
                fault(SmtpStage::DataEnd, 451, 0.2),
            ],
            drop_mid_data_rate: Ratio(0.1),
            accept_then_drop_rate: Ratio(0.2),
            ..SmtpConfig::default()
        };
        let rcpt = |a: &str, k: u32| Rcpt {
            addr: a.into(),
            attempt: k,
            plan: plan_recipient(5, &cfg, a, k).unwrap(),
        };
        // One recipient: its own plan, exactly.
        let one = [rcpt("a@x.test", 1)];
        assert_eq!(transaction_plan(5, &cfg, &one), one[0].plan);
        assert_eq!(transaction_key(&one), ("a@x.test".into(), 1));
        // Several: one draw for the set, the same in any RCPT order, different per set.
        let mut plans = std::collections::BTreeSet::new();
        for i in 0..200u32 {
            let set = [
                rcpt(&format!("a{i}@x.test"), 1 + i % 3),
                rcpt("b@x.test", 2),
            ];
            let rev = [set[1].clone(), set[0].clone()];
            let p = transaction_plan(5, &cfg, &set);
            assert_eq!(p, transaction_plan(5, &cfg, &rev));
            assert_eq!(transaction_key(&set), transaction_key(&rev));
            plans.insert(format!("{p:?}"));
        }
        assert!(plans.len() > 3, "the set draws vary: {plans:?}");
        assert_eq!(
            transaction_key(&[rcpt("b@x.test", 2), rcpt("a@x.test", 7)]),
            ("<transaction:a@x.test#7,b@x.test#2>".into(), 0)
        );
    }

    #[test]
    fn delay_adds_commit_latency_at_data_end_only() {
        let fixed = |ms| Latency::Fixed {
            value: HumanDuration::from_millis(ms),
        };
        let cfg = SmtpConfig {
            latency: fixed(30),
            stage_latency: [(SmtpStage::Rcpt, fixed(5)), (SmtpStage::DataEnd, fixed(7))].into(),
            ..SmtpConfig::default()
        };
        let d = |stage| delay(1, &cfg, stage, "a@x.test", 1).as_millis();
        assert_eq!(
            [
                d(SmtpStage::Greeting),
                d(SmtpStage::Rcpt),
                d(SmtpStage::DataEnd)
            ],
            [0, 5, 37]
        );
    }
}
