//! Batches the stack never accepted within the load's retry window leave what the run expects:
//! nothing was promised for them, so `no_loss`, `quiescence` and the rest must not judge their
//! deliveries as lost or open. `responsiveness` judges the batch itself
//! (`enqueue_not_accepted`). Must never drop a batch that any attempt got accepted.

use super::settle::Tracker;
use crate::check::Expected;

/// Removes the deliveries of batches `ids` from `expected`; returns how many it removed.
pub fn forget<'a>(expected: &mut Vec<Expected>, ids: impl IntoIterator<Item = &'a str>) -> usize {
    let ids: std::collections::HashSet<&str> = ids.into_iter().collect();
    if ids.is_empty() {
        return 0;
    }
    let before = expected.len();
    expected.retain(|e| !ids.contains(e.batch_id.as_str()));
    before - expected.len()
}

/// [`forget`] for orders the trickle gave up on while the run waits: the tracker indexes
/// `expected` by position, so it is rebuilt from the whole ledger (rare: only when a stack keeps
/// failing orders for the whole retry window).
pub fn forget_tracked(
    expected: &mut Vec<Expected>,
    ids: &[String],
    tracker: &mut Tracker,
    max_attempts: u32,
    journal: &super::journal::Journal,
) {
    if forget(expected, ids.iter().map(String::as_str)) > 0 {
        *tracker = Tracker::new(expected, max_attempts);
        journal.since(0, |all| tracker.feed(all));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Channel;

    fn expected(batch: &str, recipient: &str) -> Expected {
        Expected {
            recipient: recipient.into(),
            channel: Channel::Line,
            address: format!("U{recipient}").into(),
            bad: false,
            tricky_name: None,
            batch_id: batch.into(),
            template_edited: false,
        }
    }

    #[test]
    fn only_the_named_batches_are_forgotten() {
        let mut e = vec![
            expected("b1", "r1"),
            expected("b2", "r2"),
            expected("b1", "r3"),
        ];
        assert_eq!(forget(&mut e, ["b1"]), 2);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].batch_id, "b2");
        assert_eq!(forget(&mut e, std::iter::empty()), 0);
    }
}
