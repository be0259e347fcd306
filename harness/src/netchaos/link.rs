//! One process's database link: the faults on it now (partition, latency, bandwidth), the resets
//! asked of it, and what they did (connections open and reset, bytes held back or delayed).
//!
//! The copy loop ([`pump`]) reads a chunk and writes it on. With no fault on the link it costs
//! one atomic load per chunk on top of the read and the write (the `copy_bidirectional` fast
//! path); only a faulted link takes the lock and may wait. It must never drop a byte it read: a
//! partition holds data until the heal (a real network's TCP retransmits within its retry
//! window, so data is delayed, not lost), and only a `reset` ends connections.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

/// Added one-way delay: `base` plus a uniform draw from `0..=jitter` per chunk (seeded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    pub base: Duration,
    pub jitter: Duration,
}

/// The faults on a link at one moment. Each chaos step sets and clears its own field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    pub partitioned: bool,
    pub latency: Option<Latency>,
    /// Bytes per second, each direction.
    pub bandwidth: Option<u64>,
}

impl Faults {
    fn any(&self) -> bool {
        self.partitioned || self.latency.is_some() || self.bandwidth.is_some()
    }
}

/// What a link's connections did, for a chaos step's `applied` outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Connections open through the link now.
    pub open: u64,
    /// Connections accepted since the link was made.
    pub accepted: u64,
    /// Bytes read while the link was partitioned, forwarded only at the heal.
    pub held: u64,
    /// Bytes forwarded late because of added latency or the bandwidth cap.
    pub delayed: u64,
    /// Connections ended by a `reset`.
    pub reset: u64,
}

/// Which way a chunk goes: the process to PostgreSQL, or back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Up,
    Down,
}

pub struct Link {
    /// The process this link serves, for people (`worker 2`, `api`).
    pub name: String,
    faults: watch::Sender<Faults>,
    /// `faults.any()`, readable without the lock: the fast path.
    active: AtomicBool,
    resets: watch::Sender<u64>,
    open: AtomicU64,
    accepted: AtomicU64,
    held: AtomicU64,
    delayed: AtomicU64,
    reset: AtomicU64,
    rng: Mutex<rand_chacha::ChaCha8Rng>,
    /// When each direction's bandwidth budget is next free.
    paced: Mutex<[Instant; 2]>,
}

impl Link {
    /// A link whose jitter draws derive from `seed`.
    pub fn new(name: impl Into<String>, seed: u64) -> Link {
        let now = Instant::now();
        Link {
            name: name.into(),
            faults: watch::channel(Faults::default()).0,
            active: AtomicBool::new(false),
            resets: watch::channel(0).0,
            open: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            held: AtomicU64::new(0),
            delayed: AtomicU64::new(0),
            reset: AtomicU64::new(0),
            rng: Mutex::new(rand_chacha::ChaCha8Rng::seed_from_u64(seed)),
            paced: Mutex::new([now, now]),
        }
    }

    pub fn counters(&self) -> Counters {
        Counters {
            open: self.open.load(Ordering::SeqCst),
            accepted: self.accepted.load(Ordering::SeqCst),
            held: self.held.load(Ordering::SeqCst),
            delayed: self.delayed.load(Ordering::SeqCst),
            reset: self.reset.load(Ordering::SeqCst),
        }
    }

    pub fn faults(&self) -> Faults {
        *self.faults.borrow()
    }

    /// Changes the link's faults (`f` edits the current ones); waiting chunks see it at once.
    pub fn set(&self, f: impl FnOnce(&mut Faults)) {
        self.faults.send_modify(|cur| {
            f(cur);
            self.active.store(cur.any(), Ordering::SeqCst);
        });
    }

    /// Resets every connection open now (the peers see RST); how many there were.
    pub fn reset_all(&self) -> u64 {
        let n = self.open.load(Ordering::SeqCst);
        self.resets.send_modify(|g| *g += 1);
        n
    }

    /// A connection opened: its guard counts it open until dropped, and its reset signal.
    pub(super) fn opened(&self) -> (OpenGuard<'_>, watch::Receiver<u64>) {
        self.accepted.fetch_add(1, Ordering::SeqCst);
        self.open.fetch_add(1, Ordering::SeqCst);
        let mut rx = self.resets.subscribe();
        rx.borrow_and_update();
        (OpenGuard(self), rx)
    }

    pub(super) fn count_reset(&self) {
        self.reset.fetch_add(1, Ordering::SeqCst);
    }

    /// Waits until a chunk of `n` bytes read now may be written on, per the faults.
    async fn gate(&self, dir: Direction, n: usize) {
        if !self.active.load(Ordering::Relaxed) {
            return;
        }
        let read_at = Instant::now();
        let mut rx = self.faults.subscribe();
        let faults = *rx.borrow_and_update();
        if faults.partitioned {
            self.held.fetch_add(n as u64, Ordering::SeqCst);
            // Held until healed; a sender gone meanwhile ends the wait (the connection ends).
            let _ = rx.wait_for(|f| !f.partitioned).await;
        }
        let faults = *rx.borrow();
        let mut due = read_at;
        if let Some(l) = faults.latency {
            let jitter = if l.jitter.is_zero() {
                Duration::ZERO
            } else {
                let ns = self
                    .rng
                    .lock()
                    .unwrap()
                    .gen_range(0..=l.jitter.as_nanos() as u64);
                Duration::from_nanos(ns)
            };
            due += l.base + jitter;
        }
        if let Some(rate) = faults.bandwidth.filter(|r| *r > 0) {
            let cost = Duration::from_secs_f64(n as f64 / rate as f64);
            let mut paced = self.paced.lock().unwrap();
            let slot = &mut paced[dir as usize];
            let start = (*slot).max(Instant::now());
            *slot = start + cost;
            due = due.max(*slot);
        }
        if due > Instant::now() {
            if !faults.partitioned {
                self.delayed.fetch_add(n as u64, Ordering::SeqCst);
            }
            tokio::time::sleep_until(due.into()).await;
        }
    }
}

/// Counts one connection open while it lives.
pub(super) struct OpenGuard<'a>(&'a Link);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` through `link`'s faults until `from` ends, then shuts `to`'s write
/// side (a half-close passes through).
pub(super) async fn pump<R, W>(
    link: &Link,
    dir: Direction,
    mut from: R,
    mut to: W,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        link.gate(dir, n).await;
        to.write_all(&buf[..n]).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_tracks_whether_any_fault_is_on() {
        let l = Link::new("worker 1", 1);
        assert!(!l.active.load(Ordering::SeqCst));
        l.set(|f| f.partitioned = true);
        assert!(l.active.load(Ordering::SeqCst));
        l.set(|f| {
            f.latency = Some(Latency {
                base: Duration::from_millis(1),
                jitter: Duration::ZERO,
            })
        });
        l.set(|f| f.partitioned = false);
        assert!(l.active.load(Ordering::SeqCst), "latency is still on");
        l.set(|f| f.latency = None);
        assert!(!l.active.load(Ordering::SeqCst));
        assert_eq!(l.faults(), Faults::default());
    }
}
