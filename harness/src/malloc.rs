//! The harness process's allocator settings (glibc only; a no-op elsewhere). Never applied to
//! the stack's processes (`ting-chaos stack …` returns before `main` calls [`tune`]): the stack
//! is measured as it would run in production. While a run lasts, [`Trimmer`] gives the pages of
//! freed buffers back every few seconds, and the phases where the run's memory peaks (before and
//! after judging) call [`trim`] themselves.
//!
//! A run's memory is many small ledger entries that live to the end plus a few big short-lived
//! buffers (a status API answer for a batch of 10,000 recipients is tens of megabytes, read and
//! parsed once a second). With glibc's defaults the many threads of the fakes' and the
//! harness's runtimes get up to eight arenas per core, and each big buffer freed raises the
//! mmap threshold so that the next one is carved out of an arena: freed, it stays resident
//! between live entries. Restart-midway at 20,000 recipients peaked at 497 MB resident with the
//! defaults and 426 MB with these settings, for the same live heap.

/// Arenas at most: the harness's threads mostly wait on the network, not on `malloc`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENA_MAX: i32 = 2;

/// Allocations from this size up get their own mapping, returned to the system when freed.
/// Fixed, so that glibc's dynamic threshold never moves the big buffers into an arena.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 1 << 20;

/// Applies the settings; call it first thing in `main`, before any thread is started.
#[allow(unsafe_code)]
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before other threads
    // exist and its failure (return 0) leaves the defaults in place, which is harmless.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Gives the free memory glibc keeps inside its arenas back to the system (`malloc_trim`): what
/// a flood of short-lived buffers (status answers, parsed pages) left behind between live
/// entries. Costs a walk of the arenas' free lists; call it at phase boundaries and every few
/// seconds while the run settles, never on a request path.
#[allow(unsafe_code)]
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free pages; it takes the allocator's own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Calls [`trim`] every [`Trimmer::EVERY`] on a thread of its own until dropped: a run frees
/// big batches of small buffers at moments no phase boundary marks (a batch's body and
/// recipients once it is posted, a status view replaced), and glibc keeps their pages resident
/// until asked.
pub struct Trimmer {
    stop: Option<std::sync::mpsc::Sender<()>>,
}

impl Trimmer {
    pub const EVERY: std::time::Duration = std::time::Duration::from_secs(5);

    /// Starts the thread; without one (it could not be spawned) nothing is trimmed but at the
    /// phase boundaries.
    pub fn start() -> Trimmer {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("malloc-trim".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(Trimmer::EVERY)
                {
                    trim();
                }
            });
        Trimmer {
            stop: spawned.ok().map(|_| stop),
        }
    }
}

impl Drop for Trimmer {
    fn drop(&mut self) {
        // The thread wakes at once and ends.
        self.stop.take();
    }
}
