//! The process's allocator: jemalloc, for every role of the binary (the harness with its fakes,
//! and the reference stack's processes, which run from the same executable). While a run lasts,
//! [`Trimmer`] samples how much is allocated and gives freed pages back every few seconds, and
//! the phases where the run's memory peaks (before and between the checkers) call [`trim`]
//! themselves; each trim first samples how much the allocator has handed out
//! ([`peak_in_use_kib`], `report.json` `harness` `peak_heap_kib`).
//!
//! A run's memory is many small ledger entries that live to the end, beside floods of
//! short-lived ones: a status API answer for a batch of 10,000 recipients parsed once a second,
//! the fakes' queued delivery reports, each checker's indexes. glibc's malloc (even held to two
//! arenas and trimmed every 5 s) kept the room those freed resident between the long-lived
//! entries: campaign-100k sat at ~360 MB resident through the settle for ~295 MB allocated, and
//! peaked at 387–389 MB. jemalloc keeps blocks of one size class together and gives back whole
//! free pages ([`CONF`]): the same run peaked at 350 MB and took ~8% less CPU
//! (`reports/bench/README.md`, footnote 13).
//!
//! jemalloc does not move a big block in place when it grows (glibc remapped it), so a list
//! that grows by doubling is copied, and both copies are resident for a moment. The biggest
//! get their room up front or grow in chunks: the run's briefs of its ledger entries
//! (`run::journal`), the entries read back to judge (exactly their count), the fakes' line of
//! delivery reports due (chunks, `mock_providers` `callbacks/fifo.rs`); the fakes' heap of
//! reports not due yet still doubles, and stays small.

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read before `main` (its `malloc_conf`, under the prefix this build of
/// jemalloc carries): two arenas (the default, four per core, kept restart-midway's harness at
/// 58 MB against 50; its threads mostly wait on the network, and each has its own cache of
/// small blocks); a background thread returns freed pages a second after they fall free,
/// directly (no "muzzy" stage that `MADV_FREE` would leave counted as resident until the
/// kernel needs it).
/// A user's `_RJEM_MALLOC_CONF` environment variable is read after it and overrides it.
#[allow(unsafe_code, non_upper_case_globals)]
// SAFETY: jemalloc reads the symbol as a `const char *`: a `&'static [u8; N]` is one thin
// pointer, to a NUL-terminated string that lives as long as the process; the only other
// definition of the name is jemalloc's own weak default, which this one replaces.
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static CONF: &[u8; 70] =
    b"narenas:2,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

/// The most memory the allocator had handed out at any [`sample`] since [`reset_peak`], in KiB.
static PEAK_IN_USE_KIB: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A number jemalloc keeps: any bit pattern of its size is a value, so a read that jemalloc
/// refuses half-way (it copies what fits, then says the size was wrong) leaves no invalid one.
trait Number: Copy + Default {}
impl Number for u8 {}
impl Number for u32 {}
impl Number for usize {}
impl Number for isize {}

/// Reads the number jemalloc keeps under `name` (a NUL-terminated mallctl name), as `T`: the
/// number's own C type (`size_t`, `ssize_t`, `unsigned`; `u8` for a `bool`), or jemalloc
/// refuses the read.
#[allow(unsafe_code)]
fn read<T: Number>(name: &std::ffi::CStr) -> Option<T> {
    let mut value = T::default();
    let mut len = std::mem::size_of::<T>();
    // SAFETY: `name` is NUL-terminated; `value` and `len` are valid for writes of `len` bytes,
    // and jemalloc copies at most `len` bytes; `T` is a plain number (`Number`), valid
    // whatever it copied. Nothing is written to jemalloc.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            (&raw mut value).cast(),
            &raw mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0).then_some(value)
}

/// The memory the allocator has handed out now, in KiB (jemalloc's `stats.allocated`: the
/// blocks the program holds, big ones counted whole even where never written), refreshed first.
#[allow(unsafe_code)]
pub fn in_use_kib() -> Option<u64> {
    let mut epoch: u64 = 1;
    // SAFETY: writing `epoch` (a u64, its type) only refreshes jemalloc's statistics.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"epoch".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&raw mut epoch).cast(),
            std::mem::size_of::<u64>(),
        );
    }
    read::<usize>(c"stats.allocated").map(|b| b as u64 / 1024)
}

/// Notes [`in_use_kib`] in the peak. [`trim`] calls it, so the peak is sampled every
/// [`Trimmer::EVERY`] while a run lasts and at its phase boundaries.
pub fn sample() {
    if let Some(kib) = in_use_kib() {
        PEAK_IN_USE_KIB.fetch_max(kib, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The most the allocator had handed out at a sample since [`reset_peak`], now included: set
/// beside the peak resident memory, how much of it was the harness's data and how much was
/// room the allocator kept. `None` when its statistics cannot be read.
pub fn peak_in_use_kib() -> Option<u64> {
    sample();
    in_use_kib().map(|_| PEAK_IN_USE_KIB.load(std::sync::atomic::Ordering::Relaxed))
}

/// Starts the peak afresh (a run's own, when one process runs several).
pub fn reset_peak() {
    PEAK_IN_USE_KIB.store(0, std::sync::atomic::Ordering::Relaxed);
}

/// Gives every freed page back to the system now (jemalloc's `arena.<all>.purge`), without
/// waiting for the background thread: what a checker's indexes or a flood of parsed answers
/// left. Call it at phase boundaries and between checkers, never on a request path.
#[allow(unsafe_code)]
pub fn trim() {
    // The settings are read by jemalloc, not by Rust: named here, their object is linked into
    // every binary that trims, whatever the linker keeps.
    std::hint::black_box(CONF.as_ptr());
    sample();
    // "arena.<MALLCTL_ARENAS_ALL>.purge": 4096 names every arena.
    // SAFETY: a purge takes no value and returns none; it only releases free pages.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"arena.4096.purge".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

/// Calls [`trim`] every [`Trimmer::EVERY`] on a thread of its own until dropped: the peak of
/// what is allocated is sampled there between phase boundaries.
pub struct Trimmer {
    stop: Option<std::sync::mpsc::Sender<()>>,
}

impl Trimmer {
    pub const EVERY: std::time::Duration = std::time::Duration::from_secs(5);

    /// Starts the thread; without one (it could not be spawned) nothing is sampled but at the
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
    #[test]
    fn the_peak_in_use_counts_a_block_alive_at_a_sample() {
        let block: Vec<Box<[u8; 64]>> = (0..65_536).map(|_| Box::new([1u8; 64])).collect();
        let peak = peak_in_use_kib().expect("jemalloc's statistics");
        // 65,536 boxes of 64 bytes: 4 MiB and their list.
        assert!(peak >= 4 * 1024, "a peak of {peak} KiB");
        assert!(std::hint::black_box(&block).len() == 65_536);
    }

    /// The settings are one NUL-terminated string, as jemalloc reads them, and took effect.
    #[test]
    fn the_settings_are_read_by_jemalloc() {
        assert_eq!(CONF.iter().position(|b| *b == 0), Some(CONF.len() - 1));
        assert!(std::str::from_utf8(&CONF[..CONF.len() - 1]).is_ok());
        assert_eq!(read::<u8>(c"background_thread"), Some(1));
        assert_eq!(read::<isize>(c"opt.muzzy_decay_ms"), Some(0));
        assert_eq!(read::<isize>(c"opt.dirty_decay_ms"), Some(1000));
        assert_eq!(read::<u32>(c"opt.narenas"), Some(2));
    }
}
