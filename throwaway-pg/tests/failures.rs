//! What a caller sees when PostgreSQL is missing or will not start: `NotInstalled` with what to
//! do, or `StartFailed` carrying the log tail — and no directory left behind either way.
//!
//! Only `not_installed_when_no_binaries_are_found` touches `TING_PG_BIN_DIR`; the others pass
//! their binaries explicitly, so the environment change cannot leak into them.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use throwaway_pg::{
    default_candidates, find_binaries_in, Cluster, ClusterOptions, Database, Error, PgBinaries,
};

/// A directory the cluster's unprivileged user can read and run scripts from.
fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

fn script(dir: &Path, name: &str, body: &str) {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn real_binaries() -> PgBinaries {
    find_binaries_in(&default_candidates(
        std::env::var_os("PATH").as_deref(),
        Path::new("/"),
    ))
    .unwrap()
}

/// The `-D` directory a fake binary recorded in `marker`.
fn recorded_dir(marker: &Path) -> PathBuf {
    PathBuf::from(std::fs::read_to_string(marker).unwrap().trim())
}

#[tokio::test]
async fn not_installed_when_no_binaries_are_found() {
    let empty = tempfile::tempdir().unwrap();
    std::env::set_var(throwaway_pg::BIN_DIR_ENV, empty.path());
    let err = Cluster::start(ClusterOptions::default()).await.unwrap_err();
    let Error::NotInstalled { searched } = &err else {
        panic!("want NotInstalled, got {err}")
    };
    assert_eq!(searched, &empty.path().display().to_string());
    let msg = err.to_string();
    for needle in [
        "apt-get install postgresql",
        "DATABASE_URL",
        "TING_PG_BIN_DIR",
    ] {
        assert!(msg.contains(needle), "message lacks {needle:?}: {msg}");
    }
    let err = Database::provision(None, ClusterOptions::default(), false)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotInstalled { .. }), "{err}");
    std::env::remove_var(throwaway_pg::BIN_DIR_ENV);
}

#[tokio::test]
async fn failing_initdb_reports_its_output_and_leaves_no_directory() {
    let bin = open_dir();
    let marker = bin.path().join("dir");
    script(
        bin.path(),
        "initdb",
        &format!(
            r#"if [ "$1" = --version ]; then echo "initdb (PostgreSQL) 15.0"; exit 0; fi
echo "$2" > {}
echo "initdb: error: the disk is on fire" >&2
exit 1"#,
            marker.display()
        ),
    );
    script(bin.path(), "postgres", "exit 1");
    let err = Cluster::start_with(
        PgBinaries {
            dir: bin.path().to_path_buf(),
        },
        ClusterOptions::default(),
    )
    .await
    .unwrap_err();
    let Error::StartFailed { reason, log_tail } = &err else {
        panic!("want StartFailed, got {err}")
    };
    assert!(reason.contains("initdb"), "{reason}");
    assert!(log_tail.contains("the disk is on fire"), "{log_tail}");
    let dir = recorded_dir(&marker);
    assert!(dir.starts_with("/tmp"), "{}", dir.display());
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[tokio::test]
async fn failing_postgres_reports_the_log_tail_and_leaves_no_directory() {
    let bin = open_dir();
    let marker = bin.path().join("dir");
    std::os::unix::fs::symlink(real_binaries().initdb(), bin.path().join("initdb")).unwrap();
    script(
        bin.path(),
        "postgres",
        &format!(
            r#"echo "$2" > {}
echo "FATAL:  fake postgres refuses to start" >&2
exit 1"#,
            marker.display()
        ),
    );
    let err = Cluster::start_with(
        PgBinaries {
            dir: bin.path().to_path_buf(),
        },
        ClusterOptions::default(),
    )
    .await
    .unwrap_err();
    let Error::StartFailed { reason, log_tail } = &err else {
        panic!("want StartFailed, got {err}")
    };
    assert!(reason.contains("exited"), "{reason}");
    assert!(
        log_tail.contains("fake postgres refuses to start"),
        "{log_tail}"
    );
    assert!(err.to_string().contains("fake postgres refuses to start"));
    let dir = recorded_dir(&marker);
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[tokio::test]
async fn a_bad_setting_fails_fast_with_the_server_complaint_and_spares_the_template() {
    // Make sure a template exists, then fail: the caller's mistake must not withdraw it.
    Cluster::start_with(real_binaries(), ClusterOptions::default())
        .await
        .unwrap()
        .stop()
        .await
        .unwrap();
    let templates = || -> Vec<PathBuf> {
        std::fs::read_dir("/tmp")
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.starts_with("ting-pg-template-") && !name.contains('.')
            })
            .collect()
    };
    let before = templates();
    let opts = ClusterOptions {
        extra: vec![("no_such_setting_xyz".into(), "1".into())],
        ..ClusterOptions::default()
    };
    let err = Cluster::start_with(real_binaries(), opts)
        .await
        .unwrap_err();
    let Error::StartFailed { log_tail, .. } = &err else {
        panic!("want StartFailed, got {err}")
    };
    assert!(log_tail.contains("no_such_setting_xyz"), "{log_tail}");
    for t in before {
        assert!(t.exists(), "{} was withdrawn", t.display());
    }
}
