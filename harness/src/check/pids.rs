//! Which process sent each send: ledger `seq` → the sender's pid, as attribution found it.
//!
//! Ledger seqs are dense from 0, and most entries a big run records are sends (the rest are
//! delivery reports and polls), so the table is a list by seq with one 4-byte slot per entry:
//! ~2.7 MB at 100,000 recipients × 3 channels, where a hash map of the same 310,000 sends took
//! ~9 MB (and twice that while it grew).

use std::num::NonZeroU32;

/// Ledger `seq` → pid of the sender; a seq with none was not attributed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pids(Vec<Option<NonZeroU32>>);

impl Pids {
    /// The sender of `seq`, when attribution found one.
    pub fn get(&self, seq: u64) -> Option<u32> {
        let i = usize::try_from(seq).ok()?;
        self.0.get(i).copied().flatten().map(NonZeroU32::get)
    }

    pub fn contains(&self, seq: u64) -> bool {
        self.get(seq).is_some()
    }

    /// Records `pid` as the sender of `seq`. Pid 0 is no process: it records nothing.
    pub fn insert(&mut self, seq: u64, pid: u32) {
        let (Ok(i), Some(pid)) = (usize::try_from(seq), NonZeroU32::new(pid)) else {
            return;
        };
        if i >= self.0.len() {
            self.0.resize(i + 1, None);
        }
        self.0[i] = Some(pid);
    }

    /// Forgets the sender of `seq`.
    pub fn remove(&mut self, seq: u64) {
        if let Some(slot) = usize::try_from(seq).ok().and_then(|i| self.0.get_mut(i)) {
            *slot = None;
        }
    }

    /// The attributed sends.
    pub fn len(&self) -> usize {
        self.0.iter().filter(|p| p.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl FromIterator<(u64, u32)> for Pids {
    fn from_iter<I: IntoIterator<Item = (u64, u32)>>(pairs: I) -> Pids {
        let mut pids = Pids::default();
        for (seq, pid) in pairs {
            pids.insert(seq, pid);
        }
        pids
    }
}

impl<const N: usize> From<[(u64, u32); N]> for Pids {
    fn from(pairs: [(u64, u32); N]) -> Pids {
        pairs.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seq_reads_back_its_sender_and_others_none() {
        let mut pids = Pids::from([(0, 7), (5, 8)]);
        assert_eq!(pids.get(0), Some(7));
        assert_eq!(pids.get(5), Some(8));
        assert_eq!(pids.get(3), None, "a gap");
        assert_eq!(pids.get(6), None, "past the end");
        assert_eq!(pids.get(u64::MAX), None);
        pids.insert(3, 9);
        pids.insert(5, 10);
        assert_eq!((pids.get(3), pids.get(5)), (Some(9), Some(10)));
        pids.remove(3);
        pids.remove(99);
        assert!(!pids.contains(3));
        assert_eq!(pids.len(), 2);
    }

    #[test]
    fn pid_zero_is_no_process() {
        let mut pids = Pids::default();
        pids.insert(2, 0);
        assert!(!pids.contains(2));
        assert!(pids.is_empty());
    }
}
