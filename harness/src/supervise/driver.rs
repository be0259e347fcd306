//! The driver seam: how a stack process is started, signalled and observed. The supervisor keeps
//! the records, the bookkeeping and the rules (what counts as asked for, as a crash); a driver only
//! does the three things that depend on where processes run. [`Local`] forks children on this
//! machine; a driver for processes the harness does not fork itself (a container, a Kubernetes
//! pod: docs/distributed.md) is another implementation of [`Driver`], not a rewrite.

use std::fs::File;
use std::process::Stdio;

use anyhow::Context;
use futures::future::BoxFuture;
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use super::{spawner, Spec};

/// How a process ended: its exit code, or the signal that ended it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ended {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// A started process: its id (what signals and records name) and a future resolving, once, to
/// how it ended.
pub struct Started {
    pub id: u32,
    pub ended: BoxFuture<'static, Ended>,
}

/// Where stack processes run.
pub trait Driver: Send + Sync {
    /// Starts `spec` with its stdout and stderr appended to `log`.
    fn start(&self, spec: &Spec, log: File) -> BoxFuture<'static, anyhow::Result<Started>>;

    /// Delivers `sig` to the process and everything it started. A process already gone is not an
    /// error.
    fn signal(&self, id: u32, sig: Signal) -> anyhow::Result<()>;

    /// The process's scheduler state, as `/proc/<pid>/stat` spells it (`T` stopped, `R`/`S`/`D`
    /// running or sleeping, `Z` exiting); `None` when it is gone.
    fn state(&self, id: u32) -> Option<char>;

    /// The process's peak resident memory so far, in KiB; `None` when it is gone or the driver
    /// cannot see it.
    fn peak_rss_kib(&self, _id: u32) -> Option<u64> {
        None
    }
}

/// Children of this process: each in its own process group (a signal reaches anything it forked),
/// killed with the harness (parent-death signal, see [`spawner`]), observed through `/proc`.
pub struct Local;

impl Driver for Local {
    fn start(&self, spec: &Spec, log: File) -> BoxFuture<'static, anyhow::Result<Started>> {
        let setup = (|| {
            let (program, args) = spec.argv.split_first().context("empty command")?;
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args)
                .envs(&spec.env)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .process_group(0)
                .kill_on_drop(false);
            if let Some(cwd) = &spec.cwd {
                cmd.current_dir(cwd);
            }
            anyhow::Ok(cmd)
        })();
        let what = format!("start {} ({})", spec.role, spec.argv.join(" "));
        Box::pin(async move {
            let mut child = spawner::spawn(setup?).await.context(what)?;
            let id = child.id().context("child has no pid")?;
            let ended = Box::pin(async move {
                use std::os::unix::process::ExitStatusExt;
                match child.wait().await {
                    Ok(st) => Ended {
                        code: st.code(),
                        signal: st.signal(),
                    },
                    Err(_) => Ended::default(),
                }
            });
            Ok(Started { id, ended })
        })
    }

    fn signal(&self, id: u32, sig: Signal) -> anyhow::Result<()> {
        match signal::killpg(Pid::from_raw(id as i32), sig) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("send {sig} to {id}")),
        }
    }

    fn state(&self, id: u32) -> Option<char> {
        process_state(id)
    }

    fn peak_rss_kib(&self, id: u32) -> Option<u64> {
        crate::cpu::peak_rss_kib(Some(id))
    }
}

/// The state letter of `pid` in `/proc/<pid>/stat` (`R`, `S`, `D`, `T`, `Z`, …); `None` when the
/// process is gone. The letter follows the command name's closing parenthesis, which may itself
/// contain spaces or parentheses.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_of_this_process_is_running() {
        let me = std::process::id();
        assert!(matches!(process_state(me), Some('R' | 'S')));
        assert_eq!(process_state(u32::MAX), None);
    }
}
