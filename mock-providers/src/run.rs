//! Starting and stopping the three fakes together, in-process, on pre-bound listeners: what the
//! harness and `ting-chaos mocks` call.
//!
//! Binding is the caller's choice: [`start`] binds port 0 on the address it is given (or the fixed
//! [`Ports`] of [`start_with_ports`]), and the CLI passes 127.0.0.1 unless a non-loopback address
//! is asked for explicitly. This module must never pick an address by itself.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::ProvidersConfig;
use crate::hub::Hub;
use crate::ledger::{Ledger, Provider};
use crate::line::{self, LineState};
use crate::sms::{self, SmsState};
use crate::smtp::{self, SmtpContext};

/// The four pre-bound listeners the fakes serve on.
pub struct Listeners {
    pub line: TcpListener,
    pub sms: TcpListener,
    pub smtp: TcpListener,
    pub smtp_control: TcpListener,
}

/// Fixed ports for the four listeners; 0 (the default) means any free port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Ports {
    pub line: u16,
    pub sms: u16,
    pub smtp: u16,
    pub smtp_control: u16,
}

impl Listeners {
    /// Binds all four on `ip` at `ports` (0: any free port); the error names the listener.
    pub async fn bind_ports(ip: IpAddr, ports: Ports) -> anyhow::Result<Listeners> {
        let bind = |what: &'static str, port: u16| async move {
            let at = SocketAddr::new(ip, port);
            TcpListener::bind(at)
                .await
                .with_context(|| format!("binding the fake {what} on {at}"))
        };
        Ok(Listeners {
            line: bind("LINE", ports.line).await?,
            sms: bind("SMS", ports.sms).await?,
            smtp: bind("SMTP", ports.smtp).await?,
            smtp_control: bind("SMTP control API", ports.smtp_control).await?,
        })
    }
}

/// The running fakes.
pub struct Providers {
    pub line_addr: SocketAddr,
    pub sms_addr: SocketAddr,
    pub smtp_addr: SocketAddr,
    pub smtp_control_addr: SocketAddr,
    pub ledger: Ledger,
    hub: Arc<Hub>,
    stop: watch::Sender<bool>,
    tasks: Vec<(&'static str, JoinHandle<std::io::Result<()>>)>,
}

/// Starts the three fakes on any free ports of `bind`.
pub async fn start(
    seed: u64,
    cfg: ProvidersConfig,
    bind: IpAddr,
    ledger: Ledger,
) -> anyhow::Result<Providers> {
    start_with_ports(seed, cfg, bind, Ports::default(), ledger).await
}

/// Starts the three fakes on `bind` at fixed `ports` (0: any free port), e.g. so a developer can
/// point an application at stable addresses.
pub async fn start_with_ports(
    seed: u64,
    cfg: ProvidersConfig,
    bind: IpAddr,
    ports: Ports,
    ledger: Ledger,
) -> anyhow::Result<Providers> {
    let listeners = Listeners::bind_ports(bind, ports).await?;
    start_on(seed, cfg, listeners, ledger).await
}

/// Starts the three fakes on the given listeners.
pub async fn start_on(
    seed: u64,
    cfg: ProvidersConfig,
    l: Listeners,
    ledger: Ledger,
) -> anyhow::Result<Providers> {
    let addr = |t: &TcpListener, what: &str| {
        t.local_addr()
            .with_context(|| format!("reading the {what} address"))
    };
    let (line_addr, sms_addr) = (addr(&l.line, "line")?, addr(&l.sms, "sms")?);
    let (smtp_addr, smtp_control_addr) = (
        addr(&l.smtp, "smtp")?,
        addr(&l.smtp_control, "smtp control")?,
    );
    let hub = Hub::new(seed, cfg, ledger.clone());
    let (stop, _) = watch::channel(false);
    let signal = |stop: &watch::Sender<bool>| {
        let mut rx = stop.subscribe();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let on_commit_hub = hub.clone();
    let ctx = SmtpContext {
        seed,
        config: hub.smtp.clone(),
        ledger: ledger.clone(),
        on_commit: Arc::new(move |e| on_commit_hub.email_accepted(e)),
        on_outage: {
            let hub = hub.clone();
            Arc::new(move || hub.outage_hit(crate::ledger::Provider::Smtp))
        },
    };
    let tasks = vec![
        (
            "line",
            tokio::spawn(line::run(
                l.line,
                LineState::new(hub.clone()),
                signal(&stop),
            )),
        ),
        (
            "sms",
            tokio::spawn(sms::run(l.sms, SmsState::new(hub.clone()), signal(&stop))),
        ),
        ("smtp", tokio::spawn(smtp::run(l.smtp, ctx, signal(&stop)))),
        (
            "smtp control",
            tokio::spawn(crate::control::run(
                l.smtp_control,
                hub.clone(),
                Provider::Smtp,
                signal(&stop),
            )),
        ),
    ];
    Ok(Providers {
        line_addr,
        sms_addr,
        smtp_addr,
        smtp_control_addr,
        ledger,
        hub,
        stop,
        tasks,
    })
}

impl Providers {
    /// Every address the fakes listen on: where a sender's connections end.
    pub fn server_addrs(&self) -> [SocketAddr; 4] {
        [
            self.line_addr,
            self.sms_addr,
            self.smtp_addr,
            self.smtp_control_addr,
        ]
    }

    /// `http://{line_addr}`: the LINE API base URL.
    pub fn line_base(&self) -> String {
        format!("http://{}", self.line_addr)
    }

    /// `http://{sms_addr}`: the Twilio-style API base URL.
    pub fn sms_base(&self) -> String {
        format!("http://{}", self.sms_addr)
    }

    /// Delivery reports still due (SMS status callbacks and e-mail events, retries included).
    pub fn pending_callbacks(&self) -> usize {
        self.hub.pending_callbacks()
    }

    /// When the fakes' planned delivery reports fall due: the stack cannot have settled what a
    /// report will tell it before it is sent.
    pub fn report_plan(&self) -> Option<crate::callbacks::ReportPlan> {
        self.hub.callbacks.report_plan()
    }

    /// Resolves once no delivery report is due.
    pub async fn callbacks_quiesced(&self) {
        self.hub.callbacks.quiesced().await
    }

    /// Replaces all three fault profiles mid-run.
    /// Starts or ends a provider-wide outage ([`Hub::set_outage`]).
    pub fn set_outage(
        &self,
        provider: crate::ledger::Provider,
        outage: Option<crate::outage::Outage>,
    ) -> Result<(), &'static str> {
        self.hub.set_outage(provider, outage)
    }

    pub fn set_config(&self, cfg: ProvidersConfig) {
        self.hub.set_config(cfg)
    }

    pub fn config(&self) -> ProvidersConfig {
        self.hub.config()
    }

    /// The shared state, for tests and in-process callers that need more than the above.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// Stops accepting, lets requests in flight finish (up to 5 s), and drops every report due.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        self.hub.callbacks.cancel_all();
        for (name, task) in self.tasks {
            let abort = task.abort_handle();
            match tokio::time::timeout(Duration::from_secs(5), task).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => {
                    tracing::warn!(server = name, error = %e, "fake provider stopped with an error")
                }
                Ok(Err(e)) => {
                    tracing::warn!(server = name, error = %e, "fake provider task failed")
                }
                Err(_) => {
                    tracing::warn!(
                        server = name,
                        "fake provider did not stop within 5 s; aborting"
                    );
                    abort.abort();
                }
            }
        }
    }
}
