//! The one error type this crate returns, so callers can tell "PostgreSQL is not installed"
//! (a setup problem the user fixes) from "it would not start" and from SQL or I/O failures.
//!
//! It must never hide the server log: a start failure always carries the log tail.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while obtaining, running or dropping a database.
///
/// For the harness every variant is an infrastructure failure (exit code 3); `NotInstalled`
/// is the one a user fixes by installing PostgreSQL or pointing at a server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No directory holding both `initdb` and `postgres` was found.
    #[error(
        "PostgreSQL server binaries (initdb, postgres) not found; searched: {searched}. \
         Install them (e.g. `apt-get install postgresql`), point TING_PG_BIN_DIR at their \
         directory, or set DATABASE_URL to use an existing server"
    )]
    NotInstalled {
        /// The directories that were searched, `:`-separated.
        searched: String,
    },
    /// Running as root and neither a `postgres` nor a `nobody` user exists to run the cluster as
    /// (PostgreSQL refuses to run as root).
    #[error(
        "running as root but neither a `postgres` nor a `nobody` user exists to run \
         PostgreSQL as; create one or set DATABASE_URL"
    )]
    NoUnprivilegedUser,
    /// `initdb` or `postgres` failed, exited early or did not accept connections in time.
    #[error(
        "PostgreSQL did not start: {reason}\n--- last lines of the server log ---\n{log_tail}"
    )]
    StartFailed {
        /// What went wrong, in one line.
        reason: String,
        /// The last lines of the initdb output or server log.
        log_tail: String,
    },
    /// A server URL that cannot be used.
    #[error("bad database url {url:?}: {reason}")]
    BadUrl {
        /// The URL as given, its password replaced by `***` (or only its scheme when it does
        /// not parse).
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// A statement (CREATE/DROP DATABASE, a readiness probe) failed.
    #[error("sql: {0}")]
    Sql(#[from] sqlx::Error),
    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, lowercase, e.g. "create /tmp/ting-pg-…".
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Stopping the cluster left something behind.
    #[error("could not remove cluster directory {dir}: {source}")]
    Cleanup {
        /// The directory that is still there.
        dir: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Builds a closure that wraps an `io::Error` with `context`, for `map_err`.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}
