//! Same seed, messages sent in a different order over concurrent connections → the same fault
//! for every (recipient, attempt), and the same fault for the n-th MAIL and the n-th connection.
//! This is what makes a failing run replayable.
//!
//! What is compared, and why it can be (see `mock_providers::smtp::plan`):
//! - per (recipient, attempt): RCPT decisions are the recipient's own; DATA and end-of-DATA
//!   decisions are the transaction's, keyed on its recipient set. The test keeps each batch
//!   the same in both runs (the grouping of recipients into messages is fixed per round, only
//!   the order and interleaving change), and each recipient's k-th RCPT happens in round k;
//! - per n, the n-th MAIL's fault (one sender, so all lanes contend for the same counter) and the
//!   n-th connection's greeting fault: *which* message meets them is arrival order, by nature,
//!   but the sequence is fixed, and since the client retries until MAIL and the greeting pass,
//!   the number of MAILs and connections is too.

mod smtp_support;

use std::collections::{BTreeMap, BTreeSet};

use mock_providers::config::{SmtpConfig, SmtpFault, SmtpStage};
use mock_providers::ledger::{Outcome, Provider};
use mock_providers::units::Ratio;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use smtp_support::*;

/// What a recipient's attempt, or the n-th MAIL / connection, met.
type Seen = (Outcome, Option<String>, String);

#[derive(Debug, PartialEq, Eq)]
struct Outcomes {
    recipients: BTreeMap<(String, u32), Seen>,
    /// ("greeting" | "mail", n) → what the n-th connection / MAIL met, faulted ones only.
    ordinals: BTreeMap<(String, u32), Seen>,
}

fn profile() -> SmtpConfig {
    let f = |stage, code, rate| SmtpFault {
        stage,
        code,
        enhanced: None,
        rate: Ratio(rate),
    };
    SmtpConfig {
        faults: vec![
            f(SmtpStage::Greeting, 421, 0.08),
            f(SmtpStage::Greeting, 554, 0.05),
            f(SmtpStage::Mail, 451, 0.1),
            f(SmtpStage::Mail, 550, 0.05),
            f(SmtpStage::Rcpt, 451, 0.1),
            f(SmtpStage::Rcpt, 552, 0.05),
            f(SmtpStage::Data, 554, 0.1),
            f(SmtpStage::DataEnd, 452, 0.12),
        ],
        bad_addresses: Ratio(0.08),
        drop_mid_data_rate: Ratio(0.1),
        accept_then_drop_rate: Ratio(0.1),
        ..SmtpConfig::default()
    }
}

const RECIPIENTS: usize = 36;
const ROUNDS: usize = 3;
const LANES: usize = 4;

/// Round `round`'s messages: the recipients in groups of 1, 2 or 3 (sizes cycling, rotated per
/// round). The same in every run: only the sending order changes.
fn batches(round: usize) -> Vec<Vec<String>> {
    let all: Vec<String> = (0..RECIPIENTS).map(|i| format!("d{i}@x.test")).collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut size = 1 + round % 3;
    while i < all.len() {
        let end = (i + size).min(all.len());
        out.push(all[i..end].to_vec());
        i = end;
        size = size % 3 + 1;
    }
    out
}

/// Sends one message to `rcpts`, reconnecting after a refused greeting and repeating MAIL until
/// it is accepted, so every recipient gets exactly one RCPT.
async fn send(w: &World, id: &str, rcpts: &[String]) {
    let mut c = loop {
        let mut c = w.client().await;
        if c.greeting.starts_with("220") {
            break c;
        }
        if c.greeting.starts_with("554") {
            assert!(c.cmd("QUIT").await.starts_with("221"));
        }
        c.until_closed().await;
    };
    assert!(c.cmd("EHLO client.test").await.starts_with("250"));
    while !c.cmd("MAIL FROM:<shop@x.test>").await.starts_with("250") {}
    for r in rcpts {
        c.cmd(&format!("RCPT TO:<{r}>")).await;
    }
    let data = c.cmd("DATA").await;
    if data.starts_with("354") {
        c.send(stuff(&simple_message(id, "s", "b"))).await;
        if c.try_reply().await.is_none() {
            return; // dropped mid-DATA or accept-then-drop
        }
    }
    c.cmd("QUIT").await;
}

/// Sends every round's batches in an order shuffled by `order_seed`, over LANES concurrent
/// lanes (one connection per message); rounds follow each other.
async fn run(seed: u64, order_seed: u64) -> Outcomes {
    let w = spawn(seed, profile()).await;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(order_seed);
    for round in 0..ROUNDS {
        let mut msgs: Vec<(String, Vec<String>)> = batches(round)
            .into_iter()
            .enumerate()
            .map(|(i, b)| (format!("{round}.{i}@shop.test"), b))
            .collect();
        msgs.shuffle(&mut rng);
        let w = &w;
        let lanes = (0..LANES).map(|l| {
            let mine: Vec<_> = msgs.iter().skip(l).step_by(LANES).cloned().collect();
            async move {
                for (id, rcpts) in mine {
                    send(w, &id, &rcpts).await;
                }
            }
        });
        futures::future::join_all(lanes).await;
    }
    let mut out = Outcomes {
        recipients: BTreeMap::new(),
        ordinals: BTreeMap::new(),
    };
    for e in w.sends() {
        assert_eq!(e.provider, Provider::Smtp);
        let seen = (e.outcome, e.fault.clone(), e.status.clone());
        if e.recipient.is_empty() {
            let stage = e.fault.as_deref().unwrap_or("").split(' ').next().unwrap();
            assert!(["greeting", "mail"].contains(&stage), "{e:?}");
            let prev = out.ordinals.insert((stage.to_string(), e.attempt), seen);
            assert!(prev.is_none(), "one entry per ordinal");
        } else {
            let prev = out
                .recipients
                .insert((e.recipient.clone(), e.attempt), seen);
            assert!(prev.is_none(), "one entry per recipient attempt: {e:?}");
        }
    }
    w.shutdown().await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_seed_same_faults_whatever_the_order_and_interleaving() {
    let a = run(42, 1).await;
    let b = run(42, 2).await;
    assert_eq!(
        a.recipients.len(),
        RECIPIENTS * ROUNDS,
        "one decision per recipient per attempt"
    );
    assert_eq!(a.recipients, b.recipients);
    assert_eq!(a.ordinals, b.ordinals);
    // The profile really was exercised, so equality means something.
    let faults: BTreeSet<&str> = a
        .recipients
        .values()
        .chain(a.ordinals.values())
        .filter_map(|s| s.1.as_deref())
        .collect();
    for want in [
        "greeting 421",
        "greeting 554",
        "mail 451",
        "mail 550",
        "rcpt 451",
        "rcpt 552",
        "bad_address",
        "data 554",
        "data_end 452",
        "drop_mid_data",
        "accept_then_drop",
    ] {
        assert!(faults.contains(want), "{want} never injected: {faults:?}");
    }
    assert!(a
        .recipients
        .values()
        .any(|s| s.0 == Outcome::Accepted && s.1.is_none()));
    // A multi-recipient transaction's recipients that passed RCPT share one fate after it.
    let mut shared = 0;
    for batch in batches(0).iter().filter(|b| b.len() > 1) {
        let fates: Vec<(Option<&str>, &str)> = batch
            .iter()
            .map(|r| &a.recipients[&(r.clone(), 1)])
            .filter(|s| {
                let f = s.1.as_deref().unwrap_or("");
                !f.starts_with("rcpt") && f != "bad_address"
            })
            .map(|s| (s.1.as_deref(), s.2.as_str()))
            .collect();
        assert!(
            fates.windows(2).all(|p| p[0] == p[1]),
            "{batch:?}: {fates:?}"
        );
        shared += usize::from(fates.len() > 1);
    }
    assert!(shared > 3, "multi-recipient transactions were exercised");
    // And the decisions do depend on the seed.
    let c = run(43, 1).await;
    assert_ne!(a.recipients, c.recipients);
}
