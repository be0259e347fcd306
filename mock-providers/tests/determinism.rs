//! Same seed, different request order → the same faults for every (recipient, attempt).

mod common;

use std::collections::BTreeMap;

use common::*;
use mock_providers::config::{HttpFault, ProvidersConfig};
use mock_providers::ledger::{EntryKind, Provider};
use mock_providers::units::Ratio;
use rand::seq::SliceRandom;
use rand::SeedableRng;

fn profile() -> ProvidersConfig {
    let mut c = ProvidersConfig::default();
    c.line.bad_addresses = Ratio(0.1);
    c.line.permanent = vec![fault(403, 0.05)];
    c.line.transient = vec![
        fault(503, 0.2),
        HttpFault {
            after_commit: true,
            ..fault(500, 0.1)
        },
    ];
    c.line.latency = mock_providers::config::Latency::Uniform {
        min: ms(0),
        max: ms(3),
    };
    c.sms.bad_addresses = Ratio(0.1);
    c.sms.permanent = vec![HttpFault {
        code: Some(21610),
        ..fault(400, 0.05)
    }];
    c.sms.transient = vec![fault(500, 0.2), fault(429, 0.1)];
    c
}

type Outcomes = BTreeMap<(Provider, String, u32), (String, Option<String>)>;

const RECIPIENTS: u32 = 30;
const ATTEMPTS: u32 = 4;

/// Sends ATTEMPTS to each recipient on both providers, in an order given by `shuffle_seed`
/// (None: recipient by recipient), and returns what the ledger says per (recipient, attempt).
async fn run(seed: u64, shuffle_seed: Option<u64>) -> Outcomes {
    let w = world(seed, profile()).await;
    // A task list where each recipient's k-th send comes after its (k-1)-th.
    let mut order: Vec<u32> = (0..RECIPIENTS)
        .flat_map(|r| std::iter::repeat_n(r, ATTEMPTS as usize))
        .collect();
    if let Some(s) = shuffle_seed {
        order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(s));
        // Interleave further: run the shuffled list as 4 concurrent lanes by recipient.
        let lanes: Vec<Vec<u32>> = (0..4)
            .map(|l| order.iter().copied().filter(|r| r % 4 == l).collect())
            .collect();
        let w = &w;
        futures::future::join_all(lanes.into_iter().map(|lane| async move {
            for r in lane {
                w.line_push(&uid(r), None, "x").await;
                w.sms_send(&phone(r), "x", None).await;
            }
        }))
        .await;
    } else {
        for r in order {
            w.line_push(&uid(r), None, "x").await;
            w.sms_send(&phone(r), "x", None).await;
        }
    }
    let out = w
        .entries()
        .into_iter()
        .filter(|e| e.kind == EntryKind::Send)
        .map(|e| ((e.provider, e.recipient, e.attempt), (e.status, e.fault)))
        .collect();
    w.p.shutdown().await;
    out
}

#[tokio::test]
async fn same_seed_same_faults_whatever_the_order() {
    let a = run(42, None).await;
    let b = run(42, Some(7)).await;
    assert_eq!(a.len(), (RECIPIENTS * ATTEMPTS * 2) as usize);
    assert_eq!(a, b);
    let faulted = a.values().filter(|(_, f)| f.is_some()).count();
    assert!(
        faulted > 20 && faulted < a.len() - 20,
        "profile injects a mix: {faulted}"
    );
    let other = run(43, Some(7)).await;
    assert_ne!(a, other, "a different seed injects different faults");
}
