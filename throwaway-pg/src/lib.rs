//! A private, throwaway PostgreSQL cluster — or a fresh database on a given server — for
//! `ting-chaos run`, `ting-chaos db up`, and every crate's integration tests.
//!
//! - [`Database::provision`]: with a server URL, create a fresh `ting_<hex>` database there and
//!   drop it on close; without one, start a private [`Cluster`] and create the database on it.
//! - [`Cluster`]: `initdb` into `/tmp/ting-pg-<hex>` (`--no-sync -A trust -U postgres`),
//!   run `postgres` as a direct child on a free `127.0.0.1` port and a Unix socket in that
//!   directory, with `fsync=off`, `full_page_writes=off` and caller-sized `max_connections` /
//!   `shared_buffers`. As root it runs as the `postgres` (else `nobody`) user. It is stopped
//!   and its directory removed on every exit path, SIGKILL of the owner included (a watchdog
//!   process does that; `src/watchdog.rs` says why not `PR_SET_PDEATHSIG`).
//! - A pristine `initdb` result is cached as a template under `/tmp/ting-pg-template-<key>` and
//!   copied for later clusters (`src/initdb.rs`); `TING_PG_NO_TEMPLATE=1` turns that off.
//!   `TING_PG_TMPDIR` moves cluster directories (and the template) elsewhere, e.g. `/dev/shm`.
//! - [`test_database`]: `DATABASE_URL` or one shared private cluster per test process, and a
//!   fresh database per call.
//!
//! Binaries are looked up by [`find_binaries`]; set `TING_PG_BIN_DIR` to force a directory.
//! When none is found the error is [`Error::NotInstalled`], which says what to install.
//!
//! This crate must never touch a database it did not create, nor leave a postmaster running.

mod bins;
mod cluster;
mod database;
mod error;
mod initdb;
mod ports;
mod postmaster;
mod runas;
mod testing;
mod watchdog;

pub use bins::{default_candidates, find_binaries, find_binaries_in, PgBinaries, BIN_DIR_ENV};
pub use cluster::{Cluster, ClusterOptions};
pub use database::{create_database, drop_database, fresh_name, url_with_database, Database};
pub use error::Error;
pub use initdb::NO_TEMPLATE_ENV;
pub use ports::free_port;
pub use runas::TMPDIR_ENV;
pub use testing::{shared_cluster, test_database, TestDb, DATABASE_URL_ENV};
