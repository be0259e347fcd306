//! The one way the harness writes a file others read: a temporary file beside it, written,
//! flushed and synced, then renamed over the target, every error surfaced. A reader sees the old
//! file or the whole new one, never a truncated one.

use std::io::Write;
use std::path::Path;

use anyhow::Context;

/// Writes `path` atomically with whatever `write` puts into the writer it is given.
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    let mut file = AtomicFile::create(path)?;
    let written = write(file.writer());
    match written {
        Ok(()) => file.commit(),
        Err(e) => Err(anyhow::Error::new(e).context(format!("write {}", file.tmp.display()))),
    }
}

/// A file being written atomically over time (`ledger.jsonl` as the run records it): its
/// temporary file exists from [`AtomicFile::create`], `path` only from [`AtomicFile::commit`].
/// Dropped uncommitted, the temporary file is removed.
pub struct AtomicFile {
    tmp: std::path::PathBuf,
    path: std::path::PathBuf,
    w: Option<std::io::BufWriter<std::fs::File>>,
}

impl AtomicFile {
    pub fn create(path: &Path) -> anyhow::Result<AtomicFile> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("out");
        let tmp = path.with_file_name(format!(".{name}.tmp"));
        let file =
            std::fs::File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
        Ok(AtomicFile {
            tmp,
            path: path.to_path_buf(),
            w: Some(std::io::BufWriter::with_capacity(1 << 20, file)),
        })
    }

    /// Where to write; buffered.
    pub fn writer(&mut self) -> &mut dyn Write {
        self.w.as_mut().expect("an uncommitted file has its writer")
    }

    /// Flushes what was written so far and opens the temporary file to read it from the start
    /// (`Err` if the name now leads to another file than the one being written).
    pub fn read_back(&mut self) -> anyhow::Result<std::fs::File> {
        use std::os::unix::fs::MetadataExt;
        let w = self.w.as_mut().context("the file was committed")?;
        w.flush()
            .with_context(|| format!("flush {}", self.tmp.display()))?;
        let written = w.get_ref().metadata()?;
        let file = std::fs::File::open(&self.tmp)
            .with_context(|| format!("open {}", self.tmp.display()))?;
        let read = file.metadata()?;
        anyhow::ensure!(
            (read.dev(), read.ino()) == (written.dev(), written.ino()),
            "{} was replaced while it was written",
            self.tmp.display()
        );
        Ok(file)
    }

    /// Flushes, syncs and renames the file over `path`.
    pub fn commit(mut self) -> anyhow::Result<()> {
        let w = self.w.take().expect("committed once");
        let tmp = self.tmp.clone();
        let file = w
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("flush {}", tmp.display()))?;
        file.sync_all()
            .with_context(|| format!("sync {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.path)
            .with_context(|| format!("rename to {}", self.path.display()))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        // After a commit the temporary file is gone already.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_whole_files_and_leaves_the_old_one_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.json");
        write_atomic(&path, |w| w.write_all(b"first")).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        let err = write_atomic(&path, |w| {
            w.write_all(b"half")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err();
        assert!(format!("{err:#}").contains("disk full"), "{err:#}");
        assert_eq!(std::fs::read(&path).unwrap(), b"first", "old file kept");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left behind");
        // A folder that does not exist is an error, not a panic.
        assert!(write_atomic(&dir.path().join("no/such/file"), |w| w.write_all(b"x")).is_err());
    }

    /// What was written so far reads back while the file is still being written; a file put
    /// in its place is refused, not read.
    #[test]
    fn reads_back_what_was_written_and_only_that_file() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        let mut file = AtomicFile::create(&path).unwrap();
        file.writer().write_all(b"one\n").unwrap();
        let mut text = String::new();
        file.read_back().unwrap().read_to_string(&mut text).unwrap();
        assert_eq!(text, "one\n");
        file.writer().write_all(b"two\n").unwrap();
        std::fs::remove_file(&file.tmp).unwrap();
        std::fs::write(&file.tmp, b"another run's\n").unwrap();
        let err = file.read_back().unwrap_err();
        assert!(format!("{err:#}").contains("was replaced"), "{err:#}");
    }
}
