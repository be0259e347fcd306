//! [`Database`]: where a run's data lives — a fresh database on a given server, or on a private
//! [`Cluster`] started for the run — plus the CREATE/DROP DATABASE helpers shared with tests.
//!
//! Admin statements use one short-lived `PgConnection`, never a pool: callers (and
//! `#[tokio::test]`) may run each call on a different runtime.
//!
//! This module must never drop a database it did not create (names come from [`fresh_name`]).

use sqlx::{Connection, PgConnection};

use crate::{Cluster, ClusterOptions, Error};

/// A fresh database name, `ting_` + 12 random hex digits.
pub fn fresh_name() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("ting_{}", &id[..12])
}

/// `server_url` with its database replaced by `db` (user, password, host, port and query
/// parameters kept).
pub fn url_with_database(server_url: &str, db: &str) -> Result<String, Error> {
    let bad = |reason: &str| Error::BadUrl {
        url: redacted(server_url),
        reason: reason.to_string(),
    };
    let mut url = url::Url::parse(server_url).map_err(|e| bad(&e.to_string()))?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err(bad("the scheme must be postgres:// or postgresql://"));
    }
    url.set_path("");
    url.path_segments_mut()
        .map_err(|()| bad("the url cannot have a path"))?
        .push(db);
    Ok(url.to_string())
}

/// `url` fit to print in an error: its password replaced by `***`; a URL that does not parse as
/// one with a host (so where its password is cannot be told) shown only up to its scheme.
fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if !u.cannot_be_a_base() => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        // `user:password@host` parses as scheme `user` and an opaque rest: show neither.
        Ok(u) => format!("{}:…", u.scheme()),
        Err(_) => match url.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://…"),
            None => "…".to_string(),
        },
    }
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `CREATE DATABASE db` on the server `admin_url` points at.
pub async fn create_database(admin_url: &str, db: &str) -> Result<(), Error> {
    let mut conn = PgConnection::connect(admin_url).await?;
    let result = sqlx::raw_sql(&format!("CREATE DATABASE {}", quote_ident(db)))
        .execute(&mut conn)
        .await;
    let _ = conn.close().await;
    result?;
    Ok(())
}

/// `DROP DATABASE IF EXISTS db`, disconnecting its sessions first (`WITH (FORCE)` on 13+,
/// `pg_terminate_backend` before that).
pub async fn drop_database(admin_url: &str, db: &str) -> Result<(), Error> {
    let mut conn = PgConnection::connect(admin_url).await?;
    let result = drop_on(&mut conn, db).await;
    let _ = conn.close().await;
    result
}

async fn drop_on(conn: &mut PgConnection, db: &str) -> Result<(), Error> {
    let version: String = sqlx::query_scalar("SHOW server_version_num")
        .fetch_one(&mut *conn)
        .await?;
    let version: u32 = version.parse().unwrap_or(0);
    if version >= 130_000 {
        sqlx::raw_sql(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            quote_ident(db)
        ))
        .execute(&mut *conn)
        .await?;
    } else {
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()")
            .bind(db)
            .execute(&mut *conn)
            .await?;
        sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {}", quote_ident(db)))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Where a run's database lives: a fresh database on a server (given or private cluster).
#[derive(Debug)]
pub struct Database {
    name: String,
    url: String,
    admin_url: String,
    cluster: Option<Cluster>,
    keep: bool,
}

impl Database {
    /// `server_url`: Some → create a fresh db on that server; None → start a private Cluster
    /// and create the db there. `keep`: do not drop the db (and, for a private cluster, do not
    /// delete the data dir; print where it is) on close.
    pub async fn provision(
        server_url: Option<&str>,
        opts: ClusterOptions,
        keep: bool,
    ) -> Result<Database, Error> {
        let name = fresh_name();
        match server_url {
            Some(server) => {
                let url = url_with_database(server, &name)?;
                create_database(server, &name).await?;
                Ok(Database {
                    name,
                    url,
                    admin_url: server.to_string(),
                    cluster: None,
                    keep,
                })
            }
            None => {
                let mut cluster = Cluster::start(opts).await?;
                cluster.set_keep(keep);
                create_database(&cluster.admin_url(), &name).await?;
                Ok(Database {
                    url: cluster.url_for(&name),
                    admin_url: cluster.admin_url(),
                    name,
                    cluster: Some(cluster),
                    keep,
                })
            }
        }
    }

    /// URL of the fresh database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The fresh database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// URL of the maintenance database on the same server (the given server URL, or the
    /// private cluster's `postgres` database).
    pub fn admin_url(&self) -> String {
        self.admin_url.clone()
    }

    /// The private cluster, when there is one.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    /// The private cluster, mutably (chaos restarts it).
    pub fn cluster_mut(&mut self) -> Option<&mut Cluster> {
        self.cluster.as_mut()
    }

    /// Drops the database (unless kept) and stops the private cluster (removing its directory
    /// unless kept; a kept directory's location is printed to stderr).
    pub async fn close(mut self) -> Result<(), Error> {
        // Taking the name tells `Drop` there is nothing left to do.
        let name = std::mem::take(&mut self.name);
        match self.cluster.take() {
            Some(cluster) => {
                let dir = cluster.data_dir().to_path_buf();
                // The whole cluster goes away, so there is no point in dropping the database.
                cluster.stop().await?;
                if self.keep {
                    eprintln!(
                        "kept database {} in PostgreSQL data directory {} (server stopped; \
                         start it with `postgres -D {}` as the directory's owner)",
                        name,
                        dir.display(),
                        dir.display()
                    );
                }
                Ok(())
            }
            None if self.keep => {
                eprintln!("kept database {}", self.url);
                Ok(())
            }
            None => drop_database(&self.admin_url, &name).await,
        }
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        // A private cluster cleans itself up when dropped; a database on a given server is
        // dropped best effort, off the caller's runtime.
        if self.cluster.is_none() && !self.keep && !self.name.is_empty() {
            drop_blocking(&self.admin_url, &self.name);
        }
    }
}

/// Drops `db` synchronously from a fresh thread with its own runtime (so it works inside and
/// outside of an async context). Best effort: failures are logged.
pub(crate) fn drop_blocking(admin_url: &str, db: &str) {
    let (admin_url, db) = (admin_url.to_string(), db.to_string());
    let joined = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(drop_database(&admin_url, &db))
            .map_err(anyhow::Error::from)
    })
    .join();
    match joined {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "could not drop a test database"),
        Err(_) => tracing::warn!("dropping a test database panicked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_url_is_never_printed_with_its_password() {
        for (bad, shown) in [
            (
                "mysql://u:secret@h/db",
                "bad database url \"mysql://u:***@h/db\"",
            ),
            (
                "postgres://u:secret@h:99999/db",
                "bad database url \"postgres://…\"",
            ),
            ("u:secret@h", "bad database url \"u:…\""),
            ("secret", "bad database url \"…\""),
        ] {
            let e = url_with_database(bad, "x").unwrap_err().to_string();
            assert!(!e.contains("secret"), "{e}");
            assert!(e.starts_with(shown), "{e}");
        }
    }

    #[test]
    fn url_with_database_replaces_only_the_database() {
        let cases = [
            (
                "postgres://postgres@127.0.0.1:5432/test",
                "postgres://postgres@127.0.0.1:5432/ting_x",
            ),
            (
                "postgres://u:p%40ss@db.example:6000/app?sslmode=disable",
                "postgres://u:p%40ss@db.example:6000/ting_x?sslmode=disable",
            ),
            ("postgresql://localhost", "postgresql://localhost/ting_x"),
            (
                "postgres:///test?host=/var/run/postgresql",
                "postgres:///ting_x?host=/var/run/postgresql",
            ),
        ];
        for (given, want) in cases {
            assert_eq!(url_with_database(given, "ting_x").unwrap(), want, "{given}");
        }
        for bad in ["not a url", "mysql://localhost/x"] {
            assert!(
                matches!(url_with_database(bad, "x"), Err(Error::BadUrl { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn fresh_names_are_unique_safe_identifiers() {
        let a = fresh_name();
        let b = fresh_name();
        assert_ne!(a, b);
        assert_eq!(a.len(), "ting_".len() + 12);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{a}"
        );
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("ting_1"), "\"ting_1\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
