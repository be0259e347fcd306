//! Filling an empty cluster directory with a fresh data directory: `initdb`, or a copy of a
//! cached pristine `initdb` output (the template).
//!
//! Why a template: `initdb` is mostly CPU (bootstrap plus a few thousand catalog statements),
//! ~0.6 s on an idle 2-core machine but 4–5 s when the cores are busy compiling or running other
//! tests — and every test binary of the workspace starts a cluster. Copying the ~40 MB result is
//! several times cheaper. The template lives at `/tmp/ting-pg-template-<key>`, where the key
//! hashes the binary, its version, the user and the flags; it is created atomically (copy to a
//! temporary name, then `rename`), used only if owned by the cluster user with mode 0700, and
//! never modified. Set `TING_PG_NO_TEMPLATE=1` to always run `initdb` (and create no template).
//!
//! This module must never write into the template after it is published, nor use one it cannot
//! trust (wrong owner or permissions).

use std::hash::{Hash, Hasher};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::bins::PgBinaries;
use crate::postmaster::{command, tail};
use crate::runas::RunAs;
use crate::Error;

/// Set (to anything) to bypass the template cache.
pub const NO_TEMPLATE_ENV: &str = "TING_PG_NO_TEMPLATE";

/// The fast flags: no fsync of the result, trust auth, superuser `postgres`, C locale.
const FLAGS: &[&str] = &[
    "--no-sync",
    "-A",
    "trust",
    "-U",
    "postgres",
    "-E",
    "UTF8",
    "--locale=C",
];

/// Makes `dir` (existing, empty, owned by `run_as`) a fresh data directory, from the template
/// when `use_template` and one is trusted, else by `initdb` (then published as the template). Returns the template used, if any, so a caller whose
/// server then fails to start can retry with `initdb` and [`withdraw`] it. `started` gets the
/// pid of `initdb` when one runs, for the watchdog.
pub(crate) async fn init_data_dir(
    bins: &PgBinaries,
    dir: &Path,
    run_as: Option<&RunAs>,
    use_template: bool,
    started: impl FnOnce(u32),
) -> Result<Option<PathBuf>, Error> {
    let version = version_text(bins, dir, run_as).await?;
    if std::env::var_os(NO_TEMPLATE_ENV).is_some() {
        initdb(bins, dir, run_as, &version, started).await?;
        return Ok(None);
    }
    let template = template_path(bins, &version, run_as);
    let uid = run_as
        .map(|u| u.uid)
        .unwrap_or_else(|| nix::unistd::Uid::effective().as_raw());
    if use_template && trusted_template(&template, uid) {
        let (from, to, owner) = (template.clone(), dir.to_path_buf(), run_as.cloned());
        let copied =
            tokio::task::spawn_blocking(move || copy_tree(&from, &to, owner.as_ref())).await;
        match copied {
            Ok(Ok(())) => return Ok(Some(template)),
            other => {
                tracing::warn!(template = %template.display(), ?other, "copying the cluster template failed; running initdb");
                empty_dir(dir)?;
            }
        }
    }
    initdb(bins, dir, run_as, &version, started).await?;
    let (from, owner) = (dir.to_path_buf(), run_as.cloned());
    let _ = tokio::task::spawn_blocking(move || publish_template(&from, &template, owner.as_ref()))
        .await;
    Ok(None)
}

/// Withdraws a template a server would not start from (renamed away first, so no one copies a
/// half-deleted one). Best effort: the next `initdb` publishes a fresh one.
pub(crate) fn withdraw(template: &Path) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let trash = PathBuf::from(format!("{}.{}.trash", template.display(), &id[..8]));
    if std::fs::rename(template, &trash).is_ok() {
        let _ = std::fs::remove_dir_all(&trash);
    }
}

/// `initdb --version`, e.g. "initdb (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)".
async fn version_text(
    bins: &PgBinaries,
    dir: &Path,
    run_as: Option<&RunAs>,
) -> Result<String, Error> {
    let mut cmd = command(&bins.initdb(), dir, run_as);
    cmd.arg("--version");
    let out = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(Error::io(format!(
            "run {} --version",
            bins.initdb().display()
        )))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The major version in `initdb --version` output, e.g. 15 (9 for 9.6).
fn major(version: &str) -> Option<u32> {
    version
        .split(')')
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|m| m.parse().ok())
}

async fn initdb(
    bins: &PgBinaries,
    dir: &Path,
    run_as: Option<&RunAs>,
    version: &str,
    started: impl FnOnce(u32),
) -> Result<(), Error> {
    let major = major(version).ok_or_else(|| Error::StartFailed {
        reason: format!("cannot read the version of {}", bins.initdb().display()),
        log_tail: version.to_string(),
    })?;
    let mut cmd = command(&bins.initdb(), dir, run_as);
    cmd.arg("-D")
        .arg(dir)
        .args(FLAGS)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if major >= 14 {
        cmd.arg("--no-instructions");
    }
    let child = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .map_err(Error::io(format!("spawn {}", bins.initdb().display())))?;
    if let Some(pid) = child.id() {
        started(pid);
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(Error::io("wait for initdb"))?;
    if out.status.success() {
        return Ok(());
    }
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Err(Error::StartFailed {
        reason: format!("initdb exited with {}", out.status),
        log_tail: tail(&text, 40),
    })
}

fn template_path(bins: &PgBinaries, version: &str, run_as: Option<&RunAs>) -> PathBuf {
    let mut h = std::hash::DefaultHasher::new();
    std::fs::canonicalize(bins.initdb())
        .unwrap_or_else(|_| bins.initdb())
        .hash(&mut h);
    version.hash(&mut h);
    run_as.map(|u| u.uid).hash(&mut h);
    nix::unistd::Uid::effective().as_raw().hash(&mut h);
    FLAGS.hash(&mut h);
    crate::runas::base_dir().join(format!("ting-pg-template-{:016x}", h.finish()))
}

/// A template is used only if it is a complete data directory owned by `uid` with mode 0700.
fn trusted_template(path: &Path, uid: u32) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    meta.is_dir()
        && meta.uid() == uid
        && meta.permissions().mode() & 0o777 == 0o700
        && path.join("PG_VERSION").is_file()
        && path.join("global/pg_control").is_file()
}

/// Copies the pristine data directory `from` to a temporary sibling of `template` and renames
/// it into place; if another process published first, ours is discarded. Best effort.
fn publish_template(from: &Path, template: &Path, run_as: Option<&RunAs>) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let tmp = PathBuf::from(format!("{}.{}.tmp", template.display(), &id[..8]));
    let result = (|| -> std::io::Result<()> {
        std::fs::create_dir(&tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700))?;
        if let Some(u) = run_as {
            std::os::unix::fs::lchown(&tmp, Some(u.uid), Some(u.gid))?;
        }
        copy_tree(from, &tmp, run_as)?;
        std::fs::rename(&tmp, template)
    })();
    if let Err(e) = result {
        tracing::debug!(error = %e, template = %template.display(), "cluster template not published");
        let _ = std::fs::remove_dir_all(&tmp);
    }
}

/// Copies the contents of `from` into the existing directory `to`, keeping permission bits and
/// giving everything to `run_as` when set.
fn copy_tree(from: &Path, to: &Path, run_as: Option<&RunAs>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let meta = entry.metadata()?;
        if meta.is_dir() {
            std::fs::create_dir(&dst)?;
            std::fs::set_permissions(&dst, meta.permissions())?;
            copy_tree(&src, &dst, run_as)?;
        } else if meta.is_file() {
            std::fs::copy(&src, &dst)?;
        } else {
            return Err(std::io::Error::other(format!(
                "unexpected file type at {}",
                src.display()
            )));
        }
        if let Some(u) = run_as {
            std::os::unix::fs::lchown(&dst, Some(u.uid), Some(u.gid))?;
        }
    }
    Ok(())
}

/// Removes everything inside `dir`, keeping `dir` itself (its owner and mode are set up).
pub(crate) fn empty_dir(dir: &Path) -> Result<(), Error> {
    let entries = std::fs::read_dir(dir).map_err(Error::io(format!("list {}", dir.display())))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let removed = if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(Error::io(format!("remove {}", path.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn major_versions_are_read_from_initdb_output() {
        let cases = [
            (
                "initdb (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)",
                Some(15),
            ),
            ("initdb (PostgreSQL) 9.6.24", Some(9)),
            ("initdb (PostgreSQL) 17beta1", Some(17)),
            ("initdb (PostgreSQL) 16.2", Some(16)),
            ("something else", None),
        ];
        for (text, want) in cases {
            assert_eq!(major(text), want, "{text}");
        }
    }

    #[test]
    fn untrusted_templates_are_refused() {
        let uid = nix::unistd::Uid::effective().as_raw();
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t");
        std::fs::create_dir_all(t.join("global")).unwrap();
        std::fs::write(t.join("PG_VERSION"), "15\n").unwrap();
        std::fs::write(t.join("global/pg_control"), "").unwrap();
        std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(trusted_template(&t, uid));
        assert!(!trusted_template(&t, uid + 1), "wrong owner");
        std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(!trusted_template(&t, uid), "readable by others");
        std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::remove_file(t.join("global/pg_control")).unwrap();
        assert!(!trusted_template(&t, uid), "incomplete");
        assert!(!trusted_template(&dir.path().join("missing"), uid));
    }
}
