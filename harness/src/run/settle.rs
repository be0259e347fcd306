//! Quiescence: when has every expected delivery reached a final outcome?
//!
//! A delivery is final in the ledger when the provider accepted it, rejected it for good, or saw
//! `max_attempts` transient failures. Where the stack has a status API, a delivery must also be
//! settled there (`delivered`, `permanent_failure`, `failed`, `unknown`, or `submitted` on a channel
//! without delivery reports). A terminal state in the stack counts as final even without a ledger
//! outcome: the stack has stopped working on it, so waiting longer shows nothing new, and the
//! checkers judge what the ledger says happened (e.g. `failed` after one transient error is lost).

use std::collections::{BTreeMap, HashMap, HashSet};

use mock_providers::ledger::{CallbackVariant, EntryKind, Provider};

use super::journal::Brief;
use crate::check::common::{is_failure, is_final};
use crate::check::{Expected, Name, State, StatusDelivery};
use crate::scenario::Channel;

/// What the ledger showed of one delivery, classified as `no_loss` classifies it
/// (`check::common::is_final` / `is_failure`), so the two never disagree on when it ended.
#[derive(Default, Clone, Copy)]
struct Seen {
    ended: bool,
    failures: u32,
}

/// The stack's status view, each batch's rows under its batch id
/// ([`super::status::StatusPoller::by_batch`]).
pub type StatusByBatch = BTreeMap<String, Vec<StatusDelivery>>;

/// How [`Tracker::open`] and the quiescence report name a delivery: `recipient/channel`.
pub fn delivery_name(e: &Expected) -> String {
    format!("{}/{}", e.recipient, e.channel.as_str())
}

/// Folds the ledger incrementally and answers "what is still open?".
pub struct Tracker {
    /// Per provider ([`Provider::index`]), address → the delivery's index, the address shared
    /// with `expected`'s: a word and a `u32` a slot, half of what one table keyed by (provider,
    /// address) took at 300,000 deliveries.
    index: [HashMap<Name, u32>; 3],
    seen: Vec<Seen>,
    next_seq: u64,
    max_attempts: u32,
    /// Delivery-report tries the stack answered (any status below 500): it took them in.
    answered_reports: u64,
}

impl Tracker {
    pub fn new(expected: &[Expected], max_attempts: u32) -> Tracker {
        let mut tracker = Tracker {
            index: Default::default(),
            seen: Vec::with_capacity(expected.len()),
            next_seq: 0,
            max_attempts,
            answered_reports: 0,
        };
        tracker.extend(expected);
        tracker
    }

    /// Adds deliveries appended to `expected` after [`Tracker::new`] (the trickle's orders),
    /// before any of their sends can have been fed.
    pub fn extend(&mut self, more: &[Expected]) {
        for e in more {
            let at = u32::try_from(self.seen.len())
                .expect("validation caps a run at 3,000,000 deliveries");
            self.index[e.channel.provider().index()].insert(e.address.clone(), at);
            self.seen.push(Seen::default());
        }
    }

    /// Folds in new ledger entries (`since` order).
    pub fn feed(&mut self, entries: &[Brief]) {
        for e in entries {
            self.next_seq = self.next_seq.max(e.seq + 1);
            if e.kind == EntryKind::Callback {
                self.answered_reports += u64::from(e.response.is_some_and(|c| c < 500));
            }
            if e.kind != EntryKind::Send {
                continue;
            }
            let Some(&i) = self.index[e.provider.index()].get(e.recipient.as_str()) else {
                continue;
            };
            let s = &mut self.seen[i as usize];
            s.ended |= is_final(e.outcome);
            s.failures += u32::from(is_failure(e.outcome));
        }
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// How many delivery-report tries the stack has answered so far (2xx, or a 4xx such as a
    /// forged report's 403): not shed with a 5xx, not left unanswered. While this grows the stack
    /// is working through the reports, however many are still due.
    pub fn answered_reports(&self) -> u64 {
        self.answered_reports
    }

    fn ledger_final(&self, i: usize) -> bool {
        let s = self.seen[i];
        s.ended || s.failures >= self.max_attempts
    }

    /// Whether the ledger has settled every delivery (whatever the stack's view says).
    pub fn ledger_settled(&self) -> bool {
        (0..self.seen.len()).all(|i| self.ledger_final(i))
    }

    /// Batches with a delivery the ledger has not settled yet.
    pub fn open_batches<'e>(&self, expected: &'e [Expected]) -> Vec<&'e str> {
        let mut out: Vec<&str> = expected
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.ledger_final(*i))
            .map(|(_, e)| e.batch_id.as_str())
            .collect();
        out.dedup();
        out
    }

    /// The batches [`Tracker::open`] has a delivery of.
    pub fn open_in<'e>(
        &self,
        expected: &'e [Expected],
        status: Option<&StatusByBatch>,
        callbacks: &[Channel],
    ) -> HashSet<&'e str> {
        self.open(expected, status, callbacks)
            .into_iter()
            .map(|e| e.batch_id.as_str())
            .collect()
    }

    /// The expected deliveries still open, in order ([`delivery_name`] names them).
    /// `callbacks`: channels whose `submitted` deliveries still wait for a delivery report.
    ///
    /// A delivery's row is looked up among its own batch's rows (the contract's key names the
    /// batch), one batch at a time: the table is a batch's (10,000 rows at most in a shipped
    /// scenario), not the whole view's — 300,000 rows at 100,000 recipients, which made a 17 MB
    /// table several times a second while the run settled.
    pub fn open<'e>(
        &self,
        expected: &'e [Expected],
        status: Option<&StatusByBatch>,
        callbacks: &[Channel],
    ) -> Vec<&'e Expected> {
        let mut open = Vec::new();
        let mut at = 0;
        for batch in expected.chunk_by(|a, b| a.batch_id == b.batch_id) {
            let rows = status.map(|view| by_delivery(view.get(batch[0].batch_id.as_str())));
            for (k, e) in batch.iter().enumerate() {
                if self.is_open(at + k, e, rows.as_ref(), callbacks) {
                    open.push(e);
                }
            }
            at += batch.len();
        }
        open
    }

    /// Whether expected delivery `i`, `e`, is still open; `rows`: its batch's rows by delivery,
    /// none without a status API.
    fn is_open(
        &self,
        i: usize,
        e: &Expected,
        rows: Option<&HashMap<(&str, Channel), &StatusDelivery>>,
        callbacks: &[Channel],
    ) -> bool {
        let row = rows.and_then(|m| m.get(&(e.recipient.as_str(), e.channel)).copied());
        let settled_in_stack = match (rows, row) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(_), Some(d)) => match &d.state {
                s if s.is_settled() => true,
                State::Submitted => !callbacks.contains(&e.channel),
                _ => false,
            },
        };
        // Settled in the stack's own view (`unknown` included): it has stopped working on it.
        let terminal = row.is_some_and(|d| d.state.is_settled());
        !(settled_in_stack && (self.ledger_final(i) || terminal))
    }
}

/// One batch's rows by (recipient, channel); empty when the view has none for it yet.
fn by_delivery(rows: Option<&Vec<StatusDelivery>>) -> HashMap<(&str, Channel), &StatusDelivery> {
    rows.into_iter()
        .flatten()
        .map(|d| ((&*d.recipient, d.channel), d))
        .collect()
}

/// The deliveries (`recipient/channel`, as [`Tracker::open`] names them) that a genuine delivery
/// report was sent for: a genuine `Callback` entry to their address.
pub fn reported(ledger: &[Brief], expected: &[Expected]) -> std::collections::HashSet<String> {
    let to: std::collections::HashSet<(Provider, &str)> = ledger
        .iter()
        .filter(|e| e.kind == EntryKind::Callback && e.variant == Some(CallbackVariant::Genuine))
        .map(|e| (e.provider, e.recipient.as_str()))
        .collect();
    expected
        .iter()
        .filter(|e| to.contains(&(e.channel.provider(), e.address.as_str())))
        .map(delivery_name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Interner;
    use mock_providers::ledger::{LedgerEntry, Outcome};

    fn exp(r: &str) -> Expected {
        Expected {
            recipient: r.into(),
            channel: Channel::Sms,
            address: format!("+1{r}").into(),
            bad: false,
            tricky_name: None,
            batch_id: "b".into(),
            template_edited: false,
        }
    }

    fn send(seq: u64, r: &str, outcome: Outcome) -> Brief {
        let mut e = LedgerEntry::draft(Provider::Sms, EntryKind::Send, format!("+1{r}"));
        e.seq = seq;
        e.outcome = outcome;
        Brief::of(&e, &Interner::default())
    }

    #[test]
    fn report_tries_the_stack_answered_are_counted_and_shed_or_unanswered_ones_are_not() {
        let mut t = Tracker::new(&[], 5);
        let tried = |seq, code| {
            let mut e = LedgerEntry::draft(Provider::Sms, EntryKind::Callback, "+1".to_string());
            e.seq = seq;
            e.callback_response = code;
            Brief::of(&e, &Interner::default())
        };
        t.feed(&[tried(0, Some(200)), tried(1, Some(403))]);
        t.feed(&[tried(2, Some(503)), tried(3, None)]);
        assert_eq!(t.answered_reports(), 2);
        assert_eq!(t.next_seq(), 4);
    }

    fn row(r: &str, state: &str) -> StatusDelivery {
        StatusDelivery::keyed("b", r, Channel::Sms, state.into())
    }

    /// Batch `b`'s rows as the view holds them.
    fn view(rows: [StatusDelivery; 3]) -> StatusByBatch {
        BTreeMap::from([("b".to_string(), rows.to_vec())])
    }

    fn names(open: Vec<&Expected>) -> Vec<String> {
        open.into_iter().map(delivery_name).collect()
    }

    #[test]
    fn what_is_still_open() {
        let expected = [exp("a"), exp("b"), exp("c")];
        let mut t = Tracker::new(&expected, 2);
        // a accepted; b one transient of two allowed; c nothing yet.
        t.feed(&[
            send(0, "a", Outcome::Accepted),
            send(1, "b", Outcome::Transient),
        ]);
        assert_eq!(t.next_seq(), 2);
        // Ledger only (no status API): b and c are open.
        assert_eq!(names(t.open(&expected, None, &[])), ["b/sms", "c/sms"]);
        // The stack gave up on b (`failed`) and holds c as `unknown`: both settled, so the
        // checkers judge them now instead of the run waiting for its deadline.
        let rows = view([
            row("a", "delivered"),
            row("b", "failed"),
            row("c", "unknown"),
        ]);
        assert!(t.open(&expected, Some(&rows), &[]).is_empty());
        // a still `submitted` on a channel with delivery reports due: open; without reports: done.
        let rows = view([
            row("a", "submitted"),
            row("b", "failed"),
            row("c", "unknown"),
        ]);
        assert_eq!(
            names(t.open(&expected, Some(&rows), &[Channel::Sms])),
            ["a/sms"]
        );
        assert!(t.open(&expected, Some(&rows), &[]).is_empty());
        // A row still `sending` in the stack keeps even an accepted delivery open.
        let rows = view([row("a", "sending"), row("b", "failed"), row("c", "unknown")]);
        assert_eq!(names(t.open(&expected, Some(&rows), &[])), ["a/sms"]);
        // A second transient failure exhausts b in the ledger.
        t.feed(&[send(2, "b", Outcome::Transient)]);
        assert_eq!(names(t.open(&expected, None, &[])), ["c/sms"]);
        assert!(!t.ledger_settled());
        // Classified as `no_loss` classifies: protocol errors count towards exhaustion, a
        // recognised repeat of an accepted send ends the delivery.
        t.feed(&[
            send(3, "c", Outcome::ProtocolError),
            send(4, "c", Outcome::ProtocolError),
        ]);
        assert!(t.open(&expected, None, &[]).is_empty());
        assert!(t.ledger_settled(), "the ledger alone has nothing open");
        let mut t = Tracker::new(&expected, 2);
        t.feed(&[
            send(0, "a", Outcome::IdempotentRepeat),
            send(1, "b", Outcome::Permanent),
            send(2, "c", Outcome::Transient),
        ]);
        assert_eq!(names(t.open(&expected, None, &[])), ["c/sms"]);
    }

    /// A delivery's row is its own batch's: a row for its recipient and channel listed under
    /// another batch does not settle it.
    #[test]
    fn a_row_is_looked_up_among_its_deliverys_batch() {
        let mut d = exp("d");
        d.batch_id = "b2".into();
        let expected = [exp("a"), d];
        let mut t = Tracker::new(&expected, 2);
        t.feed(&[
            send(0, "a", Outcome::Accepted),
            send(1, "d", Outcome::Accepted),
        ]);
        let mut rows = BTreeMap::from([(
            "b".to_string(),
            vec![row("a", "delivered"), row("d", "delivered")],
        )]);
        assert_eq!(names(t.open(&expected, Some(&rows), &[])), ["d/sms"]);
        let d_row = StatusDelivery::keyed("b2", "d", Channel::Sms, "delivered".into());
        rows.insert("b2".to_string(), vec![d_row]);
        assert!(t.open(&expected, Some(&rows), &[]).is_empty());
        let open_in = t.open_in(&expected, Some(&BTreeMap::new()), &[]);
        assert_eq!(
            open_in,
            HashSet::from(["b", "b2"]),
            "no rows yet: both open"
        );
    }

    #[test]
    fn reported_names_deliveries_a_genuine_report_was_sent_for() {
        let expected = [exp("a"), exp("b"), exp("c")];
        let cb = |r: &str, v: CallbackVariant| {
            let mut e = LedgerEntry::draft(Provider::Sms, EntryKind::Callback, format!("+1{r}"));
            e.callback_variant = Some(v);
            Brief::of(&e, &Interner::default())
        };
        let ledger = [
            cb("a", CallbackVariant::Genuine),
            cb("b", CallbackVariant::ForgedSignature),
            send(9, "c", Outcome::Accepted),
        ];
        let got = reported(&ledger, &expected);
        assert_eq!(got, ["a/sms".to_string()].into_iter().collect());
    }
}
