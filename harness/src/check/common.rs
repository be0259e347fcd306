//! Shared plumbing of the checkers: joining expected deliveries to ledger sends, building
//! verdicts, and rendering times and attempts as counterexample JSON.
//!
//! Nothing here decides whether an invariant holds; that stays in each checker's own file so a
//! reader sees a rule and its test side by side. Never add I/O here: checkers are pure.

use std::collections::BTreeMap;

use super::keyed::Keyed;
use super::Entry;
use mock_providers::ledger::{EntryKind, Outcome, Provider};
use serde_json::{json, Map, Value};

use super::{Expected, Input, Population, Status, StatusDelivery, Unjudged, Verdict};
use crate::scenario::Channel;

/// Counterexamples kept per verdict; `total_counterexamples` counts them all and
/// `violations_by_rule` counts them per rule.
pub const MAX_KEPT: usize = 50;

/// Nanoseconds on the ledger clock as milliseconds since the run started (the ledger's zero),
/// with microsecond precision so sub-millisecond gaps stay visible.
pub fn ms(ns: u64) -> f64 {
    (ns as f64 / 1_000.0).round() / 1_000.0
}

/// A signed duration in milliseconds (`later − earlier`, negative when out of order).
pub fn gap_ms(later_ns: u64, earlier_ns: u64) -> f64 {
    ((later_ns as f64 - earlier_ns as f64) / 1_000.0).round() / 1_000.0
}

/// An answer this close before its sender was killed or frozen may never have been recorded by
/// it (the process died between reading the answer and writing it down).
pub const ANSWER_RECORD_WINDOW_NS: u64 = 100_000_000;

/// Share of sends a pid-based rule may leave unjudged (no known sender) before it is
/// `insufficient`.
pub const MAX_UNATTRIBUTED_SHARE: f64 = 0.01;

/// Share of its items a rule may leave unjudged for other reasons (reports it cannot match)
/// before it is `insufficient`.
pub const MAX_UNJUDGED_SHARE: f64 = 0.01;

/// Counterexamples of one checker (keeps at most [`MAX_KEPT`], shared fairly among the rules
/// that were broken so no rule's proof is crowded out by another's; counts them all, per rule)
/// and the population each of its rules judged.
///
/// Every rule that applies to the run declares its population with [`Findings::judged`] before
/// [`Findings::verdict`]: a verdict with no violation and a rule short of its minimum is
/// `insufficient`, never `holds`. A rule the run never provokes (no SIGTERM, callbacks off) is
/// simply not declared, or the whole checker is [`not_checked`] with the reason.
#[derive(Default)]
pub struct Findings {
    /// Per rule (a counterexample's `"rule"`, empty when it names none): the first
    /// [`MAX_KEPT`] counterexamples, each with its push order.
    kept: BTreeMap<String, Vec<(usize, Value)>>,
    /// Per rule: every counterexample pushed.
    by_rule: BTreeMap<String, usize>,
    total: usize,
    judged: BTreeMap<String, Population>,
    main_rule: Option<String>,
}

impl Findings {
    pub fn push(&mut self, v: Value) {
        let rule = v["rule"].as_str().unwrap_or_default().to_string();
        *self.by_rule.entry(rule.clone()).or_default() += 1;
        let kept = self.kept.entry(rule).or_default();
        if kept.len() < MAX_KEPT {
            kept.push((self.total, v));
        }
        self.total += 1;
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// `rule` applied to this run and judged `n` items; it needs at least one.
    pub fn judged(&mut self, rule: &str, n: u64) -> &mut Population {
        self.judged_at_least(rule, n, 1)
    }

    /// `rule` applied to this run and judged `n` items; it needs at least `min` (e.g. 100 samples
    /// for a p99). Declaring a rule twice adds the counts. The first rule declared is the
    /// checker's main one, the one `[expect] min_judged` raises.
    pub fn judged_at_least(&mut self, rule: &str, n: u64, min: u64) -> &mut Population {
        self.main_rule.get_or_insert_with(|| rule.to_string());
        let p = self.judged.entry(rule.to_string()).or_default();
        p.judged += n;
        p.min = p.min.max(min);
        p
    }

    /// `rule` could not judge `count` of the `of` items it looked at (`why`); it is short when
    /// their share exceeds `max_share`. Declaring twice adds the counts.
    pub fn unjudged(&mut self, rule: &str, of: u64, count: u64, max_share: f64, why: &str) {
        let p = self.judged_at_least(rule, 0, 0);
        let u = p.unjudged.get_or_insert_with(|| Unjudged {
            max_share,
            why: why.into(),
            ..Default::default()
        });
        u.of += of;
        u.count += count;
    }

    /// `rule` needs the sender pid of each of `sends` it looked at; `unattributed` had none. Short
    /// when their share exceeds [`MAX_UNATTRIBUTED_SHARE`].
    pub fn unattributed(&mut self, rule: &str, sends: u64, unattributed: u64) {
        self.unjudged(
            rule,
            sends,
            unattributed,
            MAX_UNATTRIBUTED_SHARE,
            "sends with no known sender pid",
        );
    }

    /// `Violated` with findings; otherwise `Insufficient` when a declared rule judged too little,
    /// else `Holds`.
    pub fn verdict(self, checker: &str, summary: String, figures: Map<String, Value>) -> Verdict {
        let status = if self.total == 0 {
            Status::Holds
        } else {
            Status::Violated
        };
        self.verdict_with(checker, status, summary, figures)
    }

    pub fn verdict_with(
        self,
        checker: &str,
        status: Status,
        summary: String,
        figures: Map<String, Value>,
    ) -> Verdict {
        let mut violations_by_rule = self.by_rule;
        violations_by_rule.remove("");
        let mut v = Verdict {
            checker: checker.into(),
            status,
            summary,
            counterexamples: fair_sample(self.kept),
            total_counterexamples: self.total,
            figures,
            judged: self.judged,
            main_rule: self.main_rule,
            violations_by_rule,
        };
        settle(&mut v);
        v
    }
}

/// At most [`MAX_KEPT`] of `kept`, taken in turn from each rule (so a rule broken once is shown
/// beside one broken a thousand times), in the order they were found.
fn fair_sample(kept: BTreeMap<String, Vec<(usize, Value)>>) -> Vec<Value> {
    let mut queues: Vec<std::vec::IntoIter<(usize, Value)>> =
        kept.into_values().map(Vec::into_iter).collect();
    let mut taken = Vec::new();
    while taken.len() < MAX_KEPT {
        let before = taken.len();
        for q in &mut queues {
            if taken.len() == MAX_KEPT {
                break;
            }
            taken.extend(q.next());
        }
        if taken.len() == before {
            break;
        }
    }
    taken.sort_by_key(|(order, _)| *order);
    taken.into_iter().map(|(_, v)| v).collect()
}

/// Turns a `holds` whose populations fall short into `insufficient`, saying why in the summary.
/// A violation stays a violation: a counterexample is proof however little was judged.
pub fn settle(v: &mut Verdict) {
    if v.status != Status::Holds {
        return;
    }
    let short = v.shortfalls();
    if !short.is_empty() {
        v.status = Status::Insufficient;
        v.summary
            .push_str(&format!(" — insufficient: {}", short.join("; ")));
    }
}

/// A checker that did not run, and why.
pub fn not_checked(checker: &str, reason: impl Into<String>) -> Verdict {
    Verdict {
        checker: checker.into(),
        status: Status::NotChecked,
        summary: reason.into(),
        counterexamples: Vec::new(),
        total_counterexamples: 0,
        figures: Map::new(),
        judged: BTreeMap::new(),
        main_rule: None,
        violations_by_rule: BTreeMap::new(),
    }
}

/// Turns a `json!({...})` object into a figures map.
pub fn figures(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// Send attempts grouped by (provider, address), each group in arrival order ([`Keyed`]).
pub struct Sends<'a> {
    /// Every `Send` entry; a group in order of arrival, then `seq` (the answer order: it breaks
    /// ties of arrival, and is unique).
    by: Keyed<'a, Entry>,
}

impl<'a> Sends<'a> {
    /// Indexes the `Send` entries of `ledger`. Polls and callbacks are not send attempts.
    pub fn new(ledger: &'a [Entry]) -> Sends<'a> {
        let mut sends: Vec<&'a Entry> = ledger
            .iter()
            .filter(|e| e.kind == EntryKind::Send)
            .collect();
        sends.sort_unstable_by_key(|e| (e.received_ns, e.seq));
        Sends {
            by: Keyed::new(sends, |e| (e.provider, e.recipient.as_str())),
        }
    }

    /// The attempts of the delivery on `channel` to `address`, in arrival order.
    pub fn of(&self, channel: Channel, address: &str) -> &[&'a Entry] {
        self.by_key(channel.provider(), address)
    }

    pub fn of_expected(&self, e: &Expected) -> &[&'a Entry] {
        self.of(e.channel, &e.address)
    }

    /// Every (provider, address) that saw at least one send attempt, each once, in no
    /// meaningful order.
    pub fn keys(&self) -> impl Iterator<Item = (Provider, &'a str)> + '_ {
        self.groups().map(|(key, _)| key)
    }

    /// Every (provider, address) that saw a send attempt with its attempts in arrival order,
    /// each once, in no meaningful order.
    pub fn groups(&self) -> impl Iterator<Item = ((Provider, &'a str), &[&'a Entry])> + '_ {
        self.by.groups()
    }

    pub fn by_key(&self, provider: Provider, address: &str) -> &[&'a Entry] {
        self.by.group((provider, address))
    }
}

/// The expected deliveries found by (provider, address), the key the ledger's entries carry
/// ([`Keyed`]). Of deliveries with the same key, the last listed is the one found.
pub struct ByAddress<'a> {
    by: Keyed<'a, Expected>,
}

impl<'a> ByAddress<'a> {
    pub fn new(expected: &'a [Expected]) -> ByAddress<'a> {
        ByAddress {
            by: Keyed::new(expected, |e| (e.channel.provider(), e.address.as_str())),
        }
    }

    pub fn get(&self, provider: Provider, address: &str) -> Option<&'a Expected> {
        self.by.last((provider, address))
    }

    pub fn contains(&self, provider: Provider, address: &str) -> bool {
        self.get(provider, address).is_some()
    }
}

/// The channel a provider carries.
pub fn channel_of(p: Provider) -> Channel {
    match p {
        Provider::Line => Channel::Line,
        Provider::Smtp => Channel::Email,
        Provider::Sms => Channel::Sms,
    }
}

/// An answer after which the delivery needs no further attempt.
pub fn is_final(o: Outcome) -> bool {
    matches!(
        o,
        Outcome::Accepted | Outcome::IdempotentRepeat | Outcome::Permanent
    )
}

/// An answer that leaves the delivery to be retried (counts towards exhaustion).
pub fn is_failure(o: Outcome) -> bool {
    matches!(o, Outcome::Transient | Outcome::ProtocolError)
}

pub fn outcome_str(o: Outcome) -> &'static str {
    match o {
        Outcome::Accepted => "accepted",
        Outcome::IdempotentRepeat => "idempotent_repeat",
        Outcome::Transient => "transient",
        Outcome::Permanent => "permanent",
        Outcome::ProtocolError => "protocol_error",
        Outcome::Info => "info",
    }
}

/// One send attempt as counterexample JSON: ledger seq, arrival and answer times, sender pid,
/// provider-side attempt number, outcome and payload hash.
pub fn attempt_json(e: &Entry, input: &Input) -> Value {
    json!({
        "seq": e.seq,
        "attempt": e.attempt,
        "at_ms": ms(e.received_ns),
        "answered_ms": ms(e.mono_ns),
        "pid": input.pids.get(e.seq),
        "outcome": outcome_str(e.outcome),
        "status": e.status,
        "fault": e.fault(),
        "payload_hash": e.payload_hash(),
    })
}

/// The identifying part of a counterexample about one expected delivery.
pub fn delivery_json(e: &Expected) -> Map<String, Value> {
    figures(json!({
        "recipient": e.recipient,
        "channel": e.channel.as_str(),
        "address": e.address,
    }))
}

/// Status API rows by delivery: (its channel's provider, its recipient) ([`Input::status_row`]).
pub type StatusIndex<'a> = Keyed<'a, StatusDelivery>;

/// Status API rows by delivery. A delivery listed twice (`idempotent_enqueue`'s `duplicate_rows`)
/// is read by its first row in the stack's order ([`status_row`]).
pub fn status_index(rows: &[StatusDelivery]) -> StatusIndex<'_> {
    Keyed::new(rows, |r| (r.channel.provider(), r.recipient.as_str()))
}

/// `e`'s row in `index`: the first the stack listed.
pub fn status_row<'a>(index: &StatusIndex<'a>, e: &Expected) -> Option<&'a StatusDelivery> {
    index.first((e.channel.provider(), e.recipient.as_str()))
}

/// Per-channel counters, rendered as `{"line": {...}, "email": {...}}`.
#[derive(Default)]
pub struct PerChannel {
    counts: std::collections::BTreeMap<Channel, std::collections::BTreeMap<&'static str, u64>>,
}

impl PerChannel {
    /// Makes sure `channel` shows every key in `keys`, zero when never counted.
    pub fn init(&mut self, channel: Channel, keys: &[&'static str]) {
        let m = self.counts.entry(channel).or_default();
        for k in keys {
            m.entry(k).or_insert(0);
        }
    }

    pub fn add(&mut self, channel: Channel, key: &'static str) {
        *self
            .counts
            .entry(channel)
            .or_default()
            .entry(key)
            .or_insert(0) += 1;
    }

    pub fn total(&self, key: &str) -> u64 {
        self.counts.values().filter_map(|m| m.get(key)).sum()
    }

    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        for (c, m) in &self.counts {
            out.insert(c.as_str().into(), json!(m));
        }
        Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use mock_providers::ledger::LedgerEntry;

    use super::*;
    use crate::check::{Interner, Keep};

    fn send(provider: Provider, address: &str, seq: u64, received_ns: u64) -> Entry {
        let mut e = LedgerEntry::draft(provider, EntryKind::Send, address);
        e.seq = seq;
        e.received_ns = received_ns;
        Entry::of(&e, &Interner::default(), &Keep::NoHtml)
    }

    /// A delivery the stack lists twice is read by its first row.
    #[test]
    fn the_status_index_keeps_a_deliverys_first_row() {
        let mut w = crate::check::testkit::World::new();
        for channel in [Channel::Line, Channel::Email, Channel::Sms] {
            w.expect("r1", channel);
        }
        w.status_row("r1", Channel::Line, None, &["sending", "delivered"]);
        w.status_row("r1", Channel::Line, None, &["sending", "failed"]);
        w.status_row("r1", Channel::Email, None, &["sending", "failed"]);
        let rows = w.status.as_deref().expect("rows");
        let index = status_index(rows);
        let state = |channel: Channel| {
            let e = w
                .expected
                .iter()
                .find(|e| e.recipient.as_str() == "r1" && e.channel == channel);
            status_row(&index, e.expect("expected")).map(|r| r.state.clone())
        };
        assert_eq!(state(Channel::Line), Some(super::super::State::Delivered));
        assert_eq!(state(Channel::Email), Some(super::super::State::Failed));
        assert_eq!(state(Channel::Sms), None);
    }

    /// A delivery's sends in arrival order (`seq` breaking ties), only its own provider's and
    /// address's; every key once; an address never sent to has none.
    #[test]
    fn sends_are_grouped_by_provider_and_address_in_arrival_order() {
        let mut ledger = vec![
            send(Provider::Sms, "+1", 0, 50),
            send(Provider::Line, "+1", 1, 10),
            send(Provider::Sms, "+1", 2, 20),
            send(Provider::Sms, "+2", 3, 5),
            send(Provider::Sms, "+1", 4, 20),
            send(Provider::Sms, "+1", 5, 30),
        ];
        let mut poll = LedgerEntry::draft(Provider::Sms, EntryKind::Poll, "+1");
        poll.seq = 6;
        ledger.push(Entry::of(&poll, &Interner::default(), &Keep::NoHtml));
        let sends = Sends::new(&ledger);
        let seqs = |p, a| -> Vec<u64> { sends.by_key(p, a).iter().map(|e| e.seq).collect() };
        assert_eq!(seqs(Provider::Sms, "+1"), [2, 4, 5, 0]);
        assert_eq!(seqs(Provider::Line, "+1"), [1]);
        assert_eq!(seqs(Provider::Sms, "+2"), [3]);
        assert!(seqs(Provider::Sms, "+3").is_empty());
        assert!(seqs(Provider::Smtp, "+1").is_empty());
        assert_eq!(sends.of(Channel::Sms, "+2").len(), 1);
        let mut keys: Vec<_> = sends.keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                (Provider::Line, "+1"),
                (Provider::Sms, "+1"),
                (Provider::Sms, "+2")
            ]
        );
    }

    /// Found by the ledger's key (provider, address); of two deliveries with one key, the last
    /// listed (as a map built in list order kept it).
    #[test]
    fn expected_deliveries_are_found_by_provider_and_address() {
        let e = |recipient: &str, channel, address: &str| Expected {
            recipient: recipient.into(),
            channel,
            address: address.into(),
            bad: false,
            tricky_name: None,
            batch_id: "b".into(),
            template_edited: false,
        };
        let expected = [
            e("r1", Channel::Sms, "+1"),
            e("r2", Channel::Line, "+1"),
            e("r3", Channel::Sms, "+1"),
            e("r4", Channel::Email, "a@x"),
        ];
        let by = ByAddress::new(&expected);
        let found = |p, a| by.get(p, a).map(|e| e.recipient.as_str());
        assert_eq!(found(Provider::Sms, "+1"), Some("r3"));
        assert_eq!(found(Provider::Line, "+1"), Some("r2"));
        assert_eq!(found(Provider::Smtp, "a@x"), Some("r4"));
        assert_eq!(found(Provider::Smtp, "+1"), None);
        assert!(!by.contains(Provider::Sms, "+2"));
        assert!(ByAddress::new(&[]).get(Provider::Sms, "+1").is_none());
    }

    #[test]
    fn a_rule_broken_once_is_kept_beside_one_broken_many_times() {
        let mut f = Findings::default();
        for i in 0..80 {
            f.push(json!({"rule": "disagrees", "i": i}));
        }
        f.push(json!({"rule": "regression", "i": 80}));
        f.push(json!({"note": "no rule", "i": 81}));
        let v = f.verdict("callbacks", String::new(), Map::new());
        assert_eq!(v.counterexamples.len(), MAX_KEPT);
        assert_eq!(v.total_counterexamples, 82);
        let rules: Vec<&str> = v
            .counterexamples
            .iter()
            .filter_map(|c| c["rule"].as_str())
            .collect();
        assert!(rules.contains(&"regression"), "{rules:?}");
        assert_eq!(v.violations_by_rule["disagrees"], 80);
        assert_eq!(v.violations_by_rule["regression"], 1);
        assert!(!v.violations_by_rule.contains_key(""));
        // Kept in the order they were found.
        let order: Vec<u64> = v
            .counterexamples
            .iter()
            .map(|c| c["i"].as_u64().unwrap())
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    }
}
