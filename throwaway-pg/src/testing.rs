//! [`test_database`]: a fresh database for one test, on `DATABASE_URL` if set, else on one
//! private cluster shared by every test of the process.
//!
//! The shared cluster lives in a static and is never dropped: the watchdog stops it and
//! removes its directory when the test process exits. It holds no runtime-bound state, so
//! each `#[tokio::test]` (one runtime per test) can use it; every admin statement opens its own
//! connection.
//!
//! This module must never hand two tests the same database.

use tokio::sync::OnceCell;

use crate::database::{
    create_database, drop_blocking, drop_database, fresh_name, url_with_database,
};
use crate::{Cluster, ClusterOptions, Error};

/// The environment variable naming an existing server to create test databases on.
pub const DATABASE_URL_ENV: &str = "DATABASE_URL";

static SHARED: OnceCell<Cluster> = OnceCell::const_new();

/// A fresh database for one test. Dropping it drops the database, best effort (it blocks for a
/// moment on a helper thread); [`TestDb::close`] does it explicitly and reports errors.
#[derive(Debug)]
pub struct TestDb {
    /// URL of the fresh database.
    pub url: String,
    admin_url: String,
    name: String,
}

impl TestDb {
    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// URL of the maintenance database on the same server (to create more databases, run
    /// `pg_terminate_backend`, …).
    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    /// Drops the database now.
    pub async fn close(mut self) -> Result<(), Error> {
        let name = std::mem::take(&mut self.name);
        drop_database(&self.admin_url, &name).await
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if !self.name.is_empty() {
            drop_blocking(&self.admin_url, &self.name);
        }
    }
}

/// The process-wide private cluster, started on first use (with 200 connections, as tests of
/// several crates run many pools side by side).
pub async fn shared_cluster() -> Result<&'static Cluster, Error> {
    SHARED
        .get_or_try_init(|| {
            Cluster::start(ClusterOptions {
                max_connections: 200,
                ..ClusterOptions::default()
            })
        })
        .await
}

/// For tests of every crate: `DATABASE_URL` if set, else ONE private cluster per test process
/// (started lazily, shared by all tests in the binary, cleaned up by its watchdog when the
/// process exits), and a fresh database per call.
pub async fn test_database() -> Result<TestDb, Error> {
    let admin_url = match std::env::var(DATABASE_URL_ENV) {
        Ok(url) if !url.is_empty() => url,
        _ => shared_cluster().await?.admin_url(),
    };
    let name = fresh_name();
    let url = url_with_database(&admin_url, &name)?;
    create_database(&admin_url, &name).await?;
    Ok(TestDb {
        url,
        admin_url,
        name,
    })
}
