//! Polling the stack's optional status API (`GET /v1/batches/{id}/deliveries`) while the run
//! settles, and noticing a batch it loses.
//!
//! Whether the stack has the API is decided once, by its answer for the first batch: 404, 405 or
//! 501 there means it has none (checkers that need it are then "not checked"). After that, a 404
//! for a batch the stack accepted (202/200) is not "no API" but a lost batch: it is recorded
//! (`report.json` `lost_batches`, and a `no_loss` `batch_lost` violation), its rows are dropped
//! from the status view, and polling goes on for the other batches. Must never turn the API off
//! because of one batch. While the run settles a poll asks for the batches quiescence waits on
//! and a few of the others ([`StatusPoller::poll_some`]): a run with the trickle on has hundreds,
//! and asking for each every second would compete with the stack for the CPU it is measured on.
//!
//! A stack whose answer carries a `cursor` is asked incrementally (`?since=<cursor>`): its
//! answer lists the deliveries that changed, merged here by key over the rows already held. Every
//! [`FULL_EVERY`]th request for a batch, and the last poll of the run, ask for the whole list, so
//! an incremental answer that missed a change can delay the view, never decide the verdict.

use std::collections::BTreeMap;

use crate::check::{LostBatch, StatusDelivery};
use crate::load;

/// What the first answer said about the status API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Capability {
    Unknown,
    Present,
    Absent,
}

/// The status view of a run: the latest rows of each batch, and the batches the stack lost.
pub struct StatusPoller {
    capability: Capability,
    rows: BTreeMap<String, Vec<StatusDelivery>>,
    lost: BTreeMap<String, u64>,
    /// Per batch, the cursor of its last answer and the incremental requests made since the last
    /// whole one.
    cursors: BTreeMap<String, (String, u32)>,
    /// Where the next [`StatusPoller::poll_some`] starts among the batches not final yet that
    /// the ledger has settled, and among the others.
    turn: usize,
    turn_rest: usize,
}

/// Batches the ledger has not settled that one [`StatusPoller::poll_some`] asks for at most.
pub const PER_POLL: usize = 20;

/// Batches quiescence waits on that one [`StatusPoller::poll_some`] asks for at most: as many as
/// a trickle's orders settle in ten seconds, so the view keeps up with the ledger.
pub const PER_POLL_WAITING: usize = 200;

/// Of the requests for one batch, every this many asks for the whole list even with a cursor.
pub const FULL_EVERY: u32 = 10;

/// No row of a batch whose rows are all final changes any more.
fn is_final(rows: &[StatusDelivery]) -> bool {
    !rows.is_empty() && rows.iter().all(|d| d.state.is_terminal())
}

impl Default for StatusPoller {
    fn default() -> Self {
        Self::new()
    }
}

impl StatusPoller {
    pub fn new() -> StatusPoller {
        StatusPoller {
            capability: Capability::Unknown,
            rows: BTreeMap::new(),
            lost: BTreeMap::new(),
            cursors: BTreeMap::new(),
            turn: 0,
            turn_rest: 0,
        }
    }

    /// False once the first batch's answer said the stack has no status API.
    pub fn enabled(&self) -> bool {
        self.capability != Capability::Absent
    }

    /// Asks for every batch once, incrementally where the stack offers it unless `whole`;
    /// `now_ns` (ledger clock) stamps a batch first found missing. A transport or server error
    /// leaves the view as it was (the next poll tries again).
    pub async fn poll(
        &mut self,
        client: &reqwest::Client,
        api_base: &str,
        batch_ids: &[String],
        whole: bool,
        now_ns: u64,
    ) -> anyhow::Result<()> {
        for id in batch_ids {
            if !self.enabled() {
                return Ok(());
            }
            let since = self.since(id, whole);
            let page = load::fetch_batch_status(client, api_base, id, since.as_deref()).await?;
            self.record(id, page, since.is_some(), now_ns);
        }
        Ok(())
    }

    /// [`StatusPoller::poll`] for the batches quiescence is waiting on and a few of the others.
    /// `waiting`: batches the ledger has settled whose rows the view still has open — each answer
    /// may be the one that settles the run, so up to [`PER_POLL_WAITING`] of them are asked every
    /// poll; `in_flight`: batches the ledger has not settled, asked [`PER_POLL`] at a time. Both
    /// take turns. A batch that is neither (settled in the ledger and in the view) is left to
    /// [`StatusPoller::poll_due`] and the run's last poll.
    pub async fn poll_some(
        &mut self,
        client: &reqwest::Client,
        api_base: &str,
        batch_ids: &[String],
        (waiting, in_flight): (impl Fn(&str) -> bool, impl Fn(&str) -> bool),
        now_ns: u64,
    ) -> anyhow::Result<()> {
        let due = self.due(batch_ids);
        let first: Vec<&String> = due.iter().copied().filter(|id| waiting(id)).collect();
        let rest: Vec<&String> = due.into_iter().filter(|id| in_flight(id)).collect();
        let mut now = Vec::new();
        for (list, turn, per_poll) in [
            (first, &mut self.turn, PER_POLL_WAITING),
            (rest, &mut self.turn_rest, PER_POLL),
        ] {
            let start = if *turn < list.len() { *turn } else { 0 };
            let take = per_poll.min(list.len());
            now.extend(
                list.iter()
                    .cycle()
                    .skip(start)
                    .take(take)
                    .map(|id| (*id).clone()),
            );
            *turn = start + take;
        }
        self.poll(client, api_base, &now, false, now_ns).await
    }

    /// [`StatusPoller::poll`] for every batch not final yet (nor lost): the confirmation that
    /// the stack's own view agrees with a calm ledger, asked once the calm began.
    pub async fn poll_due(
        &mut self,
        client: &reqwest::Client,
        api_base: &str,
        batch_ids: &[String],
        now_ns: u64,
    ) -> anyhow::Result<()> {
        let due: Vec<String> = self.due(batch_ids).into_iter().cloned().collect();
        self.poll(client, api_base, &due, false, now_ns).await
    }

    /// The batches whose rows may still change: neither lost nor all final.
    fn due<'b>(&self, batch_ids: &'b [String]) -> Vec<&'b String> {
        batch_ids
            .iter()
            .filter(|id| !self.lost.contains_key(*id))
            .filter(|id| !self.rows.get(*id).is_some_and(|r| is_final(r)))
            .collect()
    }

    /// The cursor to ask for `batch_id` with: none for a whole list (asked for, or due).
    fn since(&self, batch_id: &str, whole: bool) -> Option<String> {
        self.cursors
            .get(batch_id)
            .filter(|(_, n)| !whole && n + 1 < FULL_EVERY)
            .map(|(c, _)| c.clone())
    }

    /// Takes one batch's answer: its rows (all of them, or those changed since the cursor when
    /// `incremental`), or `None` for "not found".
    fn record(
        &mut self,
        batch_id: &str,
        page: Option<load::StatusPage>,
        incremental: bool,
        now_ns: u64,
    ) {
        match (page, self.capability) {
            // Decided once: a stack without the API stays without it.
            (_, Capability::Absent) => {}
            (Some(page), _) => {
                self.capability = Capability::Present;
                if self.lost.contains_key(batch_id) {
                    return;
                }
                let rows = match self.rows.remove(batch_id) {
                    Some(held) if incremental => merge(held, page.deliveries),
                    _ => page.deliveries,
                };
                self.rows.insert(batch_id.to_string(), rows);
                match page.cursor {
                    Some(c) => {
                        let n = self.cursors.get(batch_id).map_or(0, |(_, n)| *n);
                        let n = if incremental { n + 1 } else { 0 };
                        self.cursors.insert(batch_id.to_string(), (c, n));
                    }
                    None => {
                        self.cursors.remove(batch_id);
                    }
                }
            }
            (None, Capability::Unknown) => self.capability = Capability::Absent,
            (None, _) => {
                self.lost.entry(batch_id.to_string()).or_insert(now_ns);
                self.rows.remove(batch_id);
            }
        }
    }

    /// Every row of the batches the stack still knows, borrowed (the view is the only copy);
    /// `None` without a status API.
    pub fn rows(&self) -> Option<Vec<&StatusDelivery>> {
        (self.capability == Capability::Present).then(|| self.rows.values().flatten().collect())
    }

    /// Every row of the batches the stack still knows, moved out of the view; `None` without a
    /// status API.
    pub fn into_rows(self) -> Option<Vec<StatusDelivery>> {
        (self.capability == Capability::Present)
            .then(|| self.rows.into_values().flatten().collect())
    }

    /// The accepted batches the status API answered 404 for, with when that was first seen.
    pub fn lost(&self) -> Vec<LostBatch> {
        self.lost
            .iter()
            .map(|(batch_id, at_ns)| LostBatch {
                batch_id: batch_id.clone(),
                first_missing_ns: *at_ns,
            })
            .collect()
    }
}

/// `held` with each row of `changed` in place of the held row with its key (appended if new).
fn merge(mut held: Vec<StatusDelivery>, changed: Vec<StatusDelivery>) -> Vec<StatusDelivery> {
    let at: std::collections::HashMap<String, usize> = held
        .iter()
        .enumerate()
        .map(|(i, r)| (r.key.clone(), i))
        .collect();
    for row in changed {
        match at.get(&row.key) {
            Some(i) => held[*i] = row,
            None => held.push(row),
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, state: &str) -> StatusDelivery {
        serde_json::from_value(serde_json::json!({
            "key": key, "recipient": "r1", "channel": "line", "state": state
        }))
        .unwrap()
    }

    fn rows(n: usize) -> Option<load::StatusPage> {
        Some(load::StatusPage {
            deliveries: vec![row("k", "delivered"); n],
            cursor: None,
        })
    }

    fn page(rows: &[(&str, &str)], cursor: &str) -> Option<load::StatusPage> {
        Some(load::StatusPage {
            deliveries: rows.iter().map(|(k, s)| row(k, s)).collect(),
            cursor: Some(cursor.into()),
        })
    }

    #[test]
    fn incremental_answers_merge_by_key_and_every_tenth_request_is_whole() {
        let mut p = StatusPoller::new();
        p.record(
            "b1",
            page(&[("a", "sending"), ("b", "pending")], "c1"),
            false,
            0,
        );
        assert_eq!(p.since("b1", false).as_deref(), Some("c1"));
        assert_eq!(
            p.since("b1", true),
            None,
            "the last poll asks for everything"
        );
        // Only `a` changed; `c` is new.
        p.record(
            "b1",
            page(&[("a", "delivered"), ("c", "pending")], "c2"),
            true,
            1,
        );
        let states: Vec<(String, String)> = p
            .rows()
            .unwrap()
            .into_iter()
            .map(|r| (r.key.clone(), r.state.to_string()))
            .collect();
        assert_eq!(
            states,
            [("a", "delivered"), ("b", "pending"), ("c", "pending")]
                .map(|(k, s)| (k.to_string(), s.to_string()))
        );
        assert_eq!(p.since("b1", false).as_deref(), Some("c2"));
        // After FULL_EVERY - 1 incremental requests, the next one is whole.
        for n in 2..FULL_EVERY {
            p.record("b1", page(&[], &format!("c{}", n + 1)), true, n as u64);
        }
        assert_eq!(p.since("b1", false), None);
        // A whole answer replaces the rows and starts counting again.
        p.record("b1", page(&[("a", "delivered")], "z"), false, 99);
        assert_eq!(p.rows().unwrap().len(), 1);
        assert_eq!(p.since("b1", false).as_deref(), Some("z"));
        // A stack that stops sending a cursor is asked for everything.
        p.record("b1", rows(1), false, 100);
        assert_eq!(p.since("b1", false), None);
    }

    /// (answers for batches in order: rows or 404, API on at the end, rows kept, lost batches)
    type Case = (
        &'static [(&'static str, Option<usize>)],
        bool,
        usize,
        &'static [&'static str],
    );

    #[test]
    fn the_first_answer_decides_the_capability_and_a_later_404_is_a_lost_batch() {
        let cases: [Case; 4] = [
            (&[("b1", None), ("b2", Some(3))], false, 0, &[]),
            (&[("b1", Some(2)), ("b2", Some(3))], true, 5, &[]),
            (&[("b1", Some(2)), ("b2", None)], true, 2, &["b2"]),
            // Found again later: still lost (the stack answered 404 for a batch it accepted).
            (
                &[("b1", Some(2)), ("b2", None), ("b2", Some(3))],
                true,
                2,
                &["b2"],
            ),
        ];
        for (i, (answers, on, kept, lost)) in cases.into_iter().enumerate() {
            let mut p = StatusPoller::new();
            for (at, (id, page)) in answers.iter().enumerate() {
                p.record(id, page.and_then(rows), false, at as u64);
            }
            assert_eq!(p.enabled(), on, "case {i}");
            assert_eq!(p.rows().map_or(0, |r| r.len()), kept, "case {i}");
            let got: Vec<String> = p.lost().into_iter().map(|l| l.batch_id).collect();
            assert_eq!(got, lost, "case {i}");
        }
    }
}
