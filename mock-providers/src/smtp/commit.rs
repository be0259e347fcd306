//! The end of a transaction: commit accepted messages to the ledger or record why not.
//!
//! Decisions only; the connection driver waits the commit latency, records the entries, runs the
//! `before_response` hooks and writes the reply, in that order, so an Accepted entry is in the
//! ledger before any reply is written and the ledger never under-reports a send. This module
//! must never write to the socket.
//!
//! A transaction has several recipients but a single reply, so the end of DATA is decided once
//! for the transaction ([`plan::transaction_plan`]: the recipient's own plan when there is one,
//! one draw for the recipient set otherwise), and each recipient gets its own ledger entry with
//! its own attempt number carrying that decision.

use std::time::Duration;

use crate::config::SmtpStage;
use crate::http::sha256_hex;
use crate::ledger::{Draft, EmailDetail, EntryKind, LedgerEntry, Outcome, Provider};
use crate::link::LinkFault;

use super::data::DataProblem;
use super::mime;
use super::plan;
use super::policy::LivePolicy;
use super::reply::Reply;
use super::session::Envelope;

/// `status` of entries whose connection was dropped without a reply.
pub const DROPPED: &str = "dropped";

/// What to do after the terminating dot: wait `delay`, record `records` (stamped then, just
/// before the reply), and if `accepted` run the `before_response` hooks for each recorded
/// entry; then write `reply`, or close without it if `drop` (accept-then-drop); then, if
/// `accepted`, call `on_commit` for each entry.
#[derive(Debug)]
pub struct EndOfData {
    pub delay: Duration,
    pub records: Vec<Draft>,
    pub reply: Reply,
    pub accepted: bool,
    pub drop: bool,
}

impl LivePolicy {
    /// Records the Transient `drop_mid_data` entries of a transaction dropped inside DATA.
    pub fn record_drop_mid_data(&self, env: &Envelope) {
        for r in &env.rcpts {
            let mut d = LedgerEntry::draft(Provider::Smtp, EntryKind::Send, r.addr.clone());
            d.attempt = r.attempt;
            d.outcome = Outcome::Transient;
            d.status = DROPPED.into();
            d.error = Some("connection dropped in the middle of DATA (injected)".into());
            d.fault = Some("drop_mid_data".into());
            d.peer = Some(self.peer);
            self.ledger.record(d);
        }
    }

    /// Records the Transient entries of a transaction whose final dot arrived at `received_ns`
    /// and that a link fault kept from the provider (`fault`: a refuse, or a partition its sender
    /// hung up on, [`crate::link`]): nothing was sent.
    pub fn record_not_served(&self, env: &Envelope, received_ns: u64, fault: LinkFault) {
        for r in &env.rcpts {
            let mut d = LedgerEntry::draft(Provider::Smtp, EntryKind::Send, r.addr.clone());
            d.attempt = r.attempt;
            d.received_ns = received_ns;
            d.started_ns = Some(self.mail_ns);
            d.peer = Some(self.peer);
            crate::link::mark_not_served(&mut d, fault);
            self.ledger.record(d);
        }
    }

    /// Decides the outcome of a fully received message whose final dot arrived at
    /// `received_ns` (ledger clock).
    pub fn end_of_data(
        &self,
        env: &Envelope,
        data: Result<Vec<u8>, DataProblem>,
        received_ns: u64,
    ) -> EndOfData {
        let (subject, attempt) = plan::transaction_key(&env.rcpts);
        let delay = plan::delay(self.seed, &self.cfg, SmtpStage::DataEnd, &subject, attempt);
        let tx = plan::transaction_plan(self.seed, &self.cfg, &env.rcpts);
        let reject = |reply: Reply, outcome, fault: Option<&str>| {
            let mut records = self.reject_all(&env.rcpts, outcome, &reply, fault);
            for d in &mut records {
                d.received_ns = received_ns;
                d.started_ns = Some(self.mail_ns);
            }
            EndOfData {
                delay,
                records,
                reply,
                accepted: false,
                drop: false,
            }
        };
        let raw = match data {
            Ok(raw) => raw,
            Err(DataProblem::TooBig) => {
                let text = "message size exceeds fixed maximum message size";
                return reject(Reply::new(552, "5.3.4", text), Outcome::Permanent, None);
            }
            Err(DataProblem::LineTooLong) => {
                let reply = Reply::syntax("line too long in message (over 1000 octets)");
                return reject(reply, Outcome::ProtocolError, None);
            }
        };
        if let Some(f) = &tx.data_end {
            return reject(f.reply.clone(), f.outcome(), Some(&f.label));
        }
        let drop = tx.accept_then_drop;
        let msg = mime::parse(&raw);
        let hash = msg.payload_hash();
        let (_, body) = mime::split(&raw);
        let detail = EmailDetail {
            mail_from: env.from.clone(),
            rcpt_to: env.rcpts.iter().map(|r| r.addr.clone()).collect(),
            headers: msg.headers.clone(),
            size: raw.len() as u64,
            sha256: sha256_hex(&raw),
            body_sha256: sha256_hex(body),
        };
        // A message without Message-ID gets one, as real MTAs do; it is then not an
        // idempotency key the sender could know.
        let message_id = msg.message_id.clone().unwrap_or_else(|| {
            format!(
                "{}@mock-smtp.ting-chaos.test",
                uuid::Uuid::new_v4().simple()
            )
        });
        let reply = Reply::ok(format!("OK queued as {message_id}"));
        let records = env
            .rcpts
            .iter()
            .map(|r| {
                let mut d = LedgerEntry::draft(Provider::Smtp, EntryKind::Send, r.addr.clone());
                d.received_ns = received_ns;
                d.started_ns = Some(self.mail_ns);
                d.attempt = r.attempt;
                d.outcome = Outcome::Accepted;
                d.status = if drop { DROPPED.into() } else { reply.status() };
                d.fault = drop.then(|| "accept_then_drop".to_string());
                d.idempotency_key = msg.message_id.clone();
                d.message_id = Some(message_id.clone());
                d.payload_hash = Some(hash.clone());
                d.subject = msg.subject.clone();
                d.body = msg.text.clone();
                d.html = msg.html.clone();
                d.peer = Some(self.peer);
                // Send entries have no callback of their own: carry the per-message events URL.
                d.callback_url = msg.events_url.clone();
                d.email = Some(Box::new(detail.clone()));
                d
            })
            .collect();
        EndOfData {
            delay,
            records,
            reply,
            accepted: true,
            drop,
        }
    }
}
