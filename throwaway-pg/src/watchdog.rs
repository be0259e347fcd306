//! The watchdog: cleans up a private cluster when its owner dies without doing so itself,
//! including by SIGKILL, which no in-process handler can see.
//!
//! Why a watchdog process rather than `PR_SET_PDEATHSIG` on postgres: the death signal fires
//! when the *thread* that forked exits, not the process, so with tokio's thread pool it kills
//! postgres early; and it cannot remove the data directory. Instead a tiny `/bin/sh` script runs
//! with its stdin a pipe from the owner. The owner's write end is close-on-exec (std creates it
//! so), so no other child inherits it, and the kernel closes it whenever the owner dies. The
//! script reads commands from the pipe (`pid N`, `nopid`, `keep`, `exit`); at end-of-file
//! without `exit` it sends SIGQUIT (immediate shutdown; SIGINT when keeping the data) to the
//! postmaster it was told about and to the one named in `postmaster.pid`, waits up to 10 s for
//! them to die (zombies count as dead: PID 1 may never reap them), SIGKILLs survivors and removes
//! the directory unless told `keep`. It lives in its own process group and ignores SIGINT/SIGHUP,
//! so a Ctrl-C aimed at the owner does not take it down first.
//!
//! This module must never signal anything itself; it only talks to the script.

use std::io::Write;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Error;

const SCRIPT: &str = r#"
trap '' INT HUP PIPE
dir=$1
pid=
keep=
while IFS= read -r line; do
  case $line in
    "pid "*) pid=${line#pid } ;;
    nopid) pid= ;;
    keep) keep=1 ;;
    exit) exit 0 ;;
  esac
done
alive() {
  st=
  { read -r _ _ st _ < "/proc/$1/stat"; } 2>/dev/null
  [ -n "$st" ] && [ "$st" != Z ]
}
pids=$pid
if [ -r "$dir/postmaster.pid" ]; then
  p=
  { read -r p < "$dir/postmaster.pid"; } 2>/dev/null
  pids="$pids $p"
fi
valid=
for p in $pids; do
  case $p in ''|*[!0-9]*) ;; *) valid="$valid $p" ;; esac
done
sig=QUIT
[ -n "$keep" ] && sig=INT
for p in $valid; do kill -$sig "$p" 2>/dev/null; done
n=0
while [ $n -lt 100 ]; do
  any=
  for p in $valid; do alive "$p" && any=1; done
  [ -z "$any" ] && break
  sleep 0.1
  n=$((n+1))
done
for p in $valid; do alive "$p" && kill -KILL "$p" 2>/dev/null; done
[ -n "$keep" ] || rm -rf "$dir"
"#;

/// The owner's end of a running watchdog. Dropping it tells the watchdog the owner cleaned up
/// (`exit`) and reaps it.
#[derive(Debug)]
pub(crate) struct Watchdog {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Watchdog {
    /// Starts a watchdog responsible for `dir`.
    pub fn spawn(dir: &Path) -> Result<Watchdog, Error> {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(SCRIPT)
            .arg("ting-pg-watchdog")
            .arg(dir)
            .env("PATH", "/usr/bin:/bin")
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(Error::io("spawn the cluster watchdog (/bin/sh)"))?;
        let stdin = child.stdin.take();
        Ok(Watchdog { child, stdin })
    }

    /// The watchdog's own pid (tests use it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Tells the watchdog which process to kill if the owner dies (`None`: none now).
    pub fn track(&mut self, pid: Option<u32>) {
        match pid {
            Some(pid) => self.send(&format!("pid {pid}")),
            None => self.send("nopid"),
        }
    }

    /// Tells the watchdog to leave the directory in place when the owner dies.
    pub fn keep(&mut self) {
        self.send("keep");
    }

    fn send(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            if let Err(e) = writeln!(stdin, "{line}") {
                tracing::warn!(error = %e, "cluster watchdog is gone; SIGKILL of this process would orphan postgres");
            }
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.send("exit");
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match self.child.try_wait() {
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Ok(None) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return;
                }
                _ => return,
            }
        }
    }
}
