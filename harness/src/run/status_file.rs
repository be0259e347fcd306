//! `status.json` written while the run's last poll reads it, so that the status view need not
//! keep what only the file shows.
//!
//! The rows' transition details ("sms status delivered for SM…", one unique text per delivery)
//! and payload digests are the stack's to show and no checker's to judge; at 100,000 recipients
//! they were ~30 MB of the view. The view drops them as each answer arrives
//! (`status::StatusPoller`), and the run's last poll, which asks every batch for its whole list,
//! hands each answer here whole (each row's wire form as JSON, made as the row was read). The
//! file is a JSON array of the rows, one row to a line, batch after batch in the order they were
//! asked. A batch that last poll got no answer for is written after the others as the view last
//! held it: without details or digests. Committed (flushed, synced, renamed) with the report; a
//! run that stops before leaves none, as with `ledger.jsonl`.

use std::collections::HashSet;
use std::path::Path;

use crate::check::StatusDelivery;
use crate::report::atomic::AtomicFile;

/// One row of `status.json`.
pub enum Row<'a> {
    /// As answered: the JSON of its wire row, made as the answer was read.
    Json(&'a str),
    /// As the view holds it (no transition details, no payload digest).
    Held(&'a StatusDelivery),
}

pub struct StatusFile {
    file: AtomicFile,
    /// Batches written, whole or as held.
    written: HashSet<String>,
    rows: u64,
    /// The first error writing the file.
    error: Option<String>,
}

impl StatusFile {
    /// Starts `path` (a temporary file until [`StatusFile::commit`]).
    pub fn create(path: &Path) -> anyhow::Result<StatusFile> {
        let mut file = StatusFile {
            file: AtomicFile::create(path)?,
            written: HashSet::new(),
            rows: 0,
            error: None,
        };
        file.put(|w| w.write_all(b"["));
        Ok(file)
    }

    /// Writes `rows`, the rows of `batch_id`, unless that batch is written already.
    pub fn write<'a>(&mut self, batch_id: &str, rows: impl IntoIterator<Item = Row<'a>>) {
        if self.written.insert(batch_id.to_string()) {
            for row in rows {
                self.row(row);
            }
        }
    }

    /// Writes one row of the array.
    fn row(&mut self, row: Row<'_>) {
        let first = self.rows == 0;
        self.rows += 1;
        self.put(|w| {
            w.write_all(if first { b"\n" } else { b",\n" })?;
            match row {
                Row::Json(json) => w.write_all(json.as_bytes()),
                Row::Held(row) => {
                    serde_json::to_writer(&mut *w, row).map_err(std::io::Error::other)
                }
            }
        });
    }

    /// Whether `batch_id`'s rows are in the file.
    pub fn has(&self, batch_id: &str) -> bool {
        self.written.contains(batch_id)
    }

    /// Ends the array and commits the file; an error writing it at any time is returned here.
    pub fn commit(mut self) -> anyhow::Result<()> {
        self.put(|w| w.write_all(b"\n]\n"));
        if let Some(e) = self.error.take() {
            anyhow::bail!(e);
        }
        self.file.commit()
    }

    fn put(&mut self, f: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>) {
        if self.error.is_none() {
            if let Err(e) = f(self.file.writer()) {
                self.error = Some(format!("write status.json: {e}"));
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::check::StatusRowWire;

    /// A delivered SMS row with a payload digest and one transition carrying `detail`.
    pub(in crate::run) fn row(key: &str, detail: &str) -> StatusRowWire {
        serde_json::from_value(serde_json::json!({
            "key": key, "recipient": "r1", "channel": "sms", "state": "delivered",
            "payload_sha256": "ab".repeat(32),
            "transitions": [{"from": "sending", "to": "delivered", "source": "callback",
                             "at": "2026-12-04T10:00:00.000Z", "detail": detail}]
        }))
        .unwrap()
    }

    #[test]
    fn rows_read_back_whole_each_batch_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.json");
        let mut file = StatusFile::create(&path).unwrap();
        let b1 = [row("k1", "sms status delivered for SM1"), row("k2", "w1")];
        let json: Vec<String> = b1
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        file.write("b1", json.iter().map(|j| Row::Json(j)));
        let again = serde_json::to_string(&row("k3", "again")).unwrap();
        file.write("b1", [Row::Json(&again)]);
        assert!(file.has("b1") && !file.has("b2"));
        assert!(!path.exists(), "committed only at the end");
        file.commit().unwrap();
        let back: Vec<StatusRowWire> =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            back, b1,
            "details and digests kept, the second b1 not written"
        );
    }

    #[test]
    fn no_rows_is_an_empty_array() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.json");
        StatusFile::create(&path).unwrap().commit().unwrap();
        let back: Vec<StatusRowWire> =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(back.is_empty());
    }
}
