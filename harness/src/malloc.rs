//! The harness process's allocator settings (glibc only; a no-op elsewhere). Never applied to
//! the stack's processes (`ting-chaos stack …` returns before `main` calls [`tune`]): the stack
//! is measured as it would run in production. While a run lasts, [`Trimmer`] gives the pages of
//! freed buffers back every few seconds, and the phases where the run's memory peaks (before and
//! after judging) call [`trim`] themselves; each trim first samples how much the allocator has
//! handed out ([`peak_in_use_kib`], `report.json` `harness` `peak_heap_kib`).
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

/// The most memory the allocator had handed out at any [`sample`] since [`reset_peak`], in KiB.
static PEAK_IN_USE_KIB: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The memory the allocator has handed out now, in KiB (`mallinfo2`: small chunks in use in its
/// arenas plus the mappings of big blocks, counted whole); `None` off glibc.
#[allow(unsafe_code)]
pub fn in_use_kib() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters, under its own locks.
        let m = unsafe { libc::mallinfo2() };
        Some(((m.uordblks + m.hblkhd) / 1024) as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// Notes [`in_use_kib`] in the peak. [`trim`] calls it, so the peak is sampled every
/// [`Trimmer::EVERY`] while a run lasts and at its phase boundaries.
pub fn sample() {
    if let Some(kib) = in_use_kib() {
        PEAK_IN_USE_KIB.fetch_max(kib, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The most the allocator had handed out at a sample since [`reset_peak`], now included: set
/// beside the peak resident memory, how much of it was the harness's data and how much room
/// freed inside the arenas stayed resident. `None` off glibc.
pub fn peak_in_use_kib() -> Option<u64> {
    sample();
    in_use_kib().map(|_| PEAK_IN_USE_KIB.load(std::sync::atomic::Ordering::Relaxed))
}

/// Starts the peak afresh (a run's own, when one process runs several).
pub fn reset_peak() {
    PEAK_IN_USE_KIB.store(0, std::sync::atomic::Ordering::Relaxed);
}

/// Gives the free memory glibc keeps inside its arenas back to the system (`malloc_trim`): what
/// a flood of short-lived buffers (status answers, parsed pages) left behind between live
/// entries. Costs a walk of the arenas' free lists; call it at phase boundaries and every few
/// seconds while the run settles, never on a request path.
#[allow(unsafe_code)]
pub fn trim() {
    sample();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The peak counts what is allocated at a sample: a block alive then is in it. (Other
    /// tests allocate, free and restart the peak concurrently, so only a lower bound holds.)
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn the_peak_in_use_counts_a_block_alive_at_a_sample() {
        let block: Vec<Box<[u8; 64]>> = (0..65_536).map(|_| Box::new([1u8; 64])).collect();
        let peak = peak_in_use_kib().expect("glibc");
        // 65,536 boxes of 64 bytes: 4 MiB and their list.
        assert!(peak >= 4 * 1024, "a peak of {peak} KiB");
        assert!(std::hint::black_box(&block).len() == 65_536);
    }
}
