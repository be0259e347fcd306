//! Same seed, recipients sent in a different order → the same fault for every
//! (recipient, attempt). This is what makes a failing run replayable.

mod smtp_support;

use std::collections::BTreeMap;

use mock_providers::config::{SmtpConfig, SmtpFault, SmtpStage};
use mock_providers::ledger::Outcome;
use mock_providers::units::Ratio;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use smtp_support::*;

type Key = (String, u32);
type Seen = (Outcome, Option<String>, String);

fn profile() -> SmtpConfig {
    let f = |stage, code, rate| SmtpFault {
        stage,
        code,
        enhanced: None,
        rate: Ratio(rate),
    };
    SmtpConfig {
        faults: vec![
            f(SmtpStage::Rcpt, 451, 0.15),
            f(SmtpStage::Rcpt, 552, 0.05),
            f(SmtpStage::Data, 554, 0.1),
            f(SmtpStage::DataEnd, 452, 0.15),
        ],
        bad_addresses: Ratio(0.1),
        drop_mid_data_rate: Ratio(0.1),
        accept_then_drop_rate: Ratio(0.1),
        ..SmtpConfig::default()
    }
}

/// Sends every recipient `rounds` times, one single-recipient message per connection, in an
/// order shuffled by `order_seed`; returns what the ledger says per (recipient, attempt).
async fn run(seed: u64, order_seed: u64, rounds: usize) -> BTreeMap<Key, Seen> {
    let w = spawn(seed, profile()).await;
    let mut order: Vec<String> = (0..40).map(|i| format!("d{i}@x.test")).collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(order_seed);
    for round in 0..rounds {
        order.shuffle(&mut rng);
        for r in &order {
            let mut c = w.client().await;
            let msg = simple_message(&format!("{round}.{r}"), "s", "b");
            c.transaction("shop@x.test", &[r.as_str()], &msg).await;
        }
    }
    w.sends()
        .into_iter()
        .map(|e| ((e.recipient, e.attempt), (e.outcome, e.fault, e.status)))
        .collect()
}

#[tokio::test]
async fn same_seed_same_faults_whatever_the_order() {
    let a = run(42, 1, 3).await;
    let b = run(42, 2, 3).await;
    assert_eq!(a.len(), 120, "one decision per recipient per attempt");
    assert_eq!(a, b);
    // The profile really was exercised, so equality means something.
    let faults: std::collections::BTreeSet<_> = a.values().filter_map(|s| s.1.clone()).collect();
    for want in [
        "rcpt 451",
        "data 554",
        "data_end 452",
        "bad_address",
        "drop_mid_data",
        "accept_then_drop",
    ] {
        assert!(faults.contains(want), "{want} never injected: {faults:?}");
    }
    assert!(a
        .values()
        .any(|s| s.0 == Outcome::Accepted && s.1.is_none()));
    // And the decisions do depend on the seed.
    let c = run(43, 1, 3).await;
    assert_ne!(a, c);
}
