//! The live [`Policy`]: seeded faults from the current profile, rejections written to the ledger.
//!
//! One per connection. It re-reads the shared config at the greeting and at every MAIL, so a
//! profile changed mid-run applies from the next transaction, never in the middle of one. It must
//! never write to the socket: it only decides and records.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use crate::config::{OutageMode, SmtpConfig, SmtpStage};
use crate::ledger::{Draft, EntryKind, Ledger, LedgerEntry, Outcome, Provider};

use super::plan::{self, outcome_of, Rcpt, GREETING_KEY};
use super::reply::Reply;
use super::session::{DataMode, Policy, Verdict};
use super::SmtpContext;

pub struct LivePolicy {
    pub(super) seed: u64,
    shared: Arc<RwLock<SmtpConfig>>,
    /// The profile as of the current transaction.
    pub(super) cfg: SmtpConfig,
    pub(super) ledger: Ledger,
    pub(super) peer: SocketAddr,
    /// When the current transaction's `MAIL FROM` arrived (ledger clock).
    pub(super) mail_ns: u64,
    /// Counts a send an outage answered or held.
    on_outage: Arc<dyn Fn() + Send + Sync>,
}

impl LivePolicy {
    pub fn new(ctx: &SmtpContext, peer: SocketAddr) -> LivePolicy {
        let mut p = LivePolicy {
            seed: ctx.seed,
            shared: ctx.config.clone(),
            cfg: SmtpConfig::default(),
            ledger: ctx.ledger.clone(),
            peer,
            mail_ns: 0,
            on_outage: ctx.on_outage.clone(),
        };
        p.refresh();
        p
    }

    fn refresh(&mut self) {
        // A poisoned lock only means a writer panicked mid-update; the value is still a config.
        self.cfg = match self.shared.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
    }

    /// A non-accepted send entry: `status` and `error` from the reply, arrival time now.
    pub(super) fn rejection(
        &self,
        recipient: &str,
        attempt: u32,
        outcome: Outcome,
        reply: &Reply,
        fault: Option<&str>,
        context: Option<&str>,
    ) -> Draft {
        let mut d = LedgerEntry::draft(Provider::Smtp, EntryKind::Send, recipient);
        d.received_ns = self.ledger.now_ns();
        d.attempt = attempt;
        d.outcome = outcome;
        d.status = reply.status();
        d.error = Some(match context {
            Some(c) => format!("{} [{c}]", reply.first_line()),
            None => reply.first_line(),
        });
        d.fault = fault.map(str::to_string);
        d.peer = Some(self.peer);
        d
    }

    /// The same rejection for every recipient of a transaction.
    pub(super) fn reject_all(
        &self,
        rcpts: &[Rcpt],
        outcome: Outcome,
        reply: &Reply,
        fault: Option<&str>,
    ) -> Vec<Draft> {
        rcpts
            .iter()
            .map(|r| self.rejection(&r.addr, r.attempt, outcome, reply, fault, None))
            .collect()
    }
}

impl LivePolicy {
    /// A recipient met during an outage: `421` and the connection closed (`unavailable`), or the
    /// RCPT never answered (`hang`; the entry is recorded when the client hangs up). Decided per
    /// recipient, the first moment the fake knows whom a transaction is for.
    fn outage(&mut self, to: &str, attempt: u32, mode: OutageMode) -> Verdict<Rcpt> {
        (self.on_outage)();
        let reply = Reply::new(
            421,
            "4.3.2",
            "service not available, closing transmission channel",
        );
        let label = mode.label_for(Provider::Smtp);
        let mut d = self.rejection(to, attempt, Outcome::Transient, &reply, Some(label), None);
        let hold = mode == OutageMode::Hang;
        if hold {
            d.status = crate::outage::NO_ANSWER.into();
            d.error = Some("RCPT never answered (outage)".into());
        }
        Verdict {
            delay: std::time::Duration::ZERO,
            result: Err(reply),
            records: vec![d],
            hold,
        }
    }
}

/// Entries of injected faults ride on the [`Verdict`] and are recorded by the driver after the
/// stage latency, just before the reply, like every other provider's entries.
impl Policy for LivePolicy {
    fn greeting(&mut self) -> Verdict<()> {
        let n = self.ledger.next_attempt(Provider::Smtp, GREETING_KEY);
        let delay = plan::delay(self.seed, &self.cfg, SmtpStage::Greeting, GREETING_KEY, n);
        let fault = plan::stage_fault(self.seed, &self.cfg, SmtpStage::Greeting, GREETING_KEY, n);
        let mut records = Vec::new();
        let result = match fault {
            None => Ok(()),
            Some(f) => {
                records.push(self.rejection("", n, f.outcome(), &f.reply, Some(&f.label), None));
                Err(f.reply)
            }
        };
        Verdict {
            delay,
            result,
            records,
            hold: false,
        }
    }

    fn max_size(&self) -> usize {
        self.cfg.max_size
    }

    fn mail(&mut self, from: &str) -> Verdict<()> {
        self.mail_ns = self.ledger.now_ns();
        self.refresh();
        let key = plan::mail_key(from);
        let n = self.ledger.next_attempt(Provider::Smtp, &key);
        let delay = plan::delay(self.seed, &self.cfg, SmtpStage::Mail, &key, n);
        let mut records = Vec::new();
        let result = match plan::stage_fault(self.seed, &self.cfg, SmtpStage::Mail, &key, n) {
            None => Ok(()),
            Some(f) => {
                let ctx = format!("MAIL FROM:<{from}>");
                let label = Some(f.label.as_str());
                records.push(self.rejection("", n, f.outcome(), &f.reply, label, Some(&ctx)));
                Err(f.reply)
            }
        };
        Verdict {
            delay,
            result,
            records,
            hold: false,
        }
    }

    fn rcpt(&mut self, _from: &str, to: &str) -> Verdict<Rcpt> {
        let attempt = self.ledger.next_attempt(Provider::Smtp, to);
        if let Some(outage) = self.cfg.outage {
            return self.outage(to, attempt, outage.mode);
        }
        let delay = plan::delay(self.seed, &self.cfg, SmtpStage::Rcpt, to, attempt);
        let mut records = Vec::new();
        let result = match plan::plan_recipient(self.seed, &self.cfg, to, attempt) {
            Ok(plan) => Ok(Rcpt {
                addr: to.to_string(),
                attempt,
                plan,
            }),
            Err(f) => {
                let label = Some(f.label.as_str());
                records.push(self.rejection(to, attempt, f.outcome(), &f.reply, label, None));
                Err(f.reply)
            }
        };
        Verdict {
            delay,
            result,
            records,
            hold: false,
        }
    }

    /// One decision for the whole transaction ([`plan::transaction_plan`]): a DATA fault before
    /// a mid-DATA drop.
    fn data(&mut self, _from: &str, rcpts: &[Rcpt]) -> Verdict<DataMode> {
        let (subject, attempt) = plan::transaction_key(rcpts);
        let delay = plan::delay(self.seed, &self.cfg, SmtpStage::Data, &subject, attempt);
        let tx = plan::transaction_plan(self.seed, &self.cfg, rcpts);
        let mut records = Vec::new();
        let result = if let Some(f) = &tx.data {
            records = self.reject_all(rcpts, f.outcome(), &f.reply, Some(&f.label));
            Err(f.reply.clone())
        } else if tx.drop_mid_data {
            Ok(DataMode::DropMidway)
        } else {
            Ok(DataMode::Receive)
        };
        Verdict {
            delay,
            result,
            records,
            hold: false,
        }
    }

    fn rejected(&mut self, reply: &Reply, command: &str) {
        let d = self.rejection("", 0, outcome_of(reply), reply, None, Some(command));
        self.ledger.record(d);
    }

    fn protocol_error(&mut self, reply: &Reply, command: &str) {
        let d = self.rejection("", 0, Outcome::ProtocolError, reply, None, Some(command));
        self.ledger.record(d);
    }
}
