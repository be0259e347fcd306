//! `exactly_once`: no customer receives a notification twice, and nobody unexpected receives one.
//!
//! Counts `Accepted` send attempts in the ledger per expected (recipient, channel). More than one
//! is a duplicate — unless the one accept beyond the first (in arrival order) is the send its
//! process had under way when it was frozen (`availability::resumed_mid_send`: the first send of
//! that process within 25 ms of its SIGCONT): no stack can re-check a lease between its last
//! check and the write, and without a provider-side fencing token that duplicate is the chaos's,
//! counted in `duplicates_resumed_mid_send`, never hidden. Zero is allowed here (whether it ended
//! properly is `no_loss`'s business). An
//! `IdempotentRepeat` is the provider recognising a retry key, not a new delivery. Judged: every
//! expected delivery (`duplicate`, needs one) and every address that saw a send
//! (`unexpected_recipient`, may be none: an address none of the load's recipients has). A
//! recipient of a batch the stack did not accept within the load's retry window is no stranger —
//! nothing is expected for it (`responsiveness` judges the batch), but a stack that took the batch
//! after the load gave up sends to it: counted (`sends_for_batches_not_accepted`), not flagged.
//! Must never consult the stack's status API: the ledger alone says what customers got.

use std::collections::HashSet;

use mock_providers::ledger::{Outcome, Provider};
use serde_json::{json, Value};

use super::common::{attempt_json, channel_of, delivery_json, figures, ByAddress, Findings};
use super::{Input, Verdict};
use crate::load::recipients;

pub const NAME: &str = "exactly_once";

pub fn check(input: &Input) -> Verdict {
    let sends = input.sends();
    let mut findings = Findings::default();
    let (mut once, mut never, mut duplicated, mut extra_sends) = (0u64, 0u64, 0u64, 0u64);
    let mut resumed = 0u64;
    let under_way = super::availability::resumed_mid_send(input);

    for e in input.expected {
        let accepted: Vec<_> = sends
            .of_expected(e)
            .iter()
            .filter(|s| s.outcome == Outcome::Accepted)
            .collect();
        match accepted.len() {
            0 => never += 1,
            1 => once += 1,
            2 if under_way.contains(&accepted[1].seq) => resumed += 1,
            n => {
                duplicated += 1;
                extra_sends += n as u64 - 1;
                let mut c = delivery_json(e);
                c.insert("rule".into(), json!("duplicate"));
                c.insert("accepted".into(), json!(n));
                c.insert("sends".into(), sends_json(&accepted, input));
                findings.push(Value::Object(c));
            }
        }
    }

    let expected = ByAddress::new(input.expected);
    let mut unexpected_keys: Vec<_> = sends
        .keys()
        .filter(|(p, a)| !expected.contains(*p, a))
        .collect();
    unexpected_keys.sort();
    drop(expected);
    // The load's own recipients (also of batches never accepted), generated again only when
    // some address is unexpected: a big run's are hundreds of thousands of strings.
    let recipients = if unexpected_keys.is_empty() {
        Vec::new()
    } else {
        recipients::of_run(input.scenario)
    };
    let people: HashSet<(Provider, &str)> = recipients
        .iter()
        .flat_map(|r| {
            input
                .scenario
                .load
                .channels
                .iter()
                .map(|c| (c.provider(), r.address(*c)))
        })
        .collect();
    let (mut unexpected, mut not_accepted) = (0u64, 0u64);
    for (provider, address) in unexpected_keys {
        let accepted: Vec<_> = sends
            .by_key(provider, address)
            .iter()
            .filter(|s| s.outcome == Outcome::Accepted)
            .collect();
        if accepted.is_empty() {
            continue;
        }
        if people.contains(&(provider, address)) {
            not_accepted += accepted.len() as u64;
            continue;
        }
        unexpected += accepted.len() as u64;
        findings.push(json!({
            "rule": "unexpected_recipient",
            "channel": channel_of(provider).as_str(),
            "address": address,
            "accepted": accepted.len(),
            "sends": sends_json(&accepted, input),
        }));
    }

    let summary = format!(
        "{} deliveries: {once} accepted once, {duplicated} duplicated ({extra_sends} extra sends), \
         {resumed} sent again by a process frozen mid-send, {unexpected} sends to unexpected \
         addresses, {never} never accepted",
        input.expected.len()
    );
    let figs = figures(json!({
        "deliveries": input.expected.len(),
        "accepted_once": once,
        "duplicated_deliveries": duplicated,
        "extra_sends": extra_sends,
        "unexpected_sends": unexpected,
        "sends_for_batches_not_accepted": not_accepted,
        "never_accepted": never,
        "duplicates_resumed_mid_send": resumed,
    }));
    findings.judged("duplicate", input.expected.len() as u64);
    findings.judged_at_least("unexpected_recipient", sends.keys().count() as u64, 0);
    findings.verdict(NAME, summary, figs)
}

fn sends_json(sends: &[&&super::Entry], input: &Input) -> Value {
    Value::Array(sends.iter().map(|s| attempt_json(s, input)).collect())
}

#[cfg(test)]
mod tests {
    use mock_providers::ledger::Outcome::*;

    use super::*;
    use crate::check::testkit::*;
    use crate::check::{PayloadHash, Status};
    use crate::scenario::Channel::*;

    #[test]
    fn one_accept_per_delivery_holds_even_with_retries_and_repeats() {
        let mut w = World::new();
        let a = w.expect("r1", Line);
        let b = w.expect("r2", Email);
        let c = w.expect("r3", Sms);
        w.send(Line, &a, Transient, 0);
        w.send(Line, &a, Accepted, 200);
        w.send(Line, &a, IdempotentRepeat, 400);
        w.send(Email, &b, Accepted, 0);
        w.send(Sms, &c, Permanent, 0); // never accepted: not this checker's business
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        assert_eq!(v.figures["accepted_once"], 2);
        assert_eq!(v.figures["never_accepted"], 1);
    }

    #[test]
    fn duplicates_and_unexpected_recipients_are_violations() {
        // (what is broken, rule reported)
        let cases: [(&str, &str); 2] = [
            ("duplicate", "duplicate"),
            ("stranger", "unexpected_recipient"),
        ];
        for (case, rule) in cases {
            let mut w = World::new();
            let a = w.expect("r1", Sms);
            w.send(Sms, &a, Accepted, 10).pid(7);
            match case {
                "duplicate" => {
                    w.send(Sms, &a, Accepted, 2_000).pid(8).hash("other");
                }
                _ => {
                    w.send(Sms, "+15559999", Accepted, 20);
                }
            }
            let v = check(&w.input());
            assert_eq!(v.status, Status::Violated, "{case}: {v:#?}");
            assert_eq!(rules(&v), [rule], "{case}");
            let c = &v.counterexamples[0];
            if case == "duplicate" {
                assert_eq!(c["recipient"], "r1");
                assert_eq!(c["address"], a.as_str());
                assert_eq!(c["sends"][0]["pid"], 7);
                assert_eq!(c["sends"][1]["pid"], 8);
                assert_eq!(c["sends"][1]["at_ms"], 2_000.0);
                assert_eq!(
                    c["sends"][1]["payload_hash"],
                    PayloadHash::of("other").to_string()
                );
                assert_eq!(v.figures["extra_sends"], 1);
            } else {
                assert_eq!(c["address"], "+15559999");
            }
        }
    }

    /// A batch the stack did not accept in time is not expected (`run/not_accepted.rs`), but its
    /// recipients are the load's: a stack that took it late and sent it sent to no stranger.
    #[test]
    fn a_recipient_of_a_batch_not_accepted_is_no_stranger() {
        let mut w = World::new();
        let a = w.expect("r1", Sms);
        w.send(Sms, &a, Accepted, 10);
        let late = crate::load::recipients::of_run(&w.scenario)[0]
            .phone
            .clone();
        w.send(Sms, &late, Accepted, 20);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        assert_eq!(v.figures["sends_for_batches_not_accepted"], 1);
        assert_eq!(v.figures["unexpected_sends"], 0);
    }

    #[test]
    fn counterexamples_are_capped_but_counted() {
        let mut w = World::new();
        for i in 0..60 {
            let a = w.expect(&format!("r{i}"), Line);
            w.send(Line, &a, Accepted, 0);
            w.send(Line, &a, Accepted, 1);
        }
        let v = check(&w.input());
        assert_eq!(v.counterexamples.len(), crate::check::common::MAX_KEPT);
        assert_eq!(v.total_counterexamples, 60);
    }
}
