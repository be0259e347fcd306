//! The reference notification stack: a PostgreSQL queue of per-recipient, per-channel
//! deliveries; an API that renders and enqueues batches and takes provider callbacks; workers
//! that claim rows under leases, send through LINE / SMTP / SMS, retry with backoff and rescue
//! each other's expired leases.
//!
//! It speaks to the harness only through the stack contract (`docs/stack-contract.md`) and to
//! providers only by their wire protocols. It must never import the harness or the mock
//! providers. Every state change goes through [`state::transition`].
//!
//! Entry points (the `ting-chaos stack …` subcommands are thin wrappers):
//! - `migrate`: [`migrate`]`(&Config::from_env()?.database_url)`;
//! - `api`: bind `cfg.api_addr`, then [`api::run`]`(cfg, listener, `[`sigterm`]`())`;
//! - `worker`: [`worker::run`]`(cfg, `[`sigterm`]`())`, exit 0 when it returns `Ok`;
//! - `bench claim`: [`bench::claim_bench`] and [`bench::render`].

pub mod api;
pub mod backoff;
pub mod bench;
pub mod channels;
pub mod claim;
pub mod config;
pub mod render;
pub mod rescuer;
pub mod state;
pub mod worker;

pub use config::{Config, ConfigError};

use anyhow::Context;

/// The embedded migrations (`stack/migrations`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Creates or upgrades the schema in `database_url`.
pub async fn migrate(database_url: &str) -> anyhow::Result<()> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(database_url)
        .await
        .context("connecting to the database")?;
    MIGRATOR.run(&pool).await.context("running migrations")?;
    pool.close().await;
    Ok(())
}

/// Logging for a stack process: JSON lines when stderr is not a terminal, `RUST_LOG` filter
/// (default `info`). Safe to call twice.
pub fn init_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if std::io::stderr().is_terminal() {
        builder.try_init()
    } else {
        builder.json().try_init()
    };
}

/// A worker's pool: [`pool`], and the server ends any of its sessions that sits idle inside a
/// transaction for longer than `lease`. A worker cut off from the database mid-transaction (its
/// link partitioned, the process frozen) would otherwise keep that transaction's locks, the
/// rescuer's advisory lock among them, until it came back: every other worker's rescue would
/// wait on a worker whose leases have all lapsed.
pub(crate) async fn worker_pool(
    url: &str,
    max: u32,
    lease: std::time::Duration,
) -> anyhow::Result<sqlx::PgPool> {
    use std::str::FromStr;
    let opts = sqlx::postgres::PgConnectOptions::from_str(url)
        .context("parsing the database URL")?
        .options([(
            "idle_in_transaction_session_timeout",
            format!("{}ms", lease.as_millis().max(1)),
        )]);
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect_with(opts)
        .await
        .context("connecting to the database")
}

/// Connects a pool sized for `max` concurrent users.
pub(crate) async fn pool(url: &str, max: u32) -> anyhow::Result<sqlx::PgPool> {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect(url)
        .await
        .context("connecting to the database")
}

/// Resolves on the first SIGTERM or SIGINT: the `shutdown` future the binaries pass to
/// [`api::run`] and [`worker::run`]. The handlers are installed by this call, not when the future
/// is first polled, so a SIGTERM that arrives while the process is still starting (connecting,
/// binding) is neither lost nor fatal.
pub fn sigterm() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        match handlers {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}
