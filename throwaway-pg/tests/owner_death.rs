//! When the process owning a cluster dies without cleaning up — SIGKILL, or a signal it does
//! not handle — no postgres process of that cluster survives and its directory is removed
//! (or kept, when the owner asked to keep it).
//!
//! The owner is this very test binary, re-executed to run only `hold_cluster_child`, which
//! starts a cluster, prints `READY <postmaster pid> <dir> <watchdog pid>` and waits forever.
//! These tests must never signal anything but the child they spawned.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{alive, children_of, wait_until};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use throwaway_pg::{Cluster, ClusterOptions};

const HOLD_ENV: &str = "TING_PG_HOLD_CHILD";

#[tokio::test]
#[ignore = "runs only as the child process of the owner-death tests"]
async fn hold_cluster_child() {
    let Ok(mode) = std::env::var(HOLD_ENV) else {
        return;
    };
    let mut cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    cluster.set_keep(mode == "keep");
    println!(
        "READY {} {} {}",
        cluster.postmaster_pid().unwrap(),
        cluster.data_dir().display(),
        cluster.watchdog_pid().unwrap()
    );
    std::future::pending::<()>().await;
}

/// SIGKILLs the holder if the test fails before doing so itself, so a failing test never
/// leaves it (and, through it, cargo's output pipe) hanging.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Held {
    owner: KillOnDrop,
    postmaster: u32,
    dir: PathBuf,
    watchdog: u32,
}

fn spawn_holder(mode: &str) -> Held {
    let mut owner = Command::new(std::env::current_exe().unwrap())
        .args([
            "hold_cluster_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOLD_ENV, mode)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = owner.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest prints "test hold_cluster_child ... " first, without a newline.
            if let Some(at) = line.find("READY ") {
                let _ = tx.send(line[at + "READY ".len()..].to_string());
            }
        }
    });
    let owner = KillOnDrop(owner);
    let ready = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the holder never printed READY");
    let parts: Vec<&str> = ready.split(' ').collect();
    Held {
        owner,
        postmaster: parts[0].parse().unwrap(),
        dir: PathBuf::from(parts[1]),
        watchdog: parts[2].parse().unwrap(),
    }
}

#[test]
fn owner_death_leaves_no_postgres_and_no_directory() {
    // (signal sent to the owner, keep requested, directory expected afterwards)
    let cases = [
        (Signal::SIGKILL, false, false),
        (Signal::SIGTERM, false, false),
        (Signal::SIGKILL, true, true),
    ];
    for (sig, keep, dir_remains) in cases {
        let mut held = spawn_holder(if keep { "keep" } else { "clean" });
        assert!(
            alive(held.postmaster),
            "{sig}: cluster not running before the kill"
        );
        // Children come and go (the backend of the readiness probe may still be exiting), so
        // track the ones alive now; the postmaster takes any later ones down with it.
        let mut pids = vec![held.postmaster];
        pids.extend(
            children_of(held.postmaster)
                .into_iter()
                .filter(|p| alive(*p)),
        );
        assert!(
            pids.len() > 1,
            "{sig}: postmaster without auxiliary processes? {pids:?}"
        );
        assert!(held.dir.join("PG_VERSION").exists());

        let killed_at = Instant::now();
        kill(Pid::from_raw(held.owner.0.id() as i32), sig).unwrap();
        held.owner.0.wait().unwrap();

        let gone = wait_until(Duration::from_secs(30), || {
            pids.iter().all(|p| !alive(*p))
                && held.dir.exists() == dir_remains
                && !alive(held.watchdog)
        });
        let survivors: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        assert!(
            gone,
            "{sig} keep={keep}: survivors {survivors:?}, dir exists {}, watchdog alive {}",
            held.dir.exists(),
            alive(held.watchdog)
        );
        println!(
            "{sig} keep={keep}: cleaned up {:?} after the owner died",
            killed_at.elapsed()
        );
        if dir_remains {
            assert!(
                held.dir.join("PG_VERSION").exists(),
                "kept directory lost its data"
            );
            std::fs::remove_dir_all(&held.dir).unwrap();
        }
    }
}
