//! Finding the PostgreSQL server binaries (`initdb`, `postgres`) on this machine.
//!
//! Search order: `TING_PG_BIN_DIR` alone if set (so tests and users can force a directory, or
//! force "nothing found"); otherwise every `PATH` entry (an explicit choice of the user wins),
//! then the distribution layouts, newest major version first: `/usr/lib/postgresql/N/bin`
//! (Debian/Ubuntu), `/usr/pgsql-N/bin` (RHEL), `/usr/local/pgsql/bin` (source builds).
//!
//! This module must never run the binaries it finds; it only looks at the file system.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::Error;

/// Environment variable naming the one directory to take `initdb` and `postgres` from.
pub const BIN_DIR_ENV: &str = "TING_PG_BIN_DIR";

/// A directory holding `initdb` and `postgres`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgBinaries {
    /// The directory, e.g. `/usr/lib/postgresql/15/bin`.
    pub dir: PathBuf,
}

impl PgBinaries {
    /// Path of `initdb`.
    pub fn initdb(&self) -> PathBuf {
        self.dir.join("initdb")
    }

    /// Path of `postgres`.
    pub fn postgres(&self) -> PathBuf {
        self.dir.join("postgres")
    }
}

/// Finds the binaries the default way: `TING_PG_BIN_DIR` if set, else `PATH` and the
/// distribution layouts (see the module docs).
pub fn find_binaries() -> Result<PgBinaries, Error> {
    let candidates = match std::env::var_os(BIN_DIR_ENV) {
        Some(dir) => vec![PathBuf::from(dir)],
        None => default_candidates(std::env::var_os("PATH").as_deref(), Path::new("/")),
    };
    find_binaries_in(&candidates)
}

/// Returns the first of `candidates` holding executable `initdb` and `postgres`, or
/// [`Error::NotInstalled`] naming every directory searched.
pub fn find_binaries_in(candidates: &[PathBuf]) -> Result<PgBinaries, Error> {
    candidates
        .iter()
        .find(|dir| is_executable(&dir.join("initdb")) && is_executable(&dir.join("postgres")))
        .map(|dir| PgBinaries { dir: dir.clone() })
        .ok_or_else(|| Error::NotInstalled {
            searched: candidates
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(":"),
        })
}

/// The directories searched when `TING_PG_BIN_DIR` is not set: `path_env` entries, then the
/// versioned distribution directories under `root` (normally `/`), newest version first.
pub fn default_candidates(path_env: Option<&OsStr>, root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = path_env
        .map(|p| {
            std::env::split_paths(p)
                .filter(|d| d.is_absolute())
                .collect()
        })
        .unwrap_or_default();
    let mut versioned: Vec<(Vec<u32>, PathBuf)> = Vec::new();
    for (parent, prefix, suffix) in [("usr/lib/postgresql", "", "bin"), ("usr", "pgsql-", "bin")] {
        let Ok(entries) = std::fs::read_dir(root.join(parent)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(version) = name
                .to_str()
                .and_then(|n| n.strip_prefix(prefix))
                .and_then(parse_version)
            else {
                continue;
            };
            versioned.push((version, entry.path().join(suffix)));
        }
    }
    versioned.sort_by(|a, b| b.0.cmp(&a.0));
    out.extend(versioned.into_iter().map(|(_, dir)| dir));
    out.push(root.join("usr/local/pgsql/bin"));
    out
}

/// Parses "15" or "9.6" into comparable numbers; anything else is not a version directory.
fn parse_version(s: &str) -> Option<Vec<u32>> {
    s.split('.').map(|part| part.parse().ok()).collect()
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn fake_install(dir: &Path, names: &[&str]) {
        std::fs::create_dir_all(dir).unwrap();
        for name in names {
            let path = dir.join(name);
            std::fs::write(&path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    #[test]
    fn newest_debian_version_wins_and_path_comes_first() {
        let root = tempfile::tempdir().unwrap();
        for v in ["9.6", "15", "13", "notaversion"] {
            fake_install(
                &root.path().join("usr/lib/postgresql").join(v).join("bin"),
                &["initdb", "postgres"],
            );
        }
        let dirs = default_candidates(None, root.path());
        let lib = root.path().join("usr/lib/postgresql");
        assert_eq!(
            dirs[..3],
            [lib.join("15/bin"), lib.join("13/bin"), lib.join("9.6/bin")]
        );
        assert_eq!(find_binaries_in(&dirs).unwrap().dir, lib.join("15/bin"));

        let on_path = root.path().join("opt/pg/bin");
        fake_install(&on_path, &["initdb", "postgres"]);
        let dirs = default_candidates(Some(on_path.as_os_str()), root.path());
        assert_eq!(find_binaries_in(&dirs).unwrap().dir, on_path);
    }

    #[test]
    fn a_directory_needs_both_binaries_and_they_must_be_executable() {
        let root = tempfile::tempdir().unwrap();
        let only_initdb = root.path().join("a");
        fake_install(&only_initdb, &["initdb"]);
        let not_exec = root.path().join("b");
        fake_install(&not_exec, &["initdb", "postgres"]);
        std::fs::set_permissions(
            not_exec.join("postgres"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let good = root.path().join("c");
        fake_install(&good, &["initdb", "postgres"]);

        let cases: &[(&[&PathBuf], Option<&PathBuf>)] = &[
            (&[&only_initdb], None),
            (&[&not_exec], None),
            (&[&only_initdb, &not_exec, &good], Some(&good)),
            (&[], None),
        ];
        for (dirs, want) in cases {
            let dirs: Vec<PathBuf> = dirs.iter().map(|d| (*d).clone()).collect();
            match (find_binaries_in(&dirs), want) {
                (Ok(found), Some(want)) => assert_eq!(&found.dir, *want),
                (Err(Error::NotInstalled { searched }), None) => {
                    for d in &dirs {
                        assert!(searched.contains(&d.display().to_string()), "{searched}");
                    }
                }
                (got, want) => panic!("dirs {dirs:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn not_installed_message_says_what_to_do() {
        let msg = find_binaries_in(&[PathBuf::from("/nonexistent")])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("apt-get install postgresql"), "{msg}");
        assert!(msg.contains("DATABASE_URL"), "{msg}");
        assert!(msg.contains("/nonexistent"), "{msg}");
    }
}
