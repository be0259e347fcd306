//! Polling the stack's optional status API (`GET /v1/batches/{id}/deliveries`) while the run
//! settles, and noticing a batch it loses.
//!
//! Whether the stack has the API is decided once, by its answer for the first batch enqueued
//! (asked before any other while undecided, whichever batches a poll is for): 404, 405 or
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
//!
//! The view keeps what the checkers read: no transition's detail and no payload digest. The
//! run's last poll ([`StatusPoller::poll_last`]) writes each answer whole to `status.json` before
//! they are dropped ([`StatusFile`]).
//!
//! A 2xx answer that is not the contract's (not JSON, not its shape, longer than
//! [`answer_cap`]) says the stack has a status API and it is broken: it is kept as a
//! counterexample ([`StatusAnswers`], `agreement`'s `status_unreadable`) and the batch's rows
//! stay as they were. A request that got no answer to use (a timeout, a reset, a 5xx) is tried
//! again at the next poll; one that timed out ends the round, so an API that hangs costs one
//! timeout per poll, not one per batch.

use std::collections::BTreeMap;

use super::status_file::{Row, StatusFile};
use crate::check::{
    Interner, LostBatch, StatusAnswers, StatusDelivery, StatusRowWire, UnreadableStatus,
};
use crate::load::{self, StatusAnswer};

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
    /// The first batch enqueued: its answer decides [`Capability`].
    probe: Option<String>,
    rows: BTreeMap<String, Vec<StatusDelivery>>,
    lost: BTreeMap<String, u64>,
    /// Per batch, the cursor of its last answer and the incremental requests made since the last
    /// whole one.
    cursors: BTreeMap<String, (String, u32)>,
    /// Where the next [`StatusPoller::poll_some`] starts among the batches not final yet that
    /// the ledger has settled, and among the others.
    turn: usize,
    turn_rest: usize,
    /// The most bytes an answer may have ([`answer_cap`]).
    cap: usize,
    answers: StatusAnswers,
    /// The copies of recipient ids, addresses and message ids the expected deliveries and the
    /// ledger hold, shared by the rows.
    names: Interner,
    /// Set for the run's last poll ([`StatusPoller::poll_last`]): each answer is written to it
    /// whole before the view drops what it does not keep.
    file: Option<StatusFile>,
}

/// The most bytes a status answer may take for a run of `deliveries` expected deliveries: 16 KiB
/// a row (a delivery with its whole history is well under 2 KiB) over all of them, plus 8 MiB, so
/// that an answer that never ends cannot fill the harness's memory.
pub fn answer_cap(deliveries: usize) -> usize {
    (8usize << 20).saturating_add(deliveries.saturating_mul(16 << 10))
}

/// Batches the ledger has not settled that one [`StatusPoller::poll_some`] asks for at most.
pub const PER_POLL: usize = 20;

/// Batches quiescence waits on that one [`StatusPoller::poll_some`] asks for at most: as many as
/// a trickle's orders settle in ten seconds, so the view keeps up with the ledger.
pub const PER_POLL_WAITING: usize = 200;

/// Batches with at most this many rows held are small: their answers are asked several at once.
pub const SMALL_BATCH: usize = 100;

/// Small batches asked at once at most.
pub const AT_ONCE: usize = 8;

/// Of the requests for one batch, every this many asks for the whole list even with a cursor.
pub const FULL_EVERY: u32 = 10;

/// No row of a batch whose rows are all final changes any more.
fn is_final(rows: &[StatusDelivery]) -> bool {
    !rows.is_empty() && rows.iter().all(|d| d.state.is_terminal())
}

impl StatusPoller {
    /// A poller for a run of `deliveries` expected deliveries (which bounds an answer's size),
    /// its rows' strings shared through `names` (the run's, which holds the expected
    /// deliveries' ids and addresses and the ledger's message ids).
    pub fn new(deliveries: usize, names: Interner) -> StatusPoller {
        StatusPoller {
            capability: Capability::Unknown,
            probe: None,
            rows: BTreeMap::new(),
            lost: BTreeMap::new(),
            cursors: BTreeMap::new(),
            turn: 0,
            turn_rest: 0,
            cap: answer_cap(deliveries),
            answers: StatusAnswers::default(),
            names,
            file: None,
        }
    }

    /// False once the first batch's answer said the stack has no status API.
    pub fn enabled(&self) -> bool {
        self.capability != Capability::Absent
    }

    /// Asks for every batch once, incrementally where the stack offers it unless `whole`;
    /// `now_ns` (ledger clock) stamps a batch first found missing. A request with no answer to
    /// use leaves that batch's view as it was (the next poll tries again) and the others are
    /// still asked, unless it timed out: then the round ends there. `Err`: the last such failure.
    ///
    /// Batches known to be small ([`SMALL_BATCH`] rows or fewer) are asked [`AT_ONCE`] at a time
    /// (a trickle's orders are hundreds of one-recipient batches, and their round trips, not the
    /// stack's work, are what a sequential round waits on), each read up to its share of the
    /// cap; any other batch alone, so that at most one big answer is in memory at a time.
    /// Answers are taken in `batch_ids` order.
    pub async fn poll(
        &mut self,
        client: &reqwest::Client,
        api_base: &str,
        batch_ids: &[String],
        whole: bool,
        now_ns: u64,
    ) -> anyhow::Result<()> {
        let mut failed = None;
        let mut rest = batch_ids;
        while !rest.is_empty() && self.enabled() {
            let group = self.next_group(rest);
            rest = &rest[group.len()..];
            let asks: Vec<(&String, Option<String>)> =
                group.iter().map(|id| (id, self.since(id, whole))).collect();
            self.answers.requests += asks.len() as u64;
            // Asked together, they share the cap one answer had alone: an API whose answers
            // never end holds no more of the harness's memory than when it was asked in turn.
            let cap = self.cap / asks.len();
            let fetched = futures::future::join_all(asks.iter().map(|(id, since)| {
                let rows = self.reader(id);
                load::fetch_batch_status(client, api_base, id, since.as_deref(), cap, rows)
            }))
            .await;
            let mut timed_out = false;
            for ((id, since), fetched) in asks.iter().zip(fetched) {
                match fetched {
                    Ok(answer) => self.record(id, answer, since.is_some(), now_ns),
                    Err(e) => {
                        self.answers.last_failure = Some(format!("{e:#}"));
                        timed_out |= e
                            .downcast_ref::<reqwest::Error>()
                            .is_some_and(reqwest::Error::is_timeout);
                        failed = Some(e);
                    }
                }
            }
            if self.file.is_some() && group.iter().any(|id| !self.is_small(id)) {
                // The run's last poll reads every batch whole, back to back: a big answer's
                // parsing (tens of megabytes) goes back before the next is read.
                crate::malloc::trim();
            }
            if timed_out {
                break;
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// The next batches of `rest` to ask together: up to [`AT_ONCE`] small ones in a row, or the
    /// first alone when it is not known to be small or while the first answer has not decided
    /// whether the stack has a status API.
    fn next_group<'b>(&self, rest: &'b [String]) -> &'b [String] {
        if self.capability == Capability::Unknown {
            return &rest[..1];
        }
        let n = rest
            .iter()
            .take(AT_ONCE)
            .take_while(|id| self.is_small(id))
            .count();
        &rest[..n.max(1)]
    }

    /// Whether `batch_id` is known to be small: held with [`SMALL_BATCH`] rows or fewer.
    fn is_small(&self, batch_id: &str) -> bool {
        self.rows
            .get(batch_id)
            .is_some_and(|r| r.len() <= SMALL_BATCH)
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
        let now = self.probe_first(batch_ids, now);
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
        let due = self.probe_first(batch_ids, due);
        self.poll(client, api_base, &due, false, now_ns).await
    }

    /// `asking`, led by the first batch of `batch_ids` (all accepted, in enqueue order) while the
    /// capability is undecided: a 404 for a later batch, which the stack may have lost, must not
    /// be taken for "no status API".
    fn probe_first(&mut self, batch_ids: &[String], mut asking: Vec<String>) -> Vec<String> {
        if self.capability != Capability::Unknown {
            return asking;
        }
        let Some(first) = batch_ids.first() else {
            return asking;
        };
        self.probe.get_or_insert_with(|| first.clone());
        asking.retain(|id| id != first);
        asking.insert(0, first.clone());
        asking
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

    /// What an answer for `batch_id` keeps of each row as it is parsed ([`Parsed`]): the view's
    /// row, its strings the copies the expected deliveries and the ledger hold (never adding
    /// one: a stack could make them unique on every answer), and during the run's last poll the
    /// row's JSON for `status.json`.
    fn reader(&self, batch_id: &str) -> impl FnMut(StatusRowWire) -> Parsed + Send + 'static {
        let batch = self.names.name(batch_id);
        let names = self.names.clone();
        let json = self.file.is_some();
        move |wire| {
            let json = json
                .then(|| serde_json::to_string(&wire).ok())
                .flatten()
                .map(Into::into);
            let mut row = StatusDelivery::of(wire, &batch);
            share(&mut row, &names);
            Parsed { row, json }
        }
    }

    /// [`StatusPoller::record`] for an answer of wire rows, read as a fetch reads them.
    #[cfg(test)]
    fn record_wire(&mut self, batch: &str, answer: StatusAnswer, incremental: bool, now_ns: u64) {
        let answer = answer.map_rows(self.reader(batch));
        self.record(batch, answer, incremental, now_ns);
    }

    /// Takes one batch's answer: its rows (all of them, or those changed since the cursor when
    /// `incremental`), "not found", or an answer that is not the contract's.
    fn record(&mut self, batch_id: &str, answer: Answer, incremental: bool, now_ns: u64) {
        if !matches!(answer, StatusAnswer::Unreadable { .. }) {
            self.answers.readable += 1;
        }
        match (answer, self.capability) {
            // Decided once: a stack without the API stays without it.
            (_, Capability::Absent) => {}
            // A 2xx: the stack has the API, and this answer breaks it.
            (
                StatusAnswer::Unreadable {
                    http_status,
                    error,
                    body_head,
                },
                _,
            ) => {
                self.capability = Capability::Present;
                self.answers.unreadable += 1;
                if self.answers.examples.len() < StatusAnswers::KEPT {
                    self.answers.examples.push(UnreadableStatus {
                        batch_id: batch_id.to_string(),
                        at_ns: now_ns,
                        http_status,
                        error,
                        body_head,
                    });
                }
            }
            (StatusAnswer::Page(page), _) => {
                self.capability = Capability::Present;
                if self.lost.contains_key(batch_id) {
                    return;
                }
                if let Some(file) = &mut self.file {
                    file.write(batch_id, page.deliveries.iter().map(Parsed::file_row));
                }
                let fresh = page.deliveries.into_iter().map(|p| p.row).collect();
                let mut rows = match self.rows.remove(batch_id) {
                    Some(held) if incremental => merge(held, fresh),
                    Some(held) => keep_unchanged(held, fresh),
                    None => fresh,
                };
                rows.shrink_to_fit();
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
            (StatusAnswer::NotFound, Capability::Unknown)
                if self.probe.as_deref().is_none_or(|p| p == batch_id) =>
            {
                self.capability = Capability::Absent
            }
            (StatusAnswer::NotFound, _) => {
                self.lost.entry(batch_id.to_string()).or_insert(now_ns);
                self.rows.remove(batch_id);
            }
        }
    }

    /// The run's last poll: [`StatusPoller::poll`] of every batch for its whole list, each
    /// answer written to `file` whole, then the batches it got no answer for as the view holds
    /// them ([`StatusFile`]). The file comes back when the stack has a status API, with the last
    /// failure of the poll.
    pub async fn poll_last(
        &mut self,
        client: &reqwest::Client,
        api_base: &str,
        batch_ids: &[String],
        now_ns: u64,
        file: StatusFile,
    ) -> (Option<StatusFile>, anyhow::Result<()>) {
        self.file = Some(file);
        let polled = self.poll(client, api_base, batch_ids, true, now_ns).await;
        (self.finish_file(), polled)
    }

    /// Writes the batches the last poll got no answer for as the view holds them, and hands
    /// the file back when the stack has a status API.
    fn finish_file(&mut self) -> Option<StatusFile> {
        let mut file = self.file.take()?;
        for (batch_id, rows) in &self.rows {
            if !file.has(batch_id) {
                file.write(batch_id, rows.iter().map(Row::Held));
            }
        }
        (self.capability == Capability::Present).then_some(file)
    }

    /// Every row of the batches the stack still knows, borrowed, in one list (for tests; the
    /// run reads the view batch by batch, [`StatusPoller::by_batch`]); `None` without a status
    /// API.
    #[cfg(test)]
    pub fn rows(&self) -> Option<Vec<&StatusDelivery>> {
        (self.capability == Capability::Present).then(|| self.rows.values().flatten().collect())
    }

    /// The view batch by batch, borrowed; `None` without a status API.
    pub fn by_batch(&self) -> Option<&super::settle::StatusByBatch> {
        (self.capability == Capability::Present).then_some(&self.rows)
    }

    /// Every row of the batches the stack still knows, moved out of the view; `None` without a
    /// status API.
    pub fn into_rows(self) -> Option<Vec<StatusDelivery>> {
        (self.capability == Capability::Present).then(|| {
            // Room for exactly the rows: a list grown by doubling had room for 524,288 at
            // 300,000 rows, 20 MB more than it held at the run's peak.
            let mut all = Vec::with_capacity(self.rows.values().map(Vec::len).sum());
            for rows in self.rows.into_values() {
                let big = rows.len() > SMALL_BATCH;
                all.extend(rows);
                if big {
                    // The batch's own list goes back at once: both whole views resident were
                    // 20-30 MB on top of a big run's peak.
                    crate::malloc::trim();
                }
            }
            all
        })
    }

    /// How the status API answered: requests made, answers that were not the contract's.
    pub fn answers(&self) -> &StatusAnswers {
        &self.answers
    }

    /// The accepted batches the status API answered 404 for, with when that was first seen.
    pub fn lost(&self) -> Vec<LostBatch> {
        if self.capability != Capability::Present {
            return Vec::new();
        }
        self.lost
            .iter()
            .map(|(batch_id, at_ns)| LostBatch {
                batch_id: batch_id.clone(),
                first_missing_ns: *at_ns,
            })
            .collect()
    }
}

/// A row of an answer as [`StatusPoller::reader`] keeps it: the view's row, without what no
/// checker reads (the transitions' details and the payload digest) and with the batch id shared
/// by the keys of the contract's form; and, during the run's last poll only, its wire row's JSON
/// for `status.json` ([`StatusFile`]). Each wire row is dropped as it is read.
struct Parsed {
    row: StatusDelivery,
    json: Option<Box<str>>,
}

impl Parsed {
    /// The row as `status.json` has it: as answered, or as the view holds it when its wire
    /// form could not be written out (never seen: every field serialises).
    fn file_row(&self) -> Row<'_> {
        match &self.json {
            Some(json) => Row::Json(json),
            None => Row::Held(&self.row),
        }
    }
}

/// An answer as the poller reads it.
type Answer = StatusAnswer<Parsed>;

/// Shares `row`'s strings through `names`: its recipient id, address and message id take the
/// copy the expected deliveries or the ledger already hold (never adding one). The view of a big
/// run holds hundreds of thousands of rows for the whole run.
fn share(row: &mut StatusDelivery, names: &Interner) {
    let known = [
        Some(&mut row.recipient),
        row.address.as_mut(),
        row.provider_message_id.as_mut(),
    ];
    for n in known.into_iter().flatten() {
        if let Some(shared) = names.shared(n) {
            *n = shared;
        }
    }
}

/// `held` with each row of `changed` in place of the held row with its key (appended if new).
fn merge(mut held: Vec<StatusDelivery>, changed: Vec<StatusDelivery>) -> Vec<StatusDelivery> {
    let at: std::collections::HashMap<String, usize> = held
        .iter()
        .enumerate()
        .map(|(i, r)| (r.key().into_owned(), i))
        .collect();
    for row in changed {
        match at.get(&*row.key()) {
            // An unchanged row keeps its old copy (see `keep_unchanged`).
            Some(i) if held[*i] == row => {}
            Some(i) => held[*i] = row,
            None => held.push(row),
        }
    }
    held
}

/// A whole answer's rows, each row the stack did not change since `held` replaced by its held
/// copy (matched by position and key, as a stack lists its rows in a stable order). The
/// freshly parsed copies are dropped at once, so the next batch's answer is parsed into their
/// room: replacing a big run's whole view instead (its last poll asks for every row of every
/// batch) leaves the old rows' room free between the ledger's entries, where the allocator
/// cannot give back the pages it shares with them.
fn keep_unchanged(
    held: Vec<StatusDelivery>,
    mut fresh: Vec<StatusDelivery>,
) -> Vec<StatusDelivery> {
    for (new, old) in fresh.iter_mut().zip(held) {
        if new.key == old.key && *new == old {
            *new = old;
        }
    }
    fresh
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Name;

    fn row(key: &str, state: &str) -> StatusRowWire {
        serde_json::from_value(serde_json::json!({
            "key": key, "recipient": "r1", "channel": "line", "state": state
        }))
        .unwrap()
    }

    fn rows(n: usize) -> StatusAnswer {
        StatusAnswer::Page(load::StatusPage {
            deliveries: vec![row("k", "delivered"); n],
            cursor: None,
        })
    }

    fn page(rows: &[(&str, &str)], cursor: &str) -> StatusAnswer {
        StatusAnswer::Page(load::StatusPage {
            deliveries: rows.iter().map(|(k, s)| row(k, s)).collect(),
            cursor: Some(cursor.into()),
        })
    }

    fn garbage() -> StatusAnswer {
        StatusAnswer::Unreadable {
            http_status: 200,
            error: "not the contract's answer: expected value at line 1 column 1".into(),
            body_head: "<html>".into(),
        }
    }

    #[test]
    fn incremental_answers_merge_by_key_and_every_tenth_request_is_whole() {
        let mut p = StatusPoller::new(3, Interner::default());
        p.record_wire(
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
        p.record_wire(
            "b1",
            page(&[("a", "delivered"), ("c", "pending")], "c2"),
            true,
            1,
        );
        let states: Vec<(String, String)> = p
            .rows()
            .unwrap()
            .into_iter()
            .map(|r| (r.key().to_string(), r.state.to_string()))
            .collect();
        assert_eq!(
            states,
            [("a", "delivered"), ("b", "pending"), ("c", "pending")]
                .map(|(k, s)| (k.to_string(), s.to_string()))
        );
        assert_eq!(p.since("b1", false).as_deref(), Some("c2"));
        // After FULL_EVERY - 1 incremental requests, the next one is whole.
        for n in 2..FULL_EVERY {
            p.record_wire("b1", page(&[], &format!("c{}", n + 1)), true, n as u64);
        }
        assert_eq!(p.since("b1", false), None);
        // A whole answer replaces the rows and starts counting again.
        p.record_wire("b1", page(&[("a", "delivered")], "z"), false, 99);
        assert_eq!(p.rows().unwrap().len(), 1);
        assert_eq!(p.since("b1", false).as_deref(), Some("z"));
        // A stack that stops sending a cursor is asked for everything.
        p.record_wire("b1", rows(1), false, 100);
        assert_eq!(p.since("b1", false), None);
    }

    /// A whole answer keeps the held copy of every row it did not change (same text, so the
    /// view is what the answer says) and takes the changed ones; an incremental one likewise.
    #[test]
    fn unchanged_rows_keep_their_held_copy() {
        let mut p = StatusPoller::new(3, Interner::default());
        p.record_wire(
            "b1",
            page(&[("a", "sending"), ("b", "delivered")], "c1"),
            false,
            1,
        );
        let held_b = p.rows().unwrap()[1].key().as_ptr();
        p.record_wire(
            "b1",
            page(&[("a", "delivered"), ("b", "delivered")], "c2"),
            false,
            2,
        );
        let rows = p.rows().unwrap();
        assert_eq!(
            rows[0].state,
            crate::check::State::Delivered,
            "changed: taken"
        );
        assert_eq!(rows[1].key().as_ptr(), held_b, "unchanged: the held copy");
        let held_a = rows[0].key().as_ptr();
        p.record_wire(
            "b1",
            page(&[("a", "delivered"), ("c", "sending")], "c3"),
            true,
            3,
        );
        let rows = p.rows().unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows[0].key().as_ptr(),
            held_a,
            "incremental, unchanged: the held copy"
        );
    }

    /// A row's recipient id, address and message id take the copies the run already holds; a
    /// string the run does not know stays the row's own and is never added to the shared table
    /// (a stack could report a new one on every answer).
    #[test]
    fn rows_share_the_runs_strings_and_add_none() {
        let names = Interner::default();
        let (id, address, msg) = (
            Name::from("r1"),
            Name::from("+15550001"),
            names.name("SM0001"),
        );
        names.adopt(&id);
        names.adopt(&address);
        let mut p = StatusPoller::new(3, names.clone());
        let answer = |msg_id: &str| {
            let row = serde_json::json!({
                "key": "k1", "recipient": "r1", "channel": "sms", "address": "+15550001",
                "state": "submitted", "provider_message_id": msg_id, "last_error": "timeout 1",
                "transitions": [{"from": "sending", "to": "submitted", "source": "worker", "detail": "w1"}]
            });
            StatusAnswer::Page(load::StatusPage {
                deliveries: vec![serde_json::from_value(row).unwrap()],
                cursor: None,
            })
        };
        p.record_wire("b1", answer("SM0001"), false, 1);
        let rows = p.rows().unwrap();
        let same = |a: &Name, b: &Name| a.as_str().as_ptr() == b.as_str().as_ptr();
        assert!(same(&rows[0].recipient, &id));
        assert!(same(rows[0].address.as_ref().unwrap(), &address));
        assert!(same(rows[0].provider_message_id.as_ref().unwrap(), &msg));
        p.record_wire("b1", answer("SM-invented-by-the-stack"), false, 2);
        let rows = p.rows().unwrap();
        assert_eq!(
            rows[0].provider_message_id.as_deref(),
            Some("SM-invented-by-the-stack")
        );
        for unknown in ["SM-invented-by-the-stack", "timeout 1"] {
            assert!(names.shared(unknown).is_none(), "{unknown} was added");
        }
    }

    /// The last poll writes each answer whole to `status.json`, then a batch it got no answer
    /// for as held; the view never keeps a transition's detail or a payload digest (no checker
    /// reads them), from any poll.
    #[test]
    fn the_last_poll_writes_answers_whole_and_the_view_keeps_what_checkers_read() {
        let whole = crate::run::status_file::tests::row;
        let answer = |row: StatusRowWire| {
            StatusAnswer::Page(load::StatusPage {
                deliveries: vec![row],
                cursor: None,
            })
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.json");
        let mut p = StatusPoller::new(2, Interner::default());
        // The held batch's key has the contract's form: the view keeps its batch id alone.
        p.record_wire(
            "b2",
            answer(whole("b2:r1:sms", "polled SM2: delivered")),
            false,
            1,
        );
        p.file = Some(StatusFile::create(&path).unwrap());
        p.record_wire(
            "b1",
            answer(whole("k1", "sms status delivered for SM1")),
            false,
            2,
        );
        p.record_wire("b2", garbage(), false, 3);
        p.finish_file().unwrap().commit().unwrap();

        let written: Vec<StatusRowWire> =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut held = whole("b2:r1:sms", "");
        held.payload_sha256 = None;
        held.transitions[0].detail = None;
        assert_eq!(written, [whole("k1", "sms status delivered for SM1"), held]);
        let view = p.rows().unwrap();
        assert_eq!(view.len(), 2);
        for row in view {
            assert_eq!(row.transitions.len(), 1, "the transition itself is kept");
        }
    }

    /// Rows keyed in the contract's form hold their batch id alone; an incremental answer still
    /// finds each held row by its key, and every key reads back as the stack wrote it.
    #[test]
    fn contract_form_keys_are_merged_by_their_text() {
        let row = |r: &str, state: &str| -> StatusRowWire {
            serde_json::from_value(serde_json::json!({
                "key": format!("b1:{r}:line"), "recipient": r, "channel": "line", "state": state
            }))
            .unwrap()
        };
        let page = |rows: Vec<StatusRowWire>, cursor: &str| {
            StatusAnswer::Page(load::StatusPage {
                deliveries: rows,
                cursor: Some(cursor.into()),
            })
        };
        let mut p = StatusPoller::new(3, Interner::default());
        let first = vec![row("r1", "sending"), row("r2", "sending")];
        p.record_wire("b1", page(first, "c1"), false, 1);
        let changed = vec![row("r2", "delivered"), row("r3", "pending")];
        p.record_wire("b1", page(changed, "c2"), true, 2);
        let rows = p.rows().unwrap();
        let view: Vec<(String, String)> = rows
            .iter()
            .map(|r| (r.key().into_owned(), r.state.to_string()))
            .collect();
        let want = [
            ("b1:r1:line", "sending"),
            ("b1:r2:line", "delivered"),
            ("b1:r3:line", "pending"),
        ];
        assert_eq!(view, want.map(|(k, s)| (k.to_string(), s.to_string())));
        assert!(rows
            .iter()
            .all(|r| matches!(r.key, crate::check::RowKey::Batch(_))));
    }

    /// No status API: no file.
    #[test]
    fn without_a_status_api_the_last_poll_gives_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = StatusPoller::new(2, Interner::default());
        p.file = Some(StatusFile::create(&dir.path().join("status.json")).unwrap());
        p.record_wire("b1", StatusAnswer::NotFound, false, 1);
        assert!(p.finish_file().is_none());
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
            let mut p = StatusPoller::new(5, Interner::default());
            for (at, (id, page)) in answers.iter().enumerate() {
                let answer = page.map_or(StatusAnswer::NotFound, rows);
                p.record_wire(id, answer, false, at as u64);
            }
            assert_eq!(p.enabled(), on, "case {i}");
            assert_eq!(p.rows().map_or(0, |r| r.len()), kept, "case {i}");
            let got: Vec<String> = p.lost().into_iter().map(|l| l.batch_id).collect();
            assert_eq!(got, lost, "case {i}");
        }
    }

    /// A poll for batches other than the first (those quiescence waits on) still asks the first
    /// batch first while undecided; a 404 for a later batch, when the first could not be asked,
    /// is a lost batch once the first answers, never "no status API".
    #[test]
    fn only_the_first_batch_decides_that_there_is_no_status_api() {
        let ids: Vec<String> = ["b1", "b2", "b3"].map(String::from).to_vec();
        let mut p = StatusPoller::new(5, Interner::default());
        let asking = p.probe_first(&ids, vec!["b3".into(), "b1".into()]);
        assert_eq!(asking, ["b1", "b3"]);
        // The first request failed (no answer to use); the stack lost b3.
        p.record_wire("b3", StatusAnswer::NotFound, false, 7);
        assert!(p.enabled(), "a 404 for b3 is not the first batch's answer");
        p.record_wire("b1", rows(2), false, 9);
        let lost: Vec<String> = p.lost().into_iter().map(|l| l.batch_id).collect();
        assert_eq!(lost, ["b3"]);
        assert_eq!(
            p.probe_first(&ids, vec!["b2".into()]),
            ["b2"],
            "decided: as asked"
        );
        // A stack with no API: the first batch's 404 decides, and nothing is lost.
        let mut none = StatusPoller::new(5, Interner::default());
        none.probe_first(&ids, vec!["b2".into()]);
        none.record_wire("b2", StatusAnswer::NotFound, false, 1);
        none.record_wire("b1", StatusAnswer::NotFound, false, 2);
        assert!(!none.enabled());
        assert!(none.lost().is_empty());
    }

    /// A 2xx answer that is not the contract's means the stack has a status API and it is
    /// broken: kept as a counterexample, never taken for "no status API" — not even when a
    /// later batch answers 404 (that batch is then lost) — and the rows held stay as they were.
    #[test]
    fn an_unreadable_answer_is_a_broken_status_api_not_an_absent_one() {
        let mut p = StatusPoller::new(2, Interner::default());
        p.record_wire("b1", garbage(), false, 7);
        p.record_wire("b2", StatusAnswer::NotFound, false, 8);
        assert!(p.enabled());
        assert_eq!(p.rows().map(|r| r.len()), Some(0));
        let lost: Vec<String> = p.lost().into_iter().map(|l| l.batch_id).collect();
        assert_eq!(lost, ["b2"]);
        let a = p.answers();
        assert_eq!((a.readable, a.unreadable), (1, 1));
        assert_eq!(a.examples[0].batch_id, "b1");
        assert_eq!((a.examples[0].at_ns, a.examples[0].http_status), (7, 200));
        // Rows held from a good answer survive a later garbage one.
        let mut p = StatusPoller::new(2, Interner::default());
        p.record_wire("b1", rows(2), false, 1);
        for at in 2..30 {
            p.record_wire("b1", garbage(), false, at);
        }
        assert_eq!(p.rows().map(|r| r.len()), Some(2));
        assert_eq!(p.answers().unreadable, 28);
        assert_eq!(p.answers().examples.len(), StatusAnswers::KEPT);
    }

    /// `fetch_batch_status` at the boundary, against a server answering each way a stack might:
    /// the contract's answer (whole, or a few bytes at a time), one cut off by the connection
    /// (no answer to use), 404, a 2xx that is not JSON or not its shape, `attempts` past a
    /// u32 or below 0 (saying how many rows were read before it), an answer that never ends (cut at the cap), a 5xx and a redirect (no answer to use).
    #[tokio::test]
    async fn every_answer_of_the_status_api_is_read_or_refused_at_the_boundary() {
        use axum::body::Body;
        use axum::http::StatusCode;
        use axum::response::Response;
        let app = axum::Router::new().route(
            "/v1/batches/{id}/deliveries",
            axum::routing::get(|axum::extract::Path(id): axum::extract::Path<String>| async move {
                let body = match id.as_str() {
                    "good" => r#"{"deliveries": [{"key": "k", "recipient": "r1", "channel": "line", "state": "exploded"}], "cursor": "c"}"#.to_string(),
                    "html" => "<html>\u{0}not json".to_string(),
                    "shape" => r#"{"deliveries": "all of them"}"#.to_string(),
                    "absurd" => r#"{"deliveries": [{"key": "k", "recipient": "r1", "channel": "line", "state": "sent", "attempts": 1e30}]}"#.to_string(),
                    "negative" => r#"{"deliveries": [{"key": "k", "recipient": "r1", "channel": "line", "state": "sent", "attempts": 1}, {"key": "k2", "recipient": "r2", "channel": "line", "state": "sent", "attempts": -1}]}"#.to_string(),
                    "endless" => {
                        let chunks = futures::stream::repeat_with(|| {
                            Ok::<_, std::io::Error>(axum::body::Bytes::from_static(&[b' '; 64 << 10]))
                        });
                        return Response::new(Body::from_stream(chunks));
                    }
                    // The contract's answer a few bytes at a time, as a big one arrives.
                    "trickled" => {
                        let text = r#"{"deliveries": [{"key": "k", "recipient": "r1", "channel": "line", "state": "exploded"}]}"#;
                        let chunks: Vec<Result<axum::body::Bytes, std::io::Error>> = text
                            .as_bytes()
                            .chunks(7)
                            .map(|c| Ok(axum::body::Bytes::copy_from_slice(c)))
                            .collect();
                        return Response::new(Body::from_stream(futures::stream::iter(chunks)));
                    }
                    // The connection fails half-way through the answer.
                    "cut" => {
                        let start = futures::stream::iter([Ok::<_, std::io::Error>(
                            axum::body::Bytes::from_static(br#"{"deliveries": [{"key": "#),
                        )]);
                        let reset = futures::stream::once(async {
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            Err(std::io::Error::other("reset"))
                        });
                        let chunks = futures::StreamExt::chain(start, reset);
                        return Response::new(Body::from_stream(chunks));
                    }
                    "missing" => return Response::builder().status(StatusCode::NOT_FOUND).body(Body::empty()).unwrap(),
                    "broken" => return Response::builder().status(StatusCode::BAD_GATEWAY).body(Body::from("{}")).unwrap(),
                    _ => return Response::builder().status(StatusCode::FOUND).header("location", "/v1/batches/good/deliveries").body(Body::empty()).unwrap(),
                };
                Response::new(Body::from(body))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let cap = 1 << 20;
        // (batch, what the answer must be read as: "page", "not found", an unreadable answer's
        // error, or a failure's message)
        let cases = [
            ("good", "page"),
            ("trickled", "page"),
            ("cut", "status API body"),
            ("missing", "not found"),
            ("html", "not the contract's answer: expected value at line 1 column 1"),
            ("shape", "not the contract's answer: invalid type: string \"all of them\", expected a sequence"),
            ("absurd", "not the contract's answer: invalid type: floating point `1e+30`, expected u32 at line 1 column 101 (0 deliveries read before it)"),
            // Where in a long answer the refusal fell: after the first row.
            ("negative", "not the contract's answer: invalid value: integer `-1`, expected u32 at line 1 column 184 (1 delivery read before it)"),
            ("endless", "the answer is longer than 1048576 bytes"),
            ("broken", "status API answered HTTP 502 Bad Gateway"),
            ("moved", "status API answered HTTP 302 Found"),
        ];
        for (batch, want) in cases {
            let got =
                load::fetch_batch_status(&client, &base, batch, None, cap, std::convert::identity)
                    .await;
            let seen = match &got {
                Ok(StatusAnswer::Page(p)) => {
                    assert_eq!(p.deliveries[0].state.as_str(), "exploded");
                    "page".to_string()
                }
                Ok(StatusAnswer::NotFound) => "not found".to_string(),
                Ok(StatusAnswer::Unreadable {
                    http_status,
                    error,
                    body_head,
                }) => {
                    assert_eq!(*http_status, 200, "{batch}");
                    assert!(body_head.len() <= 200, "{batch}");
                    error.clone()
                }
                Err(e) => format!("{e:#}"),
            };
            assert!(seen.starts_with(want), "{batch}: {seen:?} is not {want:?}");
        }
    }

    /// Small batches (a trickle's orders) are asked several at once, a big one always alone, the
    /// first answer alone while it decides whether there is a status API; every answer is taken.
    #[tokio::test]
    async fn small_batches_are_asked_together_and_big_ones_alone() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
        use std::sync::Arc;
        use std::time::Duration;
        #[derive(Default)]
        struct Seen {
            in_flight: AtomicUsize,
            most: AtomicUsize,
            big_beside_another: AtomicBool,
            endless: AtomicBool,
        }
        let seen = Arc::new(Seen::default());
        let server = seen.clone();
        let app = axum::Router::new().route(
            "/v1/batches/{id}/deliveries",
            axum::routing::get(move |axum::extract::Path(id): axum::extract::Path<String>| {
                let seen = server.clone();
                async move {
                    let now = seen.in_flight.fetch_add(1, SeqCst) + 1;
                    seen.most.fetch_max(now, SeqCst);
                    // Long enough that requests made together are served together.
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    if id == "o5" && seen.endless.load(SeqCst) {
                        seen.in_flight.fetch_sub(1, SeqCst);
                        let chunks = futures::stream::repeat_with(|| {
                            Ok::<_, std::io::Error>(axum::body::Bytes::from_static(&[b' '; 64 << 10]))
                        });
                        return axum::response::Response::new(axum::body::Body::from_stream(chunks));
                    }
                    let n = if id == "big" { SMALL_BATCH + 1 } else { 3 };
                    if id == "big" && seen.in_flight.load(SeqCst) > 1 {
                        seen.big_beside_another.store(true, SeqCst);
                    }
                    seen.in_flight.fetch_sub(1, SeqCst);
                    let rows: Vec<_> = (0..n)
                        .map(|i| serde_json::json!({"key": format!("{id}-{i}"), "recipient": "r1", "channel": "line", "state": "sending"}))
                        .collect();
                    axum::response::IntoResponse::into_response(axum::Json(
                        serde_json::json!({ "deliveries": rows }),
                    ))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = reqwest::Client::new();
        let mut ids: Vec<String> = (1..=20).map(|k| format!("o{k}")).collect();
        ids.insert(10, "big".into());
        let mut p = StatusPoller::new(1_000, Interner::default());

        // Nothing is known to be small yet: one at a time.
        p.poll(&client, &base, &ids, true, 0).await.unwrap();
        assert_eq!(seen.most.load(SeqCst), 1, "unknown batches are asked alone");
        assert_eq!(p.rows().unwrap().len(), 20 * 3 + SMALL_BATCH + 1);

        seen.most.store(0, SeqCst);
        p.poll(&client, &base, &ids, true, 0).await.unwrap();
        let most = seen.most.load(SeqCst);
        assert!(
            (2..=AT_ONCE).contains(&most),
            "small batches asked together, at most {AT_ONCE}: {most}"
        );
        assert!(
            !seen.big_beside_another.load(SeqCst),
            "a big batch is asked alone"
        );
        assert_eq!(p.answers().requests, 42);
        assert_eq!(p.rows().unwrap().len(), 20 * 3 + SMALL_BATCH + 1);

        // One small batch of a group answers without end: cut at its share of the cap (what
        // it read is its neighbours' memory too), reported, and its neighbours still read.
        seen.endless.store(true, SeqCst);
        p.poll(&client, &base, &ids, true, 0).await.unwrap();
        assert_eq!(p.answers().unreadable, 1);
        let cut = &p.answers().examples[0];
        assert_eq!(cut.batch_id, "o5");
        let share = answer_cap(1_000) / AT_ONCE;
        assert!(
            cut.error
                .starts_with(&format!("the answer is longer than {share} bytes")),
            "{}",
            cut.error
        );
        assert_eq!(p.rows().unwrap().len(), 20 * 3 + SMALL_BATCH + 1);
    }
}
