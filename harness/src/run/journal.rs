//! The run's ledger as it is recorded: each entry written whole to `ledger.jsonl` at once, kept
//! in memory only as a [`Brief`] while the run goes on, and read back from the file as the
//! checkers' [`Entry`] once the stack has stopped.
//!
//! The fakes' ledger spools to a [`Journal`] for the whole run ([`Ledger::spool`]), so no e-mail
//! body, header or callback URL stays in memory after it is on disk. The file is written in
//! `seq` order under the ledger's lock and committed (flushed, synced, renamed) when the report
//! is written; a run that stops before leaves no `ledger.jsonl`. While the run records, what it
//! reads of its ledger (which deliveries the ledger has settled, which had a delivery report, a
//! partial report's summary) is a [`Brief`] of 24 bytes an entry; judging reads every entry back
//! from the file ([`Journal::freeze`]), so the checkers' entries (two thirds of a million at
//! 100,000 recipients, ~85 MB) are not resident beside the fakes' stores and the report backlog
//! while the run settles. Must never change what a checker sees: an [`Entry`] is made by
//! [`Entry::of`] from the entry as `ledger.jsonl` has it, as `ting-chaos report DIR` and the
//! checkers' tests make theirs, and the file's entries round-trip whole.

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use mock_providers::ledger::{
    CallbackVariant, EntryKind, Ledger, LedgerEntry, Outcome, Provider, Spool,
};

use crate::check::{Entry, Interner, Keep, Name};
use crate::report::atomic::AtomicFile;
use crate::report::read_entries;

/// What the run reads of a ledger entry while it records ([`Journal::since`]): whose send it
/// was and how it ended, and of a delivery report its variant and what the stack answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Brief {
    pub seq: u64,
    /// Shared through the run's [`Interner`].
    pub recipient: Name,
    /// What the stack answered a delivery report with (none: no answer).
    pub response: Option<u16>,
    pub provider: Provider,
    pub kind: EntryKind,
    pub outcome: Outcome,
    pub variant: Option<CallbackVariant>,
}

impl Brief {
    /// `e`'s brief; its recipient and message id go into `names` (the status view shares the
    /// copies, and the checkers' entries take them when they are read back).
    pub fn of(e: &LedgerEntry, names: &Interner) -> Brief {
        if let Some(id) = &e.message_id {
            names.name(id);
        }
        Brief {
            seq: e.seq,
            recipient: names.name(&e.recipient),
            response: e.callback_response,
            provider: e.provider,
            kind: e.kind,
            outcome: e.outcome,
            variant: e.callback_variant,
        }
    }
}

/// What the run kept of its ledger, shared between the ledger's spool and the harness.
struct Kept {
    briefs: Vec<Brief>,
    /// Set once judging took the entries: later ones (reports to a stopped stack) go to disk
    /// only.
    frozen: bool,
    names: Interner,
    keep: Keep,
    file: Option<AtomicFile>,
    /// The first error writing the file.
    error: Option<String>,
}

/// The run's ledger: `ledger.jsonl` being written, and the run's briefs of its entries.
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
            let brief = Brief::of(entry, &kept.names);
            kept.briefs.push(brief);
        }
    }
}

impl Journal {
    /// Entries a delivery is given room for up front: its send and two delivery reports (an
    /// SMS's `sent` and `delivered`). campaign-100k records 2.24 a delivery; a run that records
    /// more grows the list, copying it once each time it doubles.
    pub const ROOM_PER_DELIVERY: usize = 3;

    /// Starts spooling `ledger` to `dir/ledger.jsonl` (a temporary file until
    /// [`Journal::commit`]); the checkers' entries will keep the HTML parts `keep` names, and
    /// every string is shared through `names`. The list of briefs has room for
    /// [`Journal::ROOM_PER_DELIVERY`] per delivery of the run's `deliveries` from the start:
    /// grown by doubling, it may be copied whole, both copies resident for a moment; room never
    /// written takes no memory (the allocator maps fresh pages for a block this big, unless it
    /// has freed ones of that size at hand).
    pub fn start(
        ledger: &Ledger,
        dir: &Path,
        (keep, names): (Keep, Interner),
        deliveries: usize,
    ) -> anyhow::Result<Journal> {
        let file = AtomicFile::create(&dir.join("ledger.jsonl"))?;
        let room = deliveries.saturating_mul(Journal::ROOM_PER_DELIVERY);
        let kept = Arc::new(Mutex::new(Kept {
            briefs: Vec::with_capacity(room),
            frozen: false,
            names,
            keep,
            file: Some(file),
            error: None,
        }));
        ledger.spool(Box::new(Taker(kept.clone())));
        Ok(Journal { kept })
    }

    /// Calls `f` with the briefs of the entries from `seq` on (all of them when `seq` is 0).
    pub fn since<R>(&self, seq: u64, f: impl FnOnce(&[Brief]) -> R) -> R {
        let kept = self.kept.lock().expect("journal poisoned");
        let from = kept.briefs.partition_point(|e| e.seq < seq);
        f(&kept.briefs[from..])
    }

    /// The run's interned strings (a handle on the table the entries share); an empty one
    /// once [`Journal::freeze`] has read the entries back.
    pub fn names(&self) -> Interner {
        self.kept.lock().expect("journal poisoned").names.clone()
    }

    /// Stops keeping briefs and reads every entry recorded so far back from `ledger.jsonl`, as
    /// the checkers' [`Entry`]; later ones are only written to disk. `Err` when the file could
    /// not be written or does not read back whole: then the run cannot be judged.
    pub fn freeze(&self) -> anyhow::Result<Vec<Entry>> {
        let mut kept = self.kept.lock().expect("journal poisoned");
        let kept = &mut *kept;
        anyhow::ensure!(!kept.frozen, "the journal was frozen already");
        kept.frozen = true;
        if let Some(e) = &kept.error {
            anyhow::bail!("{e}");
        }
        let file = kept
            .file
            .as_mut()
            .context("ledger.jsonl was committed already")?
            .read_back()?;
        let recorded = kept.briefs.len();
        let mut entries = Vec::with_capacity(recorded);
        let lines = std::io::BufReader::new(file);
        for (n, entry) in read_entries(lines, &kept.names, &kept.keep).enumerate() {
            let entry = entry.with_context(|| format!("read back ledger.jsonl entry {}", n + 1))?;
            entries.push(entry);
        }
        anyhow::ensure!(
            entries.len() == recorded,
            "read back {} entries of ledger.jsonl, {recorded} were recorded",
            entries.len()
        );
        // Read back whole: the briefs (kept until now for a partial report's summary) and the
        // table of shared strings go. Each entry holds its own handles on the texts it shares
        // with the expected deliveries and the status rows, and nothing is interned from here
        // on (~25 MB at 100,000 recipients).
        kept.briefs = Vec::new();
        kept.names = Interner::default();
        Ok(entries)
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
    use mock_providers::ledger::{EmailDetail, HeaderField};

    use super::*;

    /// Every entry reaches `ledger.jsonl` whole, in order; memory keeps only its brief while
    /// the run records, and judging reads the checkers' view back, nothing left of the body but
    /// its length.
    #[test]
    fn the_file_gets_whole_entries_and_memory_a_brief_until_judged() {
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
        let room = journal.kept.lock().unwrap().briefs.capacity();
        assert!(room >= 2 * Journal::ROOM_PER_DELIVERY, "room for {room}");
        assert!(std::mem::size_of::<Brief>() <= 24);
        ledger.record(LedgerEntry::draft(Provider::Line, EntryKind::Send, "U1"));
        assert!(
            ledger.snapshot_shared().is_empty(),
            "the ledger retains nothing"
        );
        let briefs = journal.since(1, |new| new.to_vec());
        assert_eq!(briefs.len(), 1);
        assert_eq!((briefs[0].seq, briefs[0].recipient.as_str()), (1, "U1"));
        assert!(
            journal.names().shared("U1").is_some(),
            "interned while recording"
        );
        let judged = journal.freeze().unwrap();
        assert!(
            journal.names().shared("U1").is_none(),
            "the table goes once read back"
        );
        let twice = journal.freeze().unwrap_err();
        assert!(format!("{twice:#}").contains("frozen already"), "{twice:#}");
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
        assert!(
            journal.freeze().is_err(),
            "nothing to read back once committed"
        );
    }

    /// Entries of every kind, with every field a checker reads set (an e-mail's headers and
    /// HTML, a report's times and answer, a peer that is not IPv4, texts no JSON string can
    /// hold unescaped), are judged read back from the file exactly as they were made from the
    /// entry the ledger recorded.
    #[test]
    fn entries_read_back_are_the_entries_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new();
        let keep = Keep::HtmlOf(Arc::new(std::collections::HashSet::from([
            "ann@example.test".to_string(),
        ])));
        let journal =
            Journal::start(&ledger, dir.path(), (keep.clone(), Interner::default()), 3).unwrap();
        let mut made = Vec::new();
        for draft in drafts() {
            let recorded = ledger.record(draft);
            made.push(Entry::of(&recorded, &Interner::default(), &keep));
        }
        let judged = journal.freeze().unwrap();
        assert_eq!(judged, made);
        assert!(
            judged.iter().any(|e| e.html().is_some()),
            "an HTML part kept"
        );
        let briefs_gone = journal.since(0, |all| all.is_empty());
        assert!(briefs_gone);
    }

    /// A file that could not be written is no record to judge: freezing says so.
    #[test]
    fn a_file_that_failed_to_write_cannot_be_judged() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new();
        let journal =
            Journal::start(&ledger, dir.path(), (Keep::NoHtml, Interner::default()), 1).unwrap();
        ledger.record(LedgerEntry::draft(Provider::Line, EntryKind::Send, "U1"));
        journal.kept.lock().unwrap().error = Some("write ledger.jsonl: disk full".into());
        let err = journal.freeze().unwrap_err();
        assert!(format!("{err:#}").contains("disk full"), "{err:#}");
        assert_eq!(
            journal.since(0, |all| all.len()),
            1,
            "the briefs stay for a partial report"
        );
    }

    fn drafts() -> Vec<LedgerEntry> {
        let mut email = LedgerEntry::draft(Provider::Smtp, EntryKind::Send, "ann@example.test");
        email.outcome = Outcome::Accepted;
        email.status = "250 2.0.0 queued".into();
        email.started_ns = Some(7);
        email.body = Some("text \u{1F600} \"quoted\" \\ part".into());
        email.html = Some("<p>Ann &amp; \u{0}</p>".into());
        email.subject = Some("=?UTF-8?B?V2VsY29tZQ==?= caf\u{e9}".into());
        email.message_id = Some("<m1@example.test>".into());
        email.payload_hash = Some("ab".repeat(32));
        email.peer = Some("[::1]:4000".parse().unwrap());
        let field = |name: &str, value: &str| HeaderField {
            name: name.into(),
            value: value.into(),
        };
        email.email = Some(Box::new(EmailDetail {
            mail_from: "ting@example.test".into(),
            rcpt_to: vec!["ann@example.test".into()],
            headers: vec![
                field("To", "ann@example.test"),
                field("Subject", "Welcome\r\nBcc: x"),
                field("X-Trace", "a\u{0}b"),
            ],
            size: 9_000,
            sha256: "0".repeat(64),
            body_sha256: "1".repeat(64),
        }));
        let mut other = email.clone();
        other.recipient = "bob@example.test".into();
        let mut sms = LedgerEntry::draft(Provider::Sms, EntryKind::Send, "+15550001");
        sms.outcome = Outcome::Transient;
        sms.status = "503".into();
        sms.error = Some("service unavailable".into());
        sms.fault = Some("http 503".into());
        sms.retry_after_ms = Some(1_000);
        sms.client_hung_up = true;
        sms.body = Some("Hi \u{1F600}".into());
        sms.peer = Some("127.0.0.1:5000".parse().unwrap());
        let mut report = LedgerEntry::draft(Provider::Sms, EntryKind::Callback, "+15550001");
        report.message_id = Some("SM0001".into());
        report.callback_status = Some("delivered".into());
        report.callback_variant = Some(CallbackVariant::Duplicate);
        report.callback_response = Some(204);
        report.callback_try = Some(2);
        report.callback_late_ms = Some(3);
        report.callback_queued_ms = Some(u64::MAX);
        report.callback_took_ms = Some(12);
        let mut poll = LedgerEntry::draft(Provider::Sms, EntryKind::Poll, "+15550001");
        poll.callback_status = Some("sent".into());
        vec![email, other, sms, report, poll]
    }
}
