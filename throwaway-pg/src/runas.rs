//! Who the cluster runs as, and the private directory it lives in.
//!
//! PostgreSQL refuses to run as root, and this harness often runs as root (CI, containers).
//! As root we run `initdb`/`postgres` as the `postgres` system user if it exists, else `nobody`,
//! through `CommandExt::{uid,gid}` (std also clears the supplementary groups then). The cluster
//! directory is created directly under `/tmp` (or `TING_PG_TMPDIR`; world-traversable, short enough for a Unix socket
//! path) with mode 0700 and handed to that user.
//!
//! This module must never change the identity of the calling process itself.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::process::Command;

use nix::unistd::{Gid, Uid, User};

use crate::Error;

/// An unprivileged identity to run the cluster's processes as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl RunAs {
    /// `None` when not root (run as ourselves); the first existing of `postgres`, `nobody`
    /// when root.
    pub fn detect() -> Result<Option<RunAs>, Error> {
        if !Uid::effective().is_root() {
            return Ok(None);
        }
        for name in ["postgres", "nobody"] {
            if let Ok(Some(user)) = User::from_name(name) {
                return Ok(Some(RunAs {
                    name: user.name,
                    uid: user.uid.as_raw(),
                    gid: user.gid.as_raw(),
                }));
            }
        }
        Err(Error::NoUnprivilegedUser)
    }

    /// Makes `cmd` run as this identity.
    pub fn apply(&self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        cmd.uid(self.uid).gid(self.gid);
    }
}

/// Environment variable overriding `/tmp` as the parent of cluster directories (e.g. a tmpfs
/// such as `/dev/shm`: much faster to create on some disks, but the data then lives in RAM). It
/// must be traversable by the cluster user and short (Unix socket paths are limited to 107 bytes).
pub const TMPDIR_ENV: &str = "TING_PG_TMPDIR";

/// The parent of cluster directories and of the template cache.
pub(crate) fn base_dir() -> PathBuf {
    std::env::var_os(TMPDIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

/// Creates `/tmp/ting-pg-<random>` with mode 0700, owned by `run_as` when given.
pub(crate) fn make_private_dir(run_as: Option<&RunAs>) -> Result<PathBuf, Error> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let dir = base_dir().join(format!("ting-pg-{}", &id[..12]));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(Error::io(format!(
            "create cluster directory {}",
            dir.display()
        )))?;
    if let Some(user) = run_as {
        if let Err(e) = nix::unistd::chown(
            &dir,
            Some(Uid::from_raw(user.uid)),
            Some(Gid::from_raw(user.gid)),
        ) {
            let _ = std::fs::remove_dir(&dir);
            return Err(Error::Io {
                context: format!("hand {} to user {}", dir.display(), user.name),
                source: e.into(),
            });
        }
    }
    Ok(dir)
}
