//! Reading a file a user named on the command line (a scenario, a `--stack` file, a `mocks
//! --config` file, a saved report) with a bound on its size: `/dev/zero`, `/dev/urandom` or a
//! runaway file must be refused with a clear error, never read until memory runs out. Pipes
//! (`validate <(…)`) read like files. Never interprets what it reads.

use std::io::Read;
use std::path::Path;

/// The most a scenario, a `--stack` file or a `mocks --config` file may hold: a scenario is a
/// few kilobytes.
pub const CONFIG_LIMIT: u64 = 4 << 20;

/// Reads `path` whole, refusing it past `limit` bytes (the error says so, in words, with the
/// limit); other errors are the operating system's.
pub fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!(
                "larger than {} MiB: not a file ting-chaos reads",
                limit >> 20
            ),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_file_is_refused_at_its_limit() {
        let err = read_bounded(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::FileTooLarge);
        assert_eq!(
            err.to_string(),
            "larger than 1 MiB: not a file ting-chaos reads"
        );
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x.toml");
        std::fs::write(&f, vec![b'#'; 1 << 20]).unwrap();
        assert_eq!(read_bounded(&f, 1 << 20).unwrap().len(), 1 << 20);
        let err = read_bounded(dir.path(), 1 << 20).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::IsADirectory, "{err}");
    }
}
