//! The run's first phase: its database (a throwaway cluster, or a fresh database on a server) and
//! the fake providers, in-process. Each is handed to [`Resources`] for teardown the moment it
//! exists, so a failure later in the run still cleans it up.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context;
use mock_providers::config::ProvidersConfig;
use mock_providers::ledger::Ledger;

use super::{env, infra, Resources, RunOptions};
use crate::attribution::Attributor;
use crate::scenario::Scenario;

/// The run's database, shared with the database chaos steps (which may restart its cluster).
pub(super) struct Database {
    pub url: String,
    pub admin_url: String,
    /// A private cluster this run started (not a server it was pointed at).
    pub throwaway: bool,
    pub handle: Arc<tokio::sync::Mutex<Option<throwaway_pg::Database>>>,
}

impl Database {
    /// `throwaway` or `server`, as `report.json` says it.
    pub fn kind(&self) -> &'static str {
        if self.throwaway {
            "throwaway"
        } else {
            "server"
        }
    }
}

/// Provisions the run's database: on `--database-url`, the scenario's `[database].url` or
/// `DATABASE_URL` when one is given, else on a throwaway cluster sized for the stack's workers.
pub(super) async fn database(
    scenario: &Scenario,
    opts: &RunOptions,
    res: &mut Resources,
) -> anyhow::Result<Database> {
    let server_url = opts
        .database_url
        .clone()
        .or_else(|| scenario.database.url.clone())
        .or_else(|| std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()));
    let keep = opts.keep || scenario.database.keep;
    res.keep = keep;
    let pg_opts = throwaway_pg::ClusterOptions {
        max_connections: max_connections(scenario.stack.workers),
        ..Default::default()
    };
    let database = throwaway_pg::Database::provision(server_url.as_deref(), pg_opts, keep)
        .await
        .map_err(|e| infra(format!("database: {e}")))?;
    let db = Database {
        url: database.url().to_string(),
        admin_url: database.admin_url(),
        throwaway: database.cluster().is_some(),
        handle: Arc::new(tokio::sync::Mutex::new(Some(database))),
    };
    res.database = Some(db.handle.clone());
    Ok(db)
}

/// The fake providers as the stack will see them.
pub(super) struct Fakes {
    /// The providers' configuration as started (the e-mail events URL filled in).
    pub config: ProvidersConfig,
    /// Every address the contract hands the stack.
    pub endpoints: env::Endpoints,
    /// Maps a provider connection to its sending process; knows the fakes' own addresses.
    pub attributor: Attributor,
}

/// Starts the three fakes on free ports, recording into `ledger`. The stack's API address is
/// chosen here too, since the fakes' delivery reports are addressed to it.
pub(super) async fn providers(
    scenario: &Scenario,
    database_url: &str,
    ledger: &Ledger,
    res: &mut Resources,
) -> anyhow::Result<Fakes> {
    let api_addr = free_port()?;
    let mut config = scenario.providers.clone();
    if config.smtp.events.enabled && config.smtp.events.url.is_none() {
        config.smtp.events.url = Some(format!("http://{api_addr}/v1/callbacks/email"));
    }
    let providers = mock_providers::start(
        scenario.seed,
        config.clone(),
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        ledger.clone(),
    )
    .await
    .map_err(|e| infra(format!("fake providers: {e:#}")))?;
    let endpoints = env::Endpoints {
        database_url: database_url.to_string(),
        api_addr,
        line: providers.line_addr,
        smtp: providers.smtp_addr,
        sms: providers.sms_addr,
    };
    let attributor = Attributor::new();
    for addr in providers.server_addrs() {
        attributor.add_server(addr);
    }
    res.providers = Some(providers);
    Ok(Fakes {
        config,
        endpoints,
        attributor,
    })
}

/// `max_connections` of the throwaway cluster for a stack of `workers` (docs/stack-contract.md):
/// 40 per worker (a sender pool of 32 and its heartbeat, rescuer and listeners), 40 for the API,
/// one worker's share again for a restarted worker's overlap with the one it replaces, and 10
/// for the harness's own sessions. A real server allows hundreds; a smaller budget here would
/// fail a correct stack for the harness's own setting. Each allowed connection costs the cluster
/// a few kilobytes of shared memory until it is used.
pub fn max_connections(workers: u32) -> u32 {
    90 + 40 * workers
}

/// The address the stack's API is told to listen on: free now, and outside the kernel's
/// ephemeral range so that no outgoing connection can take it before the API binds it.
fn free_port() -> anyhow::Result<SocketAddr> {
    let port = throwaway_pg::free_port().context("find a free port for the stack's API")?;
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}
