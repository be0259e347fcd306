//! The run's ledger as it is recorded: each entry written whole to `ledger.jsonl` at once, and
//! kept in memory only as the checkers' [`Entry`].
//!
//! The fakes' ledger spools to a [`Journal`] for the whole run ([`Ledger::spool`]), so no e-mail
//! body, header or callback URL stays in memory after it is on disk. The file is written in
//! `seq` order under the ledger's lock and committed (flushed, synced, renamed) when the report
//! is written; a run that stops before leaves no `ledger.jsonl`. Must never change what a
//! checker sees: an [`Entry`] is made by [`Entry::of`], as the checkers' tests make theirs.

use std::path::Path;
use std::sync::{Arc, Mutex};

use mock_providers::ledger::{Ledger, LedgerEntry, Spool};

use crate::check::{Entry, Interner, Keep};
use crate::report::atomic::AtomicFile;

/// What the run kept of its ledger, shared between the ledger's spool and the harness.
struct Kept {
    entries: Vec<Entry>,
    /// Set once judging took the entries: later ones (reports to a stopped stack) go to disk
    /// only.
    frozen: bool,
    names: Interner,
    keep: Keep,
    file: Option<AtomicFile>,
    /// The first error writing the file.
    error: Option<String>,
}

/// The run's ledger: `ledger.jsonl` being written, and the checkers' entries.
#[derive(Clone)]
pub struct Journal {
    kept: Arc<Mutex<Kept>>,
}

/// The ledger's side: takes each entry under the ledger's lock.
struct Taker(Arc<Mutex<Kept>>);

impl Spool for Taker {
    fn take(&mut self, entry: &LedgerEntry) {
        let mut kept = self.0.lock().expect("journal poisoned");
        let kept = &mut *kept;
        if let (Some(file), None) = (&mut kept.file, &kept.error) {
            let w = file.writer();
            let line = serde_json::to_writer(&mut *w, entry)
                .map_err(std::io::Error::other)
                .and_then(|()| w.write_all(b"\n"));
            if let Err(e) = line {
                kept.error = Some(format!("write ledger.jsonl: {e}"));
            }
        }
        if !kept.frozen {
            let e = Entry::of(entry, &kept.names, &kept.keep);
            kept.entries.push(e);
        }
    }
}

impl Journal {
    /// Entries a delivery is given room for up front: its send and two delivery reports (an
    /// SMS's `sent` and `delivered`). campaign-100k records 2.24 a delivery; a run that records
    /// more grows the list, copying it once each time it doubles.
    pub const ROOM_PER_DELIVERY: usize = 3;

    /// Starts spooling `ledger` to `dir/ledger.jsonl` (a temporary file until
    /// [`Journal::commit`]), keeping the HTML parts `keep` names; the entries' strings share
    /// the copies in `names`. The list of entries has room for [`Journal::ROOM_PER_DELIVERY`]
    /// per delivery of the run's `deliveries` from the start: grown by doubling, it may be
    /// copied whole, both copies resident for a moment (at 100,000 recipients, 54 MB on top of
    /// the run's peak); room never written takes no memory (the allocator maps fresh pages for
    /// a block this big, unless it has freed ones of that size at hand).
    pub fn start(
        ledger: &Ledger,
        dir: &Path,
        (keep, names): (Keep, Interner),
        deliveries: usize,
    ) -> anyhow::Result<Journal> {
        let file = AtomicFile::create(&dir.join("ledger.jsonl"))?;
        let room = deliveries.saturating_mul(Journal::ROOM_PER_DELIVERY);
        let kept = Arc::new(Mutex::new(Kept {
            entries: Vec::with_capacity(room),
            frozen: false,
            names,
            keep,
            file: Some(file),
            error: None,
        }));
        ledger.spool(Box::new(Taker(kept.clone())));
        Ok(Journal { kept })
    }

    /// Calls `f` with the entries from `seq` on (all of them when `seq` is 0).
    pub fn since<R>(&self, seq: u64, f: impl FnOnce(&[Entry]) -> R) -> R {
        let kept = self.kept.lock().expect("journal poisoned");
        let from = kept.entries.partition_point(|e| e.seq < seq);
        f(&kept.entries[from..])
    }

    /// The run's interned strings (a handle on the table the entries share).
    pub fn names(&self) -> Interner {
        self.kept.lock().expect("journal poisoned").names.clone()
    }

    /// Takes the entries recorded so far, for judging; later ones are only written to disk.
    pub fn freeze(&self) -> Vec<Entry> {
        let mut kept = self.kept.lock().expect("journal poisoned");
        kept.frozen = true;
        // Kept with its room: never written, it takes no memory, and shrinking a big block can
        // copy it.
        std::mem::take(&mut kept.entries)
    }

    /// Stops spooling `ledger` and commits `ledger.jsonl`; an error writing it at any time is
    /// returned here.
    pub fn commit(&self, ledger: &Ledger) -> anyhow::Result<()> {
        ledger.unspool();
        let mut kept = self.kept.lock().expect("journal poisoned");
        if let Some(e) = kept.error.take() {
            kept.file = None;
            anyhow::bail!(e);
        }
        match kept.file.take() {
            Some(file) => file.commit(),
            None => anyhow::bail!("ledger.jsonl was committed already"),
        }
    }
}

#[cfg(test)]
mod tests {
    use mock_providers::ledger::{EntryKind, Provider};

    use super::*;

    /// Every entry reaches `ledger.jsonl` whole, in order; memory keeps only the checkers' view,
    /// and nothing is left of the body but its length.
    #[test]
    fn the_file_gets_whole_entries_and_memory_the_checkers_view() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new();
        let mut first = LedgerEntry::draft(Provider::Sms, EntryKind::Send, "+15550001");
        first.body = Some("x".repeat(1_000));
        ledger.record(first);
        let journal =
            Journal::start(&ledger, dir.path(), (Keep::NoHtml, Interner::default()), 2).unwrap();
        assert!(
            !dir.path().join("ledger.jsonl").exists(),
            "committed only at the end"
        );
        let room = journal.kept.lock().unwrap().entries.capacity();
        assert!(room >= 2 * Journal::ROOM_PER_DELIVERY, "room for {room}");
        ledger.record(LedgerEntry::draft(Provider::Line, EntryKind::Send, "U1"));
        assert!(
            ledger.snapshot_shared().is_empty(),
            "the ledger retains nothing"
        );
        assert_eq!(journal.since(1, |new| new.len()), 1);
        let judged = journal.freeze();
        assert_eq!(judged.iter().map(|e| e.seq).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(judged[0].body_chars(), 1_000);
        ledger.record(LedgerEntry::draft(Provider::Line, EntryKind::Send, "U2"));
        assert_eq!(
            journal.since(0, |all| all.len()),
            0,
            "frozen: later ones go to disk"
        );
        journal.commit(&ledger).unwrap();
        let text = std::fs::read_to_string(dir.path().join("ledger.jsonl")).unwrap();
        let lines: Vec<LedgerEntry> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].body.as_deref().map(str::len), Some(1_000));
        assert_eq!(lines[2].recipient, "U2");
        assert!(journal.commit(&ledger).is_err(), "committed once");
    }
}
