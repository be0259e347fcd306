//! What the three fakes share: the seed, the ledger, each provider's live fault profile and the
//! callback dispatcher. The control API of any fake reaches all of it through here.
//!
//! The hub holds no request logic; it must never decide a fault.

use std::sync::{Arc, Mutex, RwLock};

use crate::callbacks::Dispatcher;
use crate::config::{LineConfig, ProvidersConfig, SmsConfig, SmtpConfig};
use crate::ledger::{Ledger, LedgerEntry};
use crate::live::Live;

type ResetFn = Box<dyn Fn() + Send + Sync>;

/// Shared state of one run of the fakes.
pub struct Hub {
    pub seed: u64,
    pub ledger: Ledger,
    pub line: Live<LineConfig>,
    pub sms: Live<SmsConfig>,
    /// The SMTP fake reads this per transaction (the interface agreed with `crate::smtp`).
    pub smtp: Arc<RwLock<SmtpConfig>>,
    pub callbacks: Dispatcher,
    resets: Mutex<Vec<ResetFn>>,
    /// Send requests an outage answered 503 or held, per provider (LINE, SMTP, SMS order).
    outage_hits: [std::sync::atomic::AtomicU64; 3],
    /// Link faults the harness has in force ([`Hub::arm_link_fault`]).
    link_faults: std::sync::atomic::AtomicUsize,
}

impl Hub {
    /// Builds the hub. Call it inside a tokio runtime (the dispatcher spawns on it).
    pub fn new(seed: u64, cfg: ProvidersConfig, ledger: Ledger) -> Arc<Hub> {
        Arc::new(Hub {
            seed,
            callbacks: Dispatcher::new(seed, ledger.clone()),
            ledger,
            line: Live::new(cfg.line),
            sms: Live::new(cfg.sms),
            smtp: Arc::new(RwLock::new(cfg.smtp)),
            resets: Mutex::new(Vec::new()),
            outage_hits: Default::default(),
            link_faults: Default::default(),
        })
    }

    pub fn smtp_config(&self) -> SmtpConfig {
        self.smtp.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The current profiles of all three providers.
    pub fn config(&self) -> ProvidersConfig {
        ProvidersConfig {
            line: (*self.line.get()).clone(),
            sms: (*self.sms.get()).clone(),
            smtp: self.smtp_config(),
        }
    }

    /// Replaces all three profiles; requests already in flight finish with the old one.
    pub fn set_config(&self, cfg: ProvidersConfig) {
        self.line.set(cfg.line);
        self.sms.set(cfg.sms);
        *self.smtp.write().unwrap_or_else(|p| p.into_inner()) = cfg.smtp;
    }

    /// Starts (`Some`) or ends (`None`) a provider-wide outage on `provider`, leaving the rest of
    /// its profile as it is. SMTP sessions read it at their next MAIL. Cannot fail today; the
    /// `Result` is the control API's contract.
    pub fn set_outage(
        &self,
        provider: crate::ledger::Provider,
        outage: Option<crate::outage::Outage>,
    ) -> Result<(), &'static str> {
        use crate::ledger::Provider;
        match provider {
            Provider::Line => {
                let mut c = (*self.line.get()).clone();
                c.outage = outage;
                self.line.set(c);
            }
            Provider::Sms => {
                let mut c = (*self.sms.get()).clone();
                c.outage = outage;
                self.sms.set(c);
            }
            Provider::Smtp => {
                let mut c = self.smtp.write().unwrap_or_else(|p| p.into_inner());
                c.outage = outage;
            }
        }
        Ok(())
    }

    /// Counts one send request an outage of `provider` answered or began to hold.
    pub(crate) fn outage_hit(&self, provider: crate::ledger::Provider) {
        self.outage_hits[provider as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Send requests outages of `provider` have answered 503 or begun to hold, since the start
    /// (held ones are counted when they arrive, before their entry is recorded).
    pub fn outage_hits(&self, provider: crate::ledger::Provider) -> u64 {
        self.outage_hits[provider as usize].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts a link fault in force (`true`) or ended (`false`). While any is, the HTTP fakes serve
    /// every send on a task of its own, so that a request a link fault holds or delays sees its
    /// sender hang up ([`crate::link`]).
    pub fn arm_link_fault(&self, on: bool) {
        use std::sync::atomic::Ordering::SeqCst;
        if on {
            self.link_faults.fetch_add(1, SeqCst);
        } else {
            let _ = self
                .link_faults
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
        }
    }

    /// Whether any link fault is in force.
    pub fn link_faults_armed(&self) -> bool {
        self.link_faults.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Registers provider state (idempotency keys, stored messages) to forget on reset.
    pub fn on_reset(&self, f: impl Fn() + Send + Sync + 'static) {
        self.resets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(f));
    }

    /// Forgets the ledger (its `seq` numbering carries on), every provider's state, and every
    /// report still due, for all three providers at once; fault profiles are kept.
    pub fn reset(&self) {
        self.callbacks.cancel_all();
        self.ledger.clear();
        for f in self.resets.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            f();
        }
    }

    /// Called by the SMTP fake after it commits a message for one recipient: schedules that
    /// recipient's delivery events.
    pub fn email_accepted(&self, entry: &LedgerEntry) {
        self.callbacks.email_accepted(&self.smtp_config(), entry);
    }

    pub fn pending_callbacks(&self) -> usize {
        self.callbacks.pending()
    }
}
