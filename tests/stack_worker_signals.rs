//! The reference stack's worker as a real process: a SIGTERM that arrives during start-up (here,
//! while the database has not answered the connection yet) ends it with exit code 0, at once —
//! not the default action of the signal (killed) and not after the connect timeout.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn sigterm_during_worker_start_up_exits_0() {
    // A "database" that accepts the connection and never says a word.
    let db = TcpListener::bind("127.0.0.1:0").unwrap();
    db.set_nonblocking(true).unwrap();
    let addr = db.local_addr().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ting-chaos"))
        .args(["stack", "worker"])
        .env(
            "TING_DATABASE_URL",
            format!("postgres://postgres@{addr}/ting"),
        )
        .env("TING_WORKER_ID", "w-start-up")
        .env("TING_SHUTDOWN_GRACE_MS", "5000")
        .env_remove("TING_STACK_FLAWS")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The worker is in start-up once it has connected.
    let deadline = Instant::now() + Duration::from_secs(30);
    let _held = loop {
        match db.accept() {
            Ok((sock, _)) => break sock,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("the worker exited before connecting: {status}");
                }
                assert!(Instant::now() < deadline, "the worker never connected");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("{e}"),
        }
    };
    let t0 = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(8) {
            let _ = child.kill();
            panic!("the worker did not exit within 8 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0), "{status}");
    // Well under the pool's 10 s acquire timeout, which a worker that ignored the signal during
    // start-up would wait out (slack for a loaded machine).
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}
