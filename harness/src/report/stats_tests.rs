//! Tests of the report's figures (`stats.rs`), kept apart so the code reads in one sitting.

use super::*;
use mock_providers::ledger::LedgerEntry;

pub(crate) fn entry(seq: u64, p: Provider, to: &str, outcome: Outcome, ms: u64) -> Entry {
    let mut e = LedgerEntry::draft(p, EntryKind::Send, to);
    e.seq = seq;
    e.mono_ns = ms * 1_000_000;
    e.outcome = outcome;
    Entry::alone(&e)
}

fn expected(
    recipient: &str,
    channel: crate::scenario::Channel,
    batch: &str,
) -> crate::check::Expected {
    crate::check::Expected {
        recipient: recipient.into(),
        channel,
        address: format!("{recipient}@{}", channel.as_str()).into(),
        bad: false,
        tricky_name: None,
        batch_id: batch.into(),
        template_edited: false,
    }
}

#[test]
fn end_to_end_latency_runs_from_each_deliverys_own_batch() {
    use crate::scenario::Channel;
    use Outcome::*;
    // Batch b1 posted at 1 s, batch b2 at 60 s (a paced load): each delivery is accepted
    // 200 ms after its own batch was posted, so every end-to-end latency is 200 ms — not
    // 59.2 s for b2's, which is what timing from the start of the load would say.
    let exp = [
        expected("r1", Channel::Line, "b1"),
        expected("r2", Channel::Sms, "b2"),
        expected("r3", Channel::Line, "b2"),
    ];
    let batches = [
        BatchEnqueue {
            batch_id: "b1".into(),
            sent_ns: 1_000_000_000,
            acked_ns: 1_050_000_000,
            trickle: false,
            latency_us: 50_000,
        },
        BatchEnqueue {
            batch_id: "b2".into(),
            sent_ns: 60_000_000_000,
            acked_ns: 60_040_000_000,
            trickle: false,
            latency_us: 40_000,
        },
    ];
    let ledger = [
        entry(0, Provider::Line, "r1@line", Transient, 1_100),
        entry(1, Provider::Line, "r1@line", Accepted, 1_200),
        entry(2, Provider::Sms, "r2@sms", Accepted, 60_200),
        entry(3, Provider::Line, "r3@line", Accepted, 60_200),
        // A duplicate much later does not move the first acceptance.
        entry(4, Provider::Line, "r3@line", Accepted, 90_000),
        // Not in any batch: left out.
        entry(5, Provider::Line, "stranger", Accepted, 5_000),
    ];
    let times = enqueue_times(&exp, &batches);
    assert_eq!(times.len(), 3);
    let mut hist = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    hist.record(50_000).unwrap();
    hist.record(40_000).unwrap();
    let l = latency(&ledger, &hist, &times);
    assert_eq!(l.e2e_from, "batch_post");
    assert_eq!(l.e2e.count, 3);
    assert_eq!((l.e2e.p50, l.e2e.p99, l.e2e.max), (200.0, 200.0, 200.0));
    assert_eq!(l.e2e_by_channel["line"].count, 2);
    assert_eq!(l.e2e_by_channel["sms"].p99, 200.0);
    assert_eq!(l.e2e_histogram.iter().map(|b| b.count).sum::<u64>(), 3);
    // Two enqueue requests (40 ms and 50 ms) in the enqueue histogram.
    assert_eq!(l.enqueue_histogram.iter().map(|b| b.count).sum::<u64>(), 2);
    let last = l.enqueue_histogram.last().unwrap();
    assert!(last.from_ms <= 50.0 && 50.0 < last.to_ms, "{last:?}");
}

#[test]
fn histogram_buckets_cover_every_value() {
    let b = histogram(&[(0.0, 1), (12.0, 2), (99.9, 1), (100.0, 1)]);
    // 100 ms / 25 bars = 4 ms, rounded up to the 1-2-5 width 5 ms: 21 buckets up to 105 ms.
    assert_eq!(b.len(), 21, "{b:?}");
    assert_eq!((b[0].from_ms, b[0].to_ms), (0.0, 5.0));
    assert_eq!(b.iter().map(|x| x.count).sum::<u64>(), 5);
    assert_eq!(b[2].count, 2, "12 ms is in [10, 15)");
    assert_eq!((b[19].count, b[20].count), (1, 1));
    assert!(histogram(&[]).is_empty());
}

#[test]
fn uncertain_sends_are_counted_by_how_they_were_settled() {
    use crate::check::{Status, Verdict};
    use Outcome::*;
    let poll = |seq: u64, to: &str, sid: Option<&str>| {
        let mut e = LedgerEntry::draft(Provider::Sms, EntryKind::Poll, to);
        e.seq = seq;
        e.status = "200".into();
        e.message_id = sid.map(String::from);
        Entry::alone(&e)
    };
    let ledger = [
        // LINE: accepted, the sender died, the resend got 409 (twice: one delivery).
        entry(0, Provider::Line, "U1", Accepted, 10),
        entry(1, Provider::Line, "U1", IdempotentRepeat, 2_000),
        entry(2, Provider::Line, "U1", IdempotentRepeat, 2_500),
        entry(3, Provider::Line, "U2", Accepted, 10),
        // SMS +1: accepted, then a listing found it; no create after: adopted.
        entry(4, Provider::Sms, "+1", Accepted, 10),
        poll(5, "+1", None),
        // SMS +2: a listing before anything was accepted, then a create: not adopted.
        poll(6, "+2", None),
        entry(7, Provider::Sms, "+2", Accepted, 20),
        // SMS +3: accepted, listed, and sent again anyway: not adopted (a duplicate).
        entry(8, Provider::Sms, "+3", Accepted, 10),
        poll(9, "+3", None),
        entry(10, Provider::Sms, "+3", Accepted, 30),
        // SMS +4: a fetch by sid is not a listing.
        entry(11, Provider::Sms, "+4", Accepted, 10),
        poll(12, "+4", Some("SM1")),
    ];
    let no_loss = Verdict {
        checker: "no_loss".into(),
        status: Status::Holds,
        summary: String::new(),
        counterexamples: Vec::new(),
        total_counterexamples: 0,
        figures: serde_json::json!({
            "by_channel": {"email": {"unknown": 1, "delivered": 9}},
            "unknown_resolved_by_channel": {"email": {"unknown_resolved": 3}, "line": {"unknown_resolved": 0}},
        })
        .as_object()
        .unwrap()
        .clone(),
        judged: Default::default(),
        main_rule: None,
        violations_by_rule: Default::default(),
    };
    let u = uncertain(&ledger, &[no_loss]);
    assert_eq!(
        u,
        Uncertain {
            line_retry_key: 1,
            sms_adopted_by_listing: 1,
            email_unknown_resolved: 3,
            email_unknown_held: 1,
        }
    );
    assert!(u
        .line()
        .starts_with("LINE 1 settled by retry key (409) · SMS 1 adopted"));
    assert!(uncertain(&[], &[]).is_empty());
}

#[test]
fn percentile_is_nearest_rank() {
    let v: Vec<f64> = (1..=100).map(f64::from).collect();
    for (q, want) in [(0.0, 1.0), (0.5, 50.0), (0.99, 99.0), (1.0, 100.0)] {
        assert_eq!(percentile(&v, q), want, "q={q}");
    }
    assert_eq!(percentile(&[], 0.5), 0.0);
}

#[test]
fn counts_attempts_and_pids() {
    use Outcome::*;
    let ledger = [
        entry(0, Provider::Line, "a", Transient, 10),
        entry(1, Provider::Line, "a", Accepted, 20),
        entry(2, Provider::Sms, "a", Accepted, 30),
        entry(3, Provider::Sms, "a", IdempotentRepeat, 1500),
    ];
    let got = attempts_per_delivery(&ledger);
    assert_eq!(got.into_iter().collect::<Vec<_>>(), [(2, 2)]);
    let pids = crate::check::Pids::from([(0, 7), (1, 8), (2, 8)]);
    let by = sends_by_pid(&ledger, &pids);
    assert_eq!(by.into_iter().collect::<Vec<_>>(), [(7, 1), (8, 2)]);
    assert_eq!(sends_unattributed(&ledger, &pids), 1, "seq 3 has no sender");
    let ps = per_second(&ledger);
    assert_eq!(ps.seconds, 2);
    assert_eq!(ps.accepted["line"], [1, 0]);
    assert_eq!(ps.accepted["sms"], [1, 0]);
}
