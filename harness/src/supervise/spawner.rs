//! Forks children from one long-lived thread, so their parent-death signal means what it says.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process. A tokio
//! worker or blocking thread can exit while the harness lives on, which would kill its children
//! early. This thread lives until the process dies, so each child gets SIGKILL exactly when the
//! harness dies — including when the harness itself is SIGKILLed.

use std::sync::mpsc;
use std::sync::OnceLock;

use tokio::sync::oneshot;

type Job = (
    tokio::process::Command,
    oneshot::Sender<std::io::Result<tokio::process::Child>>,
);

static SPAWNER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();

/// Spawns `cmd` on the spawner thread with a parent-death SIGKILL; must be called inside a runtime.
pub async fn spawn(mut cmd: tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    set_pdeathsig(&mut cmd);
    let tx = SPAWNER.get_or_init(|| {
        let handle = tokio::runtime::Handle::current();
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("ting-spawner".into())
            .spawn(move || {
                // Entering the runtime lets tokio register each child with its reaper.
                let _guard = handle.enter();
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawn the spawner thread");
        tx
    });
    let (reply, rx) = oneshot::channel();
    tx.send((cmd, reply))
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?;
    rx.await
        .map_err(|_| std::io::Error::other("spawner thread dropped the request"))?
}

#[allow(unsafe_code)]
fn set_pdeathsig(cmd: &mut tokio::process::Command) {
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe functions
    // (prctl, getppid, kill/_exit are all async-signal-safe).
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect: then we were re-parented.
            if libc::getppid() == 1 {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}
