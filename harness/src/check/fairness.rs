//! `fairness`: small orders are not stuck behind a campaign.
//!
//! Each of the trickle's orders (`[load] trickle`) is timed on its own, from the moment its
//! `POST /v1/batches` was sent to the provider's first acceptance of the *last* of its
//! deliveries — when the customer had everything. The p99 of those times must be within
//! `expect.order_e2e_p99` (nearest rank, over the orders whose deliveries were all accepted: a
//! delivery never accepted is `no_loss`'s to judge, and a permanently bad address has no
//! acceptance to wait for), each order's time less the machine's stalls inside it
//! (`crate::stalls`, as every timed rule; `p99_ms` stays the measured one). A p99 needs at
//! least [`MIN_ORDERS`] orders; fewer is not a pass.
//! The counterexamples name the orders that waited longest: batch id, when it was enqueued, its
//! first and last acceptance, and how many of the campaign's sends went out while it waited
//! (none for every one of them: the orders alone were more than the stack sends at a time, a
//! capacity the SLO also holds it to, and the summary says so). Reads only the harness's own
//! clock and the providers' ledger.

use std::collections::HashMap;

use mock_providers::ledger::Outcome;
use serde_json::json;

use super::common::{figures, ms, not_checked, Findings};
use super::{Input, Status, Verdict};
use crate::stalls::stalled_ns;

pub const NAME: &str = "fairness";

/// Orders a p99 needs: over fewer, the "p99" is just the slowest one.
pub const MIN_ORDERS: usize = 100;

/// One order's end-to-end time.
struct Order<'a> {
    batch_id: &'a str,
    sent_ns: u64,
    first_accept_ns: u64,
    last_accept_ns: u64,
    /// The delivery accepted last (`recipient/channel`).
    last: String,
    /// How long the machine stalled between the POST and the last acceptance.
    stalled_ns: u64,
}

impl Order<'_> {
    fn e2e_ns(&self) -> u64 {
        self.last_accept_ns.saturating_sub(self.sent_ns)
    }

    /// What is judged: the time less the machine's stalls inside it.
    fn judged_ns(&self) -> u64 {
        self.e2e_ns().saturating_sub(self.stalled_ns)
    }
}

pub fn check(input: &Input) -> Verdict {
    let orders: Vec<_> = input.batches.iter().filter(|b| b.trickle).collect();
    if orders.is_empty() {
        return not_checked(NAME, "no trickle in [load]: no small orders to time");
    }
    // When a delivery was first accepted: looked up for the orders' few deliveries only.
    let sends = input.sends();
    let first_accept = |e: &super::Expected| {
        sends
            .of_expected(e)
            .iter()
            .filter(|s| s.outcome == Outcome::Accepted)
            .map(|s| s.mono_ns)
            .min()
    };
    let order_ids: std::collections::HashSet<&str> =
        orders.iter().map(|b| b.batch_id.as_str()).collect();
    let mut deliveries: HashMap<&str, Vec<&super::Expected>> = HashMap::new();
    for e in input
        .expected
        .iter()
        .filter(|e| !e.bad && order_ids.contains(e.batch_id.as_str()))
    {
        deliveries.entry(e.batch_id.as_str()).or_default().push(e);
    }
    let mut timed = Vec::new();
    let mut unfinished = 0usize;
    for b in &orders {
        let Some(ds) = deliveries.get(b.batch_id.as_str()) else {
            continue; // every address bad: nothing to wait for
        };
        let accepts: Option<Vec<(u64, String)>> = ds
            .iter()
            .map(|e| {
                let at = first_accept(e)?;
                Some((at, format!("{}/{}", e.recipient, e.channel.as_str())))
            })
            .collect();
        let Some(accepts) = accepts else {
            unfinished += 1;
            continue;
        };
        let (last_accept_ns, last) = accepts.iter().max().cloned().unwrap_or_default();
        timed.push(Order {
            batch_id: &b.batch_id,
            sent_ns: b.sent_ns,
            first_accept_ns: accepts.iter().map(|a| a.0).min().unwrap_or_default(),
            last_accept_ns,
            last,
            stalled_ns: stalled_ns(input.stalls, b.sent_ns, last_accept_ns),
        });
    }
    timed.sort_by_key(|o| std::cmp::Reverse(o.judged_ns()));
    let mut e2e_ms: Vec<f64> = timed.iter().map(|o| o.e2e_ns() as f64 / 1e6).collect();
    e2e_ms.sort_by(f64::total_cmp);
    let judged_ms: Vec<f64> = timed
        .iter()
        .rev()
        .map(|o| o.judged_ns() as f64 / 1e6)
        .collect();
    let pct = |p: f64| nearest_rank(&e2e_ms, p);
    let mut figs = figures(json!({
        "orders": orders.len(),
        "judged": timed.len(),
        "unfinished": unfinished,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": e2e_ms.last().copied().unwrap_or(0.0),
    }));
    if !input.stalls.is_empty() {
        figs.insert(
            "p99_ms_without_stalls".into(),
            json!(nearest_rank(&judged_ms, 0.99)),
        );
    }
    let stats = format!(
        "{} orders timed: e2e p50 {} ms, p99 {} ms, max {} ms",
        timed.len(),
        pct(0.50),
        pct(0.99),
        e2e_ms.last().copied().unwrap_or(0.0)
    );
    let Some(slo) = input.scenario.expect.order_e2e_p99 else {
        return Findings::default().verdict_with(
            NAME,
            Status::NotChecked,
            format!("no order_e2e_p99 in [expect]; {stats}"),
            figs,
        );
    };
    let slo_ms = slo.as_secs_f64() * 1e3;
    figs.insert("slo_p99_ms".into(), json!(slo_ms));
    let mut findings = Findings::default();
    findings.judged_at_least(
        "order_e2e_p99_over_slo",
        timed.len() as u64,
        MIN_ORDERS as u64,
    );
    if timed.len() < MIN_ORDERS {
        // Holds on too little: insufficient, never a pass.
        return findings.verdict(
            NAME,
            format!(
                "{stats}: a p99 needs at least {MIN_ORDERS} orders whose deliveries were all accepted"
            ),
            figs,
        );
    }
    let p99 = nearest_rank(&judged_ms, 0.99);
    let stats = if input.stalls.is_empty() {
        stats
    } else {
        format!("{stats} ({p99} ms less the machine's stalls inside them)")
    };
    if p99 <= slo_ms {
        return findings.verdict(
            NAME,
            format!("{stats}: p99 within the {slo_ms} ms SLO"),
            figs,
        );
    }
    findings.push(json!({
        "rule": "order_e2e_p99_over_slo",
        "p99_ms": pct(0.99),
        "p99_ms_without_stalls": p99,
        "slo_ms": slo_ms,
        "orders": timed.len(),
    }));
    let campaign = campaign_sends(input, &order_ids);
    let mut behind_campaign = 0usize;
    for o in timed
        .iter()
        .take_while(|o| o.judged_ns() as f64 / 1e6 > slo_ms)
    {
        let during = campaign.partition_point(|t| *t < o.last_accept_ns)
            - campaign.partition_point(|t| *t < o.sent_ns);
        behind_campaign += usize::from(during > 0);
        findings.push(json!({
            "rule": "order_waited",
            "batch_id": o.batch_id,
            "enqueued_at_ms": ms(o.sent_ns),
            "first_accept_ms": ms(o.first_accept_ns),
            "last_accept_ms": ms(o.last_accept_ns),
            "e2e_ms": o.e2e_ns() as f64 / 1e6,
            "last_delivery": o.last,
            "campaign_sends_while_waiting": during,
        }));
    }
    let waited = findings.total() - 1;
    let why = if behind_campaign == 0 {
        " (no campaign send went out while any of them waited: the orders alone were more than \
         the stack sent at a time)"
            .to_string()
    } else {
        format!(", {behind_campaign} of them while campaign sends went out")
    };
    findings.verdict(
        NAME,
        format!("{stats}: p99 over the {slo_ms} ms SLO; {waited} orders waited longer{why}"),
        figs,
    )
}

/// When each send of the campaign (every batch but the trickle's orders) reached its provider,
/// ascending: the campaign's deliveries' attempts from the checkers' shared send index, each
/// once (by `seq`) should two deliveries share an address.
fn campaign_sends(input: &Input, order_ids: &std::collections::HashSet<&str>) -> Vec<u64> {
    let sends = input.sends();
    let mut at: Vec<(u64, u64)> = input
        .expected
        .iter()
        .filter(|e| !order_ids.contains(e.batch_id.as_str()))
        .flat_map(|e| sends.of_expected(e))
        .map(|s| (s.received_ns, s.seq))
        .collect();
    at.sort_unstable();
    at.dedup();
    at.into_iter().map(|(received, _)| received).collect()
}

/// The nearest-rank percentile `p` of ascending `sorted` (0 when empty).
fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mock_providers::ledger::Outcome::*;

    use super::*;
    use crate::check::testkit::*;
    use crate::scenario::Channel::*;

    /// `n` one-recipient orders on LINE and SMS, order `k` enqueued at `k × 50` ms and its last
    /// delivery accepted `wait(k)` ms later (the first 10 ms after enqueue).
    fn orders(n: u64, wait: impl Fn(u64) -> u64) -> World {
        let mut w = World::new();
        w.scenario.expect.order_e2e_p99 = Some(Duration::from_millis(2_000));
        for k in 0..n {
            let r = format!("r{k}");
            let batch = format!("o{k}");
            let at = k * 50;
            w.enqueued(&batch, at, true);
            let line = w.expect_in(&r, Line, &batch);
            let sms = w.expect_in(&r, Sms, &batch);
            w.send(Line, &line, Accepted, at + 5);
            w.send(Sms, &sms, Transient, at + 5);
            w.send(Sms, &sms, Accepted, at + wait(k) - LATENCY_MS);
        }
        w
    }

    #[test]
    fn orders_within_the_slo_hold_at_its_edge() {
        // Every order waits just under the SLO: a slower correct stack, not flagged.
        let w = orders(120, |_| 1_999);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        assert_eq!(v.figures["judged"], 120);
        assert_eq!(v.figures["p99_ms"], 1_999.0);
        // One order in a hundred may wait longer: a p99, not a max.
        let w = orders(120, |k| if k == 7 { 9_000 } else { 100 });
        assert_eq!(check(&w.input()).status, Status::Holds);
    }

    #[test]
    fn orders_stuck_behind_a_campaign_are_named() {
        // The later an order, the longer it waits: FIFO behind a campaign.
        let w = orders(120, |k| 100 + k * 100);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Violated, "{v:#?}");
        let r = rules(&v);
        assert_eq!(r[0], "order_e2e_p99_over_slo");
        assert!(r[1..].iter().all(|r| r == "order_waited"), "{r:?}");
        // Slowest first, naming the order, when it was enqueued and its accepts.
        let worst = &v.counterexamples[1];
        assert_eq!(worst["batch_id"], "o119");
        assert_eq!(worst["enqueued_at_ms"], 5_950.0);
        assert_eq!(worst["first_accept_ms"], 5_960.0);
        assert_eq!(worst["last_accept_ms"], 5_950.0 + 12_000.0);
        assert_eq!(worst["last_delivery"], "r119/sms");
        // Orders 20..=119 waited over 2 s.
        assert_eq!(v.total_counterexamples, 1 + 100);
        // No campaign in this run: the orders alone were more than the stack sent, and the
        // summary says so rather than blame the campaign.
        assert_eq!(worst["campaign_sends_while_waiting"], 0);
        assert!(v.summary.contains("the orders alone"), "{}", v.summary);

        // A campaign's sends going out while the orders waited are counted against each.
        let mut w = orders(120, |k| 100 + k * 100);
        w.enqueued("campaign", 0, false);
        for i in 0..60u64 {
            let c = w.expect_in(&format!("c{i}"), Line, "campaign");
            w.send(Line, &c, Accepted, 6_000 + i * 100);
        }
        let v = check(&w.input());
        let worst = &v.counterexamples[1];
        assert_eq!(worst["batch_id"], "o119");
        // o119 waited from 5,950 to 17,950 ms: every one of the 60 campaign sends (6.0–11.9 s).
        assert_eq!(worst["campaign_sends_while_waiting"], 60);
        assert!(
            v.summary.contains("while campaign sends went out"),
            "{}",
            v.summary
        );
    }

    /// Orders stuck behind a campaign (the later, the longer) fail; the same waits fall within
    /// the SLO when the machine stalled for most of each (stalls outside them excuse nothing).
    #[test]
    fn the_machine_stalls_inside_an_order_do_not_count_against_the_slo() {
        let stalled = |stalls: Vec<crate::stalls::Stall>| {
            let mut w = orders(120, |k| 100 + k * 100);
            w.stalls = stalls;
            check(&w.input())
        };
        // Order k waits from k × 50 ms to k × 150 + 100 ms; the machine stopped from 100 ms to
        // 18 s, over all but the first 100 ms of every wait.
        let inside = vec![crate::stalls::Stall {
            from_ns: ns(100),
            to_ns: ns(18_000),
        }];
        let v = stalled(inside);
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        assert!(v.figures["p99_ms"].as_f64().unwrap() > 2_000.0);
        assert!(v.figures["p99_ms_without_stalls"].as_f64().unwrap() <= 100.0);
        let after = vec![crate::stalls::Stall {
            from_ns: ns(60_000),
            to_ns: ns(70_000),
        }];
        let v = stalled(after);
        assert_eq!(v.status, Status::Violated, "{v:#?}");
        assert_eq!(
            v.counterexamples[0]["p99_ms"],
            v.counterexamples[0]["p99_ms_without_stalls"]
        );
    }

    #[test]
    fn too_few_orders_or_no_slo_is_not_a_pass() {
        let w = orders(99, |k| 100 + k * 100);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Insufficient, "{v:#?}");
        assert!(v.summary.contains("at least 100 orders"), "{}", v.summary);
        let mut w = orders(120, |_| 100);
        w.scenario.expect.order_e2e_p99 = None;
        assert_eq!(check(&w.input()).status, Status::NotChecked);
        assert_eq!(check(&World::new().input()).status, Status::NotChecked);
    }

    #[test]
    fn unaccepted_and_bad_deliveries_are_not_timed() {
        let mut w = orders(110, |_| 100);
        // An order whose SMS was never accepted: no_loss's business, not timed here.
        w.enqueued("o-lost", 10, true);
        w.expect_in("lost", Sms, "o-lost");
        // An order to a bad address only: nothing to wait for.
        w.enqueued("o-bad", 10, true);
        w.expect_in("bad", Line, "o-bad");
        w.expected.last_mut().unwrap().bad = true;
        // A campaign batch is not an order.
        w.enqueued("campaign", 0, false);
        let v = check(&w.input());
        assert_eq!(v.status, Status::Holds, "{v:#?}");
        assert_eq!(
            (
                &v.figures["orders"],
                &v.figures["judged"],
                &v.figures["unfinished"]
            ),
            (&json!(112), &json!(110), &json!(1))
        );
    }
}
