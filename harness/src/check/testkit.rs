//! Test-only builder of synthetic checker inputs: a scenario, expected deliveries, ledger
//! entries, status rows, timeline events and process records, each in one terse call.
//!
//! Times are given in milliseconds on the ledger clock. Compiled for tests only; a checker must
//! never depend on it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use hdrhistogram::Histogram;
use mock_providers::ledger::{CallbackVariant, EntryKind, LedgerEntry, Outcome, Provider};

use super::*;
pub use super::{EventKind, Role};
use crate::scenario::{self, Channel, Scenario};

/// The scenario every test starts from; tests tweak `w.scenario` fields directly.
pub const BASE: &str = r#"
name = "checker-test"

[load]
recipients = 10
channels = ["line", "email", "sms"]

[stack]
workers = 2
max_attempts = 4
lease = "1s"
heartbeat = "200ms"
shutdown_grace = "2s"

[stack.backoff]
base = "100ms"
factor = 2.0
max = "1s"
jitter = 0.2

[expect]
min_retry_gap = "80ms"
recovery_slack = "500ms"
retry_cap_slack = "2s"
"#;

pub const LATENCY_MS: u64 = 5;

pub fn ns(ms: u64) -> u64 {
    ms * 1_000_000
}

/// Wall-clock time (RFC 3339, milliseconds) of `ms` on the ledger clock: the ledger starts at
/// 2026-01-01T00:00:00Z.
pub fn wall(ms: u64) -> String {
    const START_MS: i64 = 1_767_225_600_000;
    chrono::DateTime::from_timestamp_millis(START_MS + ms as i64)
        .expect("in range")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The address a test recipient has on `channel`.
pub fn addr(recipient: &str, channel: Channel) -> String {
    match channel {
        Channel::Line => format!("U{recipient}"),
        Channel::Email => format!("{recipient}@example.test"),
        Channel::Sms => format!("+1555{}", recipient.trim_start_matches('r')),
    }
}

pub struct World {
    pub scenario: Scenario,
    pub expected: Vec<Expected>,
    /// Shared as the run's frozen ledger is; [`World::entry_mut`] tweaks one in place.
    pub ledger: Vec<Arc<LedgerEntry>>,
    pub pids: Pids,
    pub status: Option<Vec<StatusDelivery>>,
    pub timeline: Vec<TimelineEvent>,
    pub processes: Vec<ProcessRecord>,
    pub enqueue_us: Histogram<u64>,
    pub batches: Vec<crate::report::BatchEnqueue>,
    pub repeats: Vec<crate::report::RepeatRecord>,
    pub enqueue_failures: crate::report::EnqueueFailures,
    pub quiescence: Quiescence,
    pub lost_batches: Vec<crate::check::LostBatch>,
    pub status_answers: crate::check::StatusAnswers,
    pub stalls: Vec<crate::stalls::Stall>,
    pub clock_jumps: Vec<crate::jumps::ClockJump>,
    attempts: HashMap<(Provider, String), u32>,
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

impl World {
    pub fn new() -> World {
        World {
            scenario: scenario::parse(Path::new("t.toml"), BASE).expect("test scenario is valid"),
            expected: Vec::new(),
            ledger: Vec::new(),
            pids: Pids::default(),
            status: None,
            timeline: Vec::new(),
            processes: Vec::new(),
            enqueue_us: Histogram::new(3).expect("histogram"),
            batches: Vec::new(),
            repeats: Vec::new(),
            enqueue_failures: Default::default(),
            quiescence: Quiescence {
                reached: true,
                at_ns: 0,
                open: Vec::new(),
                awaiting_report: Vec::new(),
                past_deadline_ms: None,
                deadline_ms: None,
                still_settling: false,
                callbacks_pending: 0,
                stopped_early: None,
            },
            lost_batches: Vec::new(),
            status_answers: Default::default(),
            stalls: Vec::new(),
            clock_jumps: Vec::new(),
            attempts: HashMap::new(),
        }
    }

    /// Expects a delivery to `recipient` on `channel`; returns its address.
    pub fn expect(&mut self, recipient: &str, channel: Channel) -> String {
        self.expect_in(recipient, channel, "b0")
    }

    /// [`World::expect`] in batch `batch_id`.
    pub fn expect_in(&mut self, recipient: &str, channel: Channel, batch_id: &str) -> String {
        let address = addr(recipient, channel);
        self.expected.push(Expected {
            recipient: recipient.into(),
            channel,
            address: address.as_str().into(),
            bad: false,
            tricky_name: None,
            batch_id: batch_id.into(),
            template_edited: false,
        });
        address
    }

    /// Batch `batch_id` was POSTed at `at_ms` and answered 5 ms later; `trickle`: one of the
    /// trickle's orders.
    pub fn enqueued(&mut self, batch_id: &str, at_ms: u64, trickle: bool) {
        self.batches.push(crate::report::BatchEnqueue {
            batch_id: batch_id.into(),
            sent_ns: ns(at_ms),
            acked_ns: ns(at_ms + 5),
            trickle,
            latency_us: 5_000,
        });
    }

    /// Records a send attempt arriving at `at_ms`, answered [`LATENCY_MS`] later, from pid 100.
    pub fn send(
        &mut self,
        channel: Channel,
        address: &str,
        outcome: Outcome,
        at_ms: u64,
    ) -> SendMut<'_> {
        let provider = channel.provider();
        let n = self
            .attempts
            .entry((provider, address.to_string()))
            .or_insert(0);
        *n += 1;
        let mut e = LedgerEntry::draft(provider, EntryKind::Send, address);
        e.seq = self.ledger.len() as u64;
        e.received_ns = ns(at_ms);
        e.mono_ns = ns(at_ms + LATENCY_MS);
        e.wall = wall(at_ms + LATENCY_MS);
        e.attempt = *n;
        e.outcome = outcome;
        e.payload_hash = Some(format!("h-{address}"));
        if outcome == Outcome::Accepted {
            e.message_id = Some(format!("m-{address}-{n}"));
        }
        self.pids.insert(e.seq, 100);
        self.ledger.push(Arc::new(e));
        let i = self.ledger.len() - 1;
        SendMut {
            entry: Arc::make_mut(&mut self.ledger[i]),
            pids: &mut self.pids,
        }
    }

    /// Records a callback about `message_id` at `at_ms`, answered `response` by the stack.
    pub fn callback(
        &mut self,
        channel: Channel,
        address: &str,
        message_id: &str,
        status: &str,
        variant: CallbackVariant,
        response: Option<u16>,
        at_ms: u64,
    ) {
        let mut e = LedgerEntry::draft(channel.provider(), EntryKind::Callback, address);
        e.seq = self.ledger.len() as u64;
        e.received_ns = ns(at_ms);
        e.mono_ns = ns(at_ms);
        e.message_id = Some(message_id.into());
        e.callback_status = Some(status.into());
        e.callback_variant = Some(variant);
        e.callback_response = response;
        e.callback_try = Some(1);
        self.ledger.push(Arc::new(e));
    }

    /// Adds a status API row; `path` is the states it went through, all by `source` except
    /// the ones written `state@source`.
    pub fn status_row(
        &mut self,
        recipient: &str,
        channel: Channel,
        msg_id: Option<&str>,
        path: &[&str],
    ) {
        let mut transitions = Vec::new();
        let mut from: Option<State> = None;
        for step in path {
            let (to, source) = step.split_once('@').unwrap_or((step, "worker"));
            transitions.push(StatusTransition::new(
                from.clone(),
                to.into(),
                source.into(),
                None,
            ));
            from = Some(State::from(to));
        }
        self.status
            .get_or_insert_with(Vec::new)
            .push(StatusDelivery {
                key: RowKey::Batch("b0".into()),
                recipient: recipient.into(),
                channel,
                address: Some(addr(recipient, channel).into()),
                state: from.unwrap_or(State::Pending),
                attempts: 1,
                provider_message_id: msg_id.map(Into::into),
                last_error: None,
                transitions: transitions.into(),
            });
    }

    /// Adds a status API row whose transitions carry times: `steps` are (state, source, at ms),
    /// each from the state before it (the first from none).
    pub fn timed_row(&mut self, recipient: &str, channel: Channel, steps: &[(&str, &str, u64)]) {
        let mut from: Option<State> = None;
        let transitions: Box<[StatusTransition]> = steps
            .iter()
            .map(|(to, source, at)| {
                StatusTransition::new(
                    from.replace(State::from(*to)),
                    State::from(*to),
                    Source::from(*source),
                    Some(wall(*at).into()),
                )
            })
            .collect();
        self.status
            .get_or_insert_with(Vec::new)
            .push(StatusDelivery {
                key: RowKey::Batch("b0".into()),
                recipient: recipient.into(),
                channel,
                address: Some(addr(recipient, channel).into()),
                state: from.unwrap_or(State::Pending),
                attempts: 1,
                provider_message_id: None,
                last_error: None,
                transitions,
            });
    }

    pub fn event(&mut self, kind: EventKind, pid: Option<u32>, at_ms: u64) {
        self.timeline.push(TimelineEvent {
            mono_ns: ns(at_ms),
            kind,
            slot: None,
            pid,
            provider: None,
            detail: String::new(),
        });
    }

    /// An event of a provider action on `provider`.
    pub fn provider_event(
        &mut self,
        kind: EventKind,
        provider: mock_providers::ledger::Provider,
        pid: Option<u32>,
        at_ms: u64,
    ) {
        self.event(kind, pid, at_ms);
        if let Some(e) = self.timeline.last_mut() {
            e.provider = Some(provider);
        }
    }

    /// A worker process alive over [`started_ms`, `exited_ms`).
    pub fn worker(
        &mut self,
        pid: u32,
        started_ms: u64,
        exited_ms: Option<u64>,
    ) -> &mut ProcessRecord {
        self.processes.push(ProcessRecord {
            role: Role::Worker,
            slot: Some(self.processes.len() as u32 + 1),
            worker_id: None,
            pid,
            started_ns: ns(started_ms),
            exited_ns: exited_ms.map(ns),
            exit_code: exited_ms.map(|_| 0),
            signal: None,
            sigterm_ns: None,
            killed_after_grace: false,
            log: String::new(),
            exited_unasked: false,
            log_tail: None,
            peak_rss_kib: None,
        });
        self.processes.last_mut().expect("just pushed")
    }

    /// The wall clock jumped `by_ms` (negative: back) at `at_ms` on the ledger clock.
    pub fn clock_jump(&mut self, at_ms: u64, by_ms: i64) {
        let after = chrono::DateTime::parse_from_rfc3339(&wall(at_ms.saturating_add_signed(by_ms)))
            .map_or(0, |w| w.timestamp_millis());
        self.clock_jumps.push(crate::jumps::ClockJump {
            at_ns: ns(at_ms),
            by_ns: by_ms * 1_000_000,
            wall_ms: after,
        });
    }

    /// The `i`th ledger entry, to tweak in place.
    pub fn entry_mut(&mut self, i: usize) -> &mut LedgerEntry {
        Arc::make_mut(&mut self.ledger[i])
    }

    /// The ledger as a run's checkers get it: each entry as [`Entry::of`] keeps it, every HTML
    /// part kept. Leaked: a test's input lives as long as the test.
    pub fn entries(&self) -> &'static [Entry] {
        let names = crate::check::Interner::default();
        let keep = crate::check::Keep::AllHtml;
        let entries: Vec<Entry> = self
            .ledger
            .iter()
            .map(|e| Entry::of(e, &names, &keep))
            .collect();
        Box::leak(entries.into_boxed_slice())
    }

    pub fn input(&self) -> Input<'_> {
        Input {
            scenario: &self.scenario,
            expected: &self.expected,
            ledger: self.entries(),
            pids: &self.pids,
            status: self.status.as_deref(),
            timeline: &self.timeline,
            processes: &self.processes,
            enqueue_us: &self.enqueue_us,
            batches: &self.batches,
            repeats: &self.repeats,
            enqueue_failures: &self.enqueue_failures,
            quiescence: &self.quiescence,
            lost_batches: &self.lost_batches,
            status_answers: &self.status_answers,
            stalls: &self.stalls,
            clock_jumps: &self.clock_jumps,
            sends: Default::default(),
            status_rows: Default::default(),
            worker_boot: Default::default(),
            orphans: Default::default(),
        }
    }
}

/// Tweaks of the send just recorded.
pub struct SendMut<'a> {
    pub entry: &'a mut LedgerEntry,
    pids: &'a mut Pids,
}

impl SendMut<'_> {
    pub fn pid(self, pid: u32) -> Self {
        self.pids.insert(self.entry.seq, pid);
        self
    }

    pub fn hash(self, h: &str) -> Self {
        self.entry.payload_hash = Some(h.into());
        self
    }

    /// Answered `ms` after arrival instead of [`LATENCY_MS`].
    pub fn latency(self, ms: u64) -> Self {
        self.entry.mono_ns = self.entry.received_ns + ns(ms);
        self.entry.wall = wall(self.entry.mono_ns / 1_000_000);
        self
    }

    /// The provider's answer as recorded ("429", "503", "451 4.3.0").
    pub fn status(self, status: &str) -> Self {
        self.entry.status = status.into();
        self
    }

    pub fn retry_after(self, ms: u64) -> Self {
        self.entry.retry_after_ms = Some(ms);
        self
    }

    pub fn html(self, html: &str) -> Self {
        self.entry.html = Some(html.into());
        self
    }

    pub fn body(self, body: &str) -> Self {
        self.entry.body = Some(body.into());
        self
    }

    /// An e-mail as the SMTP fake keeps it: `subject` decoded, and an envelope and header
    /// section for the entry's recipient alone.
    pub fn subject(self, subject: &str) -> Self {
        let field = |name: &str, value: &str| mock_providers::ledger::HeaderField {
            name: name.into(),
            value: value.into(),
        };
        self.entry.subject = Some(subject.into());
        self.entry.email = Some(Box::new(mock_providers::ledger::EmailDetail {
            mail_from: "stack@example.test".into(),
            rcpt_to: vec![self.entry.recipient.clone()],
            headers: vec![
                field("From", "stack@example.test"),
                field("To", &self.entry.recipient),
                field("Subject", subject),
            ],
            size: 0,
            sha256: String::new(),
            body_sha256: String::new(),
        }));
        self
    }

    pub fn message_id(self, id: &str) -> Self {
        self.entry.message_id = Some(id.into());
        self
    }

    /// Sent from local TCP port `port` on 127.0.0.1.
    pub fn peer(self, port: u16) -> Self {
        self.entry.peer = Some(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        self
    }

    /// The fault the provider recorded (`outage_hang`, `http 503`).
    pub fn fault(self, fault: &str) -> Self {
        self.entry.fault = Some(fault.into());
        self
    }

    /// The sender hung up before the provider answered.
    pub fn hung_up(self) -> Self {
        self.entry.client_hung_up = true;
        self
    }

    /// Not attributed to any pid (the socket was gone when the provider recorded it).
    pub fn unattributed(self) -> Self {
        self.pids.remove(self.entry.seq);
        self
    }
}

/// The `rule` field of every counterexample, in order.
pub fn rules(v: &Verdict) -> Vec<String> {
    v.counterexamples
        .iter()
        .map(|c| c["rule"].as_str().unwrap_or("").to_string())
        .collect()
}
