//! Checkers: each turns the ground truth of a finished run into a [`Verdict`].
//!
//! Ground truth is the providers' ledger (what customers received), the harness's own timeline
//! (chaos actions, process lifecycles) and, where the stack exposes it, its status API. A checker
//! never trusts the stack's word for what was sent. Every checker is a pure function of
//! [`Input`], so each has tests that break its invariant on purpose and see it reported.
//!
//! One file per checker, each `pub fn check(&Input) -> Verdict` with its rules in its `//!` doc;
//! [`run_all`] runs them in report order. Every counterexample is a JSON object with a `rule`
//! field naming the rule it breaks, the delivery (`recipient`, `channel`, `address`) where there
//! is one, and times as milliseconds on the ledger clock (`*_ms`), at most 50 kept per verdict.

pub mod agreement;
mod availability;
mod backlog;
pub mod callbacks;
pub(crate) mod common;
pub mod crashes;
mod entry;
mod event;
pub mod exactly_once;
pub mod fairness;
pub mod graceful_shutdown;
pub mod headers;
pub mod idempotent_enqueue;
pub mod immutable_payload;
mod keyed;
pub mod no_loss;
mod orphans;
mod outages;
mod payload_hash;
mod pids;
pub mod quiescence;
pub mod recovery;
pub mod responsiveness;
pub mod retry_discipline;
mod state;
#[cfg(test)]
mod testkit;
mod transition;
mod unknowns;
mod wallclock;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::scenario::{Channel, Scenario};

/// One delivery the load asked for: a (recipient, channel) pair. A run of 100,000 recipients
/// holds 300,000 for the whole run: the recipient id is shared by its channels' deliveries and
/// the batch id by its batch's ([`Name`]), and the address is shared with what indexes it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Expected {
    /// Recipient id as enqueued (`r000001`).
    pub recipient: Name,
    pub channel: Channel,
    /// The address on that channel (LINE user id, e-mail, phone) — what the ledger records.
    pub address: Name,
    /// The provider rejects this address for good (seeded share of the address space).
    pub bad: bool,
    /// The recipient's name when it contains HTML or non-ASCII text (escaping checks).
    pub tricky_name: Option<Name>,
    /// Batch id it was enqueued in.
    pub batch_id: Name,
    /// Its batch was POSTed with the edited template (`[load] template_edit`).
    pub template_edited: bool,
}

/// A delivery row from the stack's status API (`GET /v1/batches/{id}/deliveries`) as the
/// checkers read it: everything the stack wrote but the transitions' details and the payload
/// digest, which no checker reads ([`StatusRowWire`] has them, for `status.json`). The status
/// view of a big run holds hundreds of thousands for the whole run, so its strings are boxed
/// (no spare capacity) or shared, its key kept as its batch id when it has the contract's form
/// ([`RowKey`]), its states and sources small enums and its times numbers where they read back
/// byte for byte ([`At`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StatusDelivery {
    /// Read as text with [`StatusDelivery::key`].
    pub key: RowKey,
    /// Shared by the status view with the expected deliveries' ids and addresses and the
    /// ledger's message ids ([`Name`]) when they are the same text.
    pub recipient: Name,
    pub channel: Channel,
    pub address: Option<Name>,
    pub state: State,
    pub attempts: u32,
    pub provider_message_id: Option<Name>,
    pub last_error: Option<Name>,
    pub transitions: Box<[StatusTransition]>,
}

/// A delivery row as the contract writes it, whole: read from each answer, written to
/// `status.json` by the run's last poll, and made a [`StatusDelivery`] for the view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StatusRowWire {
    pub key: Box<str>,
    pub recipient: Name,
    pub channel: Channel,
    #[serde(default)]
    pub address: Option<Name>,
    pub state: State,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub provider_message_id: Option<Name>,
    #[serde(default)]
    pub payload_sha256: Option<Box<str>>,
    #[serde(default)]
    pub last_error: Option<Name>,
    #[serde(default)]
    pub transitions: Vec<TransitionWire>,
}

/// A status row's delivery key. The contract forms it `batch:recipient:channel`: a key of that
/// form is kept as its batch id alone, one copy shared by the batch's rows (the rest is the row's
/// own recipient and channel) — at 300,000 rows, 20 MB less than a copy of each key. Any other
/// key is kept as written.
#[derive(Debug, Clone, PartialEq)]
pub enum RowKey {
    /// The batch id of a key `batch:recipient:channel`.
    Batch(Name),
    /// Any other key.
    Written(Box<str>),
}

/// The row as the view holds it, in the contract's shape (no transition details, no payload
/// digest): what `status.json` keeps of a batch the last poll got no answer for.
impl Serialize for StatusDelivery {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut row = s.serialize_struct("StatusDelivery", 9)?;
        row.serialize_field("key", &self.key())?;
        row.serialize_field("recipient", &self.recipient)?;
        row.serialize_field("channel", &self.channel)?;
        row.serialize_field("address", &self.address)?;
        row.serialize_field("state", &self.state)?;
        row.serialize_field("attempts", &self.attempts)?;
        row.serialize_field("provider_message_id", &self.provider_message_id)?;
        row.serialize_field("last_error", &self.last_error)?;
        row.serialize_field("transitions", &self.transitions)?;
        row.end()
    }
}

impl StatusDelivery {
    /// The view's row of `w`, from an answer for `batch` (the batch id's one shared copy).
    pub fn of(w: StatusRowWire, batch: &Name) -> StatusDelivery {
        let contract = [batch.as_str(), w.recipient.as_str(), w.channel.as_str()];
        let key = if w.key.split(':').eq(contract) {
            RowKey::Batch(batch.clone())
        } else {
            RowKey::Written(w.key)
        };
        StatusDelivery {
            key,
            recipient: w.recipient,
            channel: w.channel,
            address: w.address,
            state: w.state,
            attempts: w.attempts,
            provider_message_id: w.provider_message_id,
            last_error: w.last_error,
            transitions: w.transitions.into_iter().map(Into::into).collect(),
        }
    }

    /// A row of a test's own, keyed as the contract forms keys.
    #[cfg(test)]
    pub fn keyed(batch: &str, recipient: &str, channel: Channel, state: State) -> StatusDelivery {
        StatusDelivery {
            key: RowKey::Batch(batch.into()),
            recipient: recipient.into(),
            channel,
            address: None,
            state,
            attempts: 1,
            provider_message_id: None,
            last_error: None,
            transitions: Box::default(),
        }
    }

    /// The delivery's key, as the stack wrote it.
    pub fn key(&self) -> std::borrow::Cow<'_, str> {
        match &self.key {
            RowKey::Batch(b) => {
                std::borrow::Cow::Owned(format!("{b}:{}:{}", self.recipient, self.channel.as_str()))
            }
            RowKey::Written(k) => std::borrow::Cow::Borrowed(k),
        }
    }
}

pub use entry::{EmailHeaders, Entry, Field, Interner, Keep, Name};
pub use event::{EventKind, Role};
pub use payload_hash::PayloadHash;
pub use pids::Pids;
pub use state::{At, Source, State};
pub use transition::{StatusTransition, TransitionWire};

/// Something the harness did or saw, on the ledger's monotonic clock.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TimelineEvent {
    pub mono_ns: u64,
    pub kind: EventKind,
    /// Worker slot (1-based) it concerns, if any.
    pub slot: Option<u32>,
    pub pid: Option<u32>,
    /// The provider a provider action's event concerns (`provider_outage`, the provider-link
    /// actions), so that steps on different providers that overlap pair their starts and ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<mock_providers::ledger::Provider>,
    pub detail: String,
}

/// A stack process the harness started, and how it ended.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ProcessRecord {
    pub role: Role,
    /// Worker slot (1-based); a restart reuses the slot with a new `worker_id`.
    pub slot: Option<u32>,
    pub worker_id: Option<String>,
    pub pid: u32,
    pub started_ns: u64,
    pub exited_ns: Option<u64>,
    /// Exit code when it exited normally.
    pub exit_code: Option<i32>,
    /// Signal that ended it, when one did.
    pub signal: Option<i32>,
    /// When the harness sent SIGTERM (graceful stop), if it did.
    pub sigterm_ns: Option<u64>,
    /// The harness had to SIGKILL it after the grace period.
    pub killed_after_grace: bool,
    pub log: String,
    /// It exited before the harness asked it to stop (no signal from the harness, not during
    /// teardown): a crash, whatever its exit status. `migrate` is expected to exit and never is.
    #[serde(default)]
    pub exited_unasked: bool,
    /// The last lines of its log, kept for a process that exited unasked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_tail: Option<String>,
    /// Its peak resident memory (`VmHWM`, KiB) as last read: every half second while it runs and
    /// just before each signal the harness sends it. The process alone, not what it forked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_kib: Option<u64>,
}

/// Whether the run settled before its deadline.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Quiescence {
    pub reached: bool,
    pub at_ns: u64,
    /// Deliveries still without a final outcome at the deadline (`recipient/channel`).
    pub open: Vec<String>,
    /// Of `open`, the `submitted` rows on a channel with delivery reports when the fakes had no
    /// report left to send them (delivered, or given up after its retries): open only because
    /// the stack never applied a report, which `callbacks` judges.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting_report: Vec<String>,
    /// How long after `expect.quiescence` the run settled or gave up: past the deadline it waits
    /// on while deliveries keep settling (at most twice the deadline more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub past_deadline_ms: Option<u64>,
    /// The deadline the wait applied, from its start, when the fakes' own delivery reports were
    /// planned, or a chaos action ran, later than `expect.quiescence` allows for: it counts from
    /// the last of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Not reached, and deliveries were still settling when the wait ended at its hard deadline
    /// (three times `expect.quiescence`): a slow stack the run did not see finish, not a stuck
    /// one. What is still open is then unjudged (`insufficient`), not lost.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub still_settling: bool,
    /// Callbacks the providers still had due.
    pub callbacks_pending: usize,
    /// Why the harness stopped waiting before the deadline (a crash left nothing that could make
    /// progress), when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_early: Option<String>,
}

/// Everything a checker may look at.
pub struct Input<'a> {
    pub scenario: &'a Scenario,
    pub expected: &'a [Expected],
    /// The ledger as the checkers read it ([`Entry`]), in `seq` order.
    pub ledger: &'a [Entry],
    /// Ledger `seq` → pid of the process that sent the request (from /proc socket ownership).
    pub pids: &'a Pids,
    /// `None` when the stack does not expose a status API.
    pub status: Option<&'a [StatusDelivery]>,
    pub timeline: &'a [TimelineEvent],
    pub processes: &'a [ProcessRecord],
    /// Enqueue request latencies in microseconds.
    pub enqueue_us: &'a hdrhistogram::Histogram<u64>,
    /// Every batch's (and trickle order's) enqueue request, on the ledger clock.
    pub batches: &'a [crate::report::BatchEnqueue],
    /// The batches the load POSTed again, and the answers.
    pub repeats: &'a [crate::report::RepeatRecord],
    /// The load's failed enqueue attempts and the batches never accepted (their deliveries are
    /// not in `expected`).
    pub enqueue_failures: &'a crate::report::EnqueueFailures,
    pub quiescence: &'a Quiescence,
    /// Batches the stack accepted and its status API later answered 404 for.
    pub lost_batches: &'a [LostBatch],
    /// What the status API's requests came to: the answers that were not the contract's.
    pub status_answers: &'a StatusAnswers,
    /// When the machine stopped running processes on time ([`crate::stalls`]): time allowances
    /// grow by the stalls inside the window they judge.
    pub stalls: &'a [crate::stalls::Stall],
    /// When the machine's wall clock, by which the stack times its leases and backoffs, jumped
    /// against the ledger clock ([`crate::jumps`]).
    pub clock_jumps: &'a [crate::jumps::ClockJump],
    /// The ledger's send attempts by delivery ([`Input::sends`]); `Default::default()`.
    pub(crate) sends: std::sync::OnceLock<common::Sends<'a>>,
    /// The status API rows by delivery ([`Input::status_row`]); `Default::default()`.
    pub(crate) status_rows: std::sync::OnceLock<common::StatusIndex<'a>>,
    /// How long the stack's workers took to boot ([`Input::worker_boot_ns`]);
    /// `Default::default()`.
    pub(crate) worker_boot: std::sync::OnceLock<u64>,
    /// The channels the chaos left without a sender ([`Input::orphans`]); `Default::default()`.
    pub(crate) orphans: std::sync::OnceLock<orphans::Orphans>,
}

impl<'a> Input<'a> {
    /// The ledger's send attempts grouped by delivery: indexed once, on the first checker's
    /// asking, and shared by every checker that reads them (six do; a big run's index is tens
    /// of megabytes and seconds to build).
    pub fn sends(&self) -> &common::Sends<'a> {
        self.sends.get_or_init(|| common::Sends::new(self.ledger))
    }

    /// The status API's row for `e`, indexed once on the first asking and shared by the checkers
    /// that read it (`no_loss`, `agreement`, `recovery`); `None` without a status API or a row.
    pub fn status_row(&self, e: &Expected) -> Option<&'a StatusDelivery> {
        let rows = self.status?;
        let index = self.status_rows.get_or_init(|| common::status_index(rows));
        common::status_row(index, e)
    }

    /// How long this stack's workers take from their start to their first provider request, as
    /// the run measured it before any chaos ([`availability::measure_boot`]); measured once.
    pub fn worker_boot_ns(&self) -> u64 {
        *self
            .worker_boot
            .get_or_init(|| availability::measure_boot(self))
    }

    /// The channels the chaos left with no worker that had sent them ([`orphans::Orphans`]),
    /// found once and shared by `no_loss`, `quiescence` and `recovery`.
    pub fn orphans(&self) -> &orphans::Orphans {
        self.orphans.get_or_init(|| orphans::Orphans::of(self))
    }
}

/// How the status API answered over the run, beside the rows it gave (`agreement`'s
/// `status_unreadable`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatusAnswers {
    /// Requests the harness made.
    pub requests: u64,
    /// Answers it could use: the contract's answer, or a 404 / 405 / 501.
    pub readable: u64,
    /// 2xx answers that were not the contract's (not JSON, not its shape, too long).
    pub unreadable: u64,
    /// The first [`StatusAnswers::KEPT`] of those.
    pub examples: Vec<UnreadableStatus>,
    /// Why the last request that got no answer to use failed (timed out, reset, a 5xx).
    pub last_failure: Option<String>,
}

impl StatusAnswers {
    /// Unreadable answers kept as counterexamples.
    pub const KEPT: usize = 10;
}

/// A 2xx answer of the status API that is not the contract's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct UnreadableStatus {
    pub batch_id: String,
    /// When the answer came, on the ledger clock.
    pub at_ns: u64,
    pub http_status: u16,
    /// What is wrong with it (the JSON error with its line and column, or its length).
    pub error: String,
    /// Its first bytes, as text.
    pub body_head: String,
}

/// A batch the stack accepted (202/200) that its status API later said it did not know (404),
/// after the API had answered for the first batch (so it has one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LostBatch {
    pub batch_id: String,
    /// When the harness first got the 404, on the ledger clock.
    pub first_missing_ns: u64,
}

/// A checker's status. `Insufficient` sits between holds and violated: nothing was found, but a
/// rule that applied to this run judged fewer items than it needs, so "holds" would be a guess.
/// It is never a pass (see [`crate::verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Holds,
    Insufficient,
    Violated,
    NotChecked,
}

impl Status {
    /// As written in `report.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Holds => "holds",
            Status::Insufficient => "insufficient",
            Status::Violated => "violated",
            Status::NotChecked => "not_checked",
        }
    }
}

/// How many items one rule judged, and how many it needs (`report.json` `checks[].judged`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Population {
    /// Items the rule judged (deliveries, callbacks, processes, sends…).
    pub judged: u64,
    /// The fewest it needs for a verdict (1 unless the rule or `[expect] min_judged` says more).
    pub min: u64,
    /// Items the rule should have judged but could not (a report matching no status row, a
    /// report the stack never acknowledged), and the largest share of them it tolerates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unjudged: Option<Unjudged>,
}

/// Items a rule could not judge, and why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Unjudged {
    /// Items it looked at (judged or not).
    pub of: u64,
    /// Of those, the ones it could not judge.
    pub count: u64,
    /// The largest share `count / of` the rule tolerates before it is insufficient.
    pub max_share: f64,
    /// Why they could not be judged ("sends with no known sender pid").
    pub why: String,
}

impl Population {
    /// Why this population is too small for a verdict, if it is.
    pub fn shortfall(&self, rule: &str) -> Option<String> {
        if self.judged < self.min {
            return Some(format!(
                "{rule} judged {} of the {} it needs",
                self.judged, self.min
            ));
        }
        let u = self.unjudged.as_ref()?;
        let share = u.count as f64 / u.of.max(1) as f64;
        (u.count > 0 && share > u.max_share).then(|| {
            format!(
                "{rule} could not judge {} of {} ({:.1}% > {:.1}%): {}",
                u.count,
                u.of,
                share * 100.0,
                u.max_share * 100.0,
                u.why
            )
        })
    }
}

/// A checker's answer.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Verdict {
    /// Stable name: `exactly_once`, `no_loss`, `retry_discipline`, `immutable_payload`,
    /// `callbacks`, `agreement`, `graceful_shutdown`, `recovery`, `idempotent_enqueue`,
    /// `responsiveness`, `fairness`, `quiescence`, `crashes`.
    pub checker: String,
    pub status: Status,
    /// One line a person reads first ("6000 deliveries, 0 duplicates").
    pub summary: String,
    /// Concrete cases that break the invariant (at most a few dozen; `total_counterexamples` says
    /// how many there were).
    pub counterexamples: Vec<serde_json::Value>,
    pub total_counterexamples: usize,
    /// Figures the checker computed (counts by outcome, percentiles…).
    #[serde(default)]
    pub figures: serde_json::Map<String, serde_json::Value>,
    /// Per rule that applied to this run: how many items it judged and the minimum it needs.
    /// A rule judging fewer makes the verdict `insufficient` (unless something is violated).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub judged: BTreeMap<String, Population>,
    /// The rule whose population `[expect] min_judged` sets a minimum for (the checker's main
    /// one: delivered reports for `callbacks`, deliveries for `no_loss`…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_rule: Option<String>,
    /// Counterexamples found per rule (all of them, not only those kept): a count per broken
    /// rule, so one rule broken a thousand times cannot hide another broken once.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub violations_by_rule: BTreeMap<String, usize>,
}

impl Verdict {
    /// Why the verdict is `insufficient`: every population short of its minimum.
    pub fn shortfalls(&self) -> Vec<String> {
        self.judged
            .iter()
            .filter_map(|(rule, p)| p.shortfall(rule))
            .collect()
    }

    /// Raises the minimum of the checker's main population to `min` (`[expect] min_judged`),
    /// and turns a `holds` that no longer has enough into `insufficient`.
    pub fn require(&mut self, min: u64) {
        let main = self.main_rule.as_ref().and_then(|r| self.judged.get_mut(r));
        let Some(main) = main else {
            if self.status == Status::Holds && min > 0 {
                self.status = Status::Insufficient;
                self.summary
                    .push_str(&format!(" — insufficient: judged nothing, needs {min}"));
            }
            return;
        };
        main.min = main.min.max(min);
        common::settle(self);
    }
}

/// Runs every checker, in report order. A checker switched off in `[expect]` is `NotChecked`
/// with reason "disabled in [expect]"; idempotent_enqueue, responsiveness, fairness,
/// quiescence and crashes have no switch (each is "not checked" when its load is absent). A checker that ran
/// is held to `[expect] min_judged` on top of its own minimums.
pub fn run_all(input: &Input) -> Vec<Verdict> {
    run_all_then(input, || {})
}

/// [`run_all`], calling `after_each` once each checker has returned (and freed what it built):
/// the run gives that memory back there (`malloc::trim`), so that one checker's indexes are not
/// still resident under the next one's.
pub fn run_all_then(input: &Input, mut after_each: impl FnMut()) -> Vec<Verdict> {
    let e = &input.scenario.expect;
    type Checker = fn(&Input) -> Verdict;
    let checkers: [(bool, &str, Checker); 14] = [
        (e.exactly_once, exactly_once::NAME, exactly_once::check),
        (e.no_loss, no_loss::NAME, no_loss::check),
        (
            e.retry_discipline,
            retry_discipline::NAME,
            retry_discipline::check,
        ),
        (
            e.immutable_payload,
            immutable_payload::NAME,
            immutable_payload::check,
        ),
        (e.immutable_payload, headers::NAME, headers::check),
        (e.callbacks, callbacks::NAME, callbacks::check),
        (e.agreement, agreement::NAME, agreement::check),
        (
            e.graceful_shutdown,
            graceful_shutdown::NAME,
            graceful_shutdown::check,
        ),
        (e.recovery, recovery::NAME, recovery::check),
        // Not switchable in `[expect]`.
        (true, idempotent_enqueue::NAME, idempotent_enqueue::check),
        (true, responsiveness::NAME, responsiveness::check),
        (true, fairness::NAME, fairness::check),
        (true, quiescence::NAME, quiescence::check),
        (true, crashes::NAME, crashes::check),
    ];
    let mut out: Vec<Verdict> = checkers
        .into_iter()
        .map(|(on, name, check)| {
            let verdict = if on {
                check(input)
            } else {
                common::not_checked(name, "disabled in [expect]")
            };
            after_each();
            verdict
        })
        .collect();
    for v in out.iter_mut().filter(|v| v.status != Status::NotChecked) {
        if let Some(min) = e.min_judged.get(v.checker.as_str()) {
            v.require(*min);
        }
    }
    out
}

/// Every checker's name, in report order (`[expect] min_judged` keys).
pub const NAMES: [&str; 10] = [
    exactly_once::NAME,
    no_loss::NAME,
    retry_discipline::NAME,
    immutable_payload::NAME,
    callbacks::NAME,
    graceful_shutdown::NAME,
    recovery::NAME,
    responsiveness::NAME,
    quiescence::NAME,
    crashes::NAME,
];

#[cfg(test)]
mod tests {
    use mock_providers::ledger::CallbackVariant::Genuine;
    use mock_providers::ledger::Outcome::*;

    use super::testkit::*;
    use super::*;
    use crate::scenario::Channel::*;

    /// A small run where everything went right: no checker may cry wolf.
    fn healthy() -> World {
        let mut w = World::new();
        w.worker(7, 0, Some(3_000)).sigterm_ns = Some(ns(2_900));
        w.worker(8, 0, None);
        w.event(EventKind::Sigkill, Some(8), 2_000);
        for (i, ch) in [Line, Email, Sms].into_iter().enumerate() {
            let r = format!("r{i}");
            let a = w.expect(&r, ch);
            w.send(ch, &a, Transient, 0).pid(7);
            w.send(ch, &a, Accepted, 200)
                .pid(8)
                .message_id(&format!("m{i}"));
            let path: &[&str] = if ch == Line {
                &["sending", "delivered"]
            } else {
                &["sending", "submitted", "delivered@callback"]
            };
            w.status_row(&r, ch, Some(&format!("m{i}")), path);
            if ch != Line {
                w.callback(
                    ch,
                    &a,
                    &format!("m{i}"),
                    "delivered",
                    Genuine,
                    Some(200),
                    400,
                );
            }
        }
        // A LINE message in flight when worker 8 was killed, retried by worker 7 after the lease.
        let a = w.expect("r9", Line);
        w.send(Line, &a, Transient, 1_990).pid(8);
        w.send(Line, &a, Accepted, 2_600).pid(7).message_id("m9");
        w.status_row("r9", Line, Some("m9"), &["sending", "delivered"]);
        // A p99 needs 100 enqueues (a steady trickle of small orders gives them).
        w.enqueue_us.record_n(12_000, 100).unwrap();
        w.scenario.expect.enqueue_p99 = Some(std::time::Duration::from_millis(100));
        w
    }

    #[test]
    fn a_healthy_run_holds_everywhere() {
        let w = healthy();
        let verdicts = run_all(&w.input());
        let names: Vec<_> = verdicts.iter().map(|v| v.checker.as_str()).collect();
        assert_eq!(
            names,
            [
                "exactly_once",
                "no_loss",
                "retry_discipline",
                "immutable_payload",
                "headers",
                "callbacks",
                "agreement",
                "graceful_shutdown",
                "recovery",
                "idempotent_enqueue",
                "responsiveness",
                "fairness",
                "quiescence",
                "crashes"
            ]
        );
        for v in &verdicts {
            // Fairness times the trickle's orders, and this run has none.
            let want = if v.checker == fairness::NAME {
                Status::NotChecked
            } else {
                Status::Holds
            };
            assert_eq!(v.status, want, "{v:#?}");
            serde_json::to_string(v).expect("verdicts serialize");
            // Every checker says what it judged: a holds with no population is a guess.
            assert!(
                want == Status::NotChecked || v.judged.values().any(|p| p.judged > 0),
                "{} declares no judged population",
                v.checker
            );
        }
    }

    #[test]
    fn min_judged_in_the_scenario_raises_the_main_population() {
        let mut w = healthy();
        w.scenario
            .expect
            .min_judged
            .insert(callbacks::NAME.into(), 100);
        let verdicts = run_all(&w.input());
        let v = verdicts.iter().find(|v| v.checker == "callbacks").unwrap();
        assert_eq!(v.status, Status::Insufficient, "{v:#?}");
        assert!(
            v.summary.contains("judged 2 of the 100 it needs"),
            "{}",
            v.summary
        );
        w.scenario
            .expect
            .min_judged
            .insert(callbacks::NAME.into(), 2);
        let verdicts = run_all(&w.input());
        assert_eq!(verdicts[4].status, Status::Holds);
    }

    #[test]
    fn switched_off_checkers_are_not_checked() {
        let mut w = healthy();
        w.send(Line, &addr("r0", Line), Accepted, 900); // a duplicate nobody asked to check
        w.scenario.expect.exactly_once = false;
        w.scenario.expect.recovery = false;
        let verdicts = run_all(&w.input());
        for v in verdicts
            .iter()
            .filter(|v| ["exactly_once", "recovery"].contains(&v.checker.as_str()))
        {
            assert_eq!(
                (v.status, v.summary.as_str()),
                (Status::NotChecked, "disabled in [expect]")
            );
        }
        w.scenario.expect.exactly_once = true;
        let v = &run_all(&w.input())[0];
        assert_eq!(v.status, Status::Violated);
    }

    #[test]
    fn a_run_with_nothing_expected_judges_nothing() {
        let w = World::new();
        for v in run_all(&w.input()) {
            let want = match v.checker.as_str() {
                // Not provoked: no status API, no SIGTERM, no kill, no SLO, no repeat, no trickle.
                "callbacks" | "graceful_shutdown" | "recovery" | "responsiveness"
                | "idempotent_enqueue" | "fairness" => Status::NotChecked,
                _ => Status::Insufficient,
            };
            assert_eq!(v.status, want, "{v:#?}");
        }
    }

    /// A run of 100,000 recipients holds 300,000 expected deliveries and as many status rows,
    /// each with its transitions, for the whole run: a field that grows one of them costs tens
    /// of megabytes (issue 13).
    #[test]
    fn what_a_run_holds_per_delivery_stays_compact() {
        use std::mem::size_of;
        assert!(size_of::<Expected>() <= 48, "{}", size_of::<Expected>());
        assert!(
            size_of::<StatusDelivery>() <= 88,
            "{}",
            size_of::<StatusDelivery>()
        );
        assert!(
            size_of::<StatusTransition>() <= 16,
            "{}",
            size_of::<StatusTransition>()
        );
        assert!(size_of::<RowKey>() <= 16, "{}", size_of::<RowKey>());
    }

    /// A key of the contract's form keeps its batch id alone, the batch's one copy when the batch
    /// is known; any other key is kept as written; either reads back as the stack wrote it.
    #[test]
    fn a_rows_key_reads_back_as_written_and_holds_no_copy_of_its_own_when_it_can() {
        let wire = |key: &str, recipient: &str| -> StatusRowWire {
            serde_json::from_value(serde_json::json!({
                "key": key, "recipient": recipient, "channel": "sms", "state": "delivered"
            }))
            .unwrap()
        };
        let batch = Name::from("b7");
        // (key, recipient, kept as the batch id)
        let cases = [
            ("b7:r1:sms", "r1", true),
            ("b8:r1:sms", "r1", false),
            ("b7:r1:email", "r1", false),
            ("b7:r2:sms", "r1", false),
            ("b7r1:sms", "r1", false),
            ("b7:r1:sms:", "r1", false),
            ("b7:r1", "r1", false),
            ("b7:x:r1:sms", "r1", false),
            // Ids with `:` break the contract; such a key is kept as written.
            ("b7:r1:x:sms", "r1:x", false),
            ("", "r1", false),
            ("k", "r1", false),
        ];
        for (key, recipient, derived) in cases {
            let row = StatusDelivery::of(wire(key, recipient), &batch);
            assert_eq!(row.key(), key, "{key} for {recipient}");
            assert_eq!(matches!(row.key, RowKey::Batch(_)), derived, "{key}");
            if let RowKey::Batch(b) = &row.key {
                assert!(std::ptr::eq(b.as_str(), batch.as_str()), "the batch's copy");
            }
        }
    }
}
