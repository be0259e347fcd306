//! Reading a saved `report.json` back (`ting-chaos report DIR`, `run --baseline FILE`): one
//! reader, whose error says what is wrong with the file in words a user can act on — missing,
//! cut short, not JSON, another report format, or a shape this version does not read — and never
//! a bare parser message. It only reads; it must never change the file.

use std::path::Path;

use super::{Report, FORMAT};

/// The most a `report.json` may hold (a large run's is a few megabytes: counterexamples are capped).
const REPORT_LIMIT: u64 = 256 << 20;

/// Why a `report.json` could not be read; the message names the file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReadError(String);

/// Reads and parses the report at `path`.
pub fn read_report(path: &Path) -> Result<Report, ReadError> {
    let shown = path.display();
    let data = crate::files::read_bounded(path, REPORT_LIMIT).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ReadError(format!(
            "{shown} does not exist: a run folder (reports/<scenario>-<timestamp>/) holds one"
        )),
        _ => ReadError(format!("cannot read {shown}: {e}")),
    })?;
    parse_report(&shown.to_string(), &data)
}

/// Parses `data`, the contents of the report `shown` names.
pub fn parse_report(shown: &str, data: &[u8]) -> Result<Report, ReadError> {
    let value: serde_json::Value = serde_json::from_slice(data).map_err(|e| {
        let at = format!("line {}, column {}", e.line(), e.column());
        ReadError(if e.is_eof() {
            format!(
                "{shown} is cut short (it ends inside a value at {at}): it was truncated while \
                 being written or copied"
            )
        } else {
            format!("{shown} is not JSON ({at}: {e})")
        })
    })?;
    let Some(format) = value.get("format").and_then(|f| f.as_u64()) else {
        return Err(ReadError(format!(
            "{shown} is not a ting-chaos report: it has no numeric `format`"
        )));
    };
    let written_by = value
        .pointer("/tool/version")
        .and_then(|v| v.as_str())
        .map_or_else(
            || "an unknown version".to_string(),
            |v| format!("ting-chaos {v}"),
        );
    if format != u64::from(FORMAT) {
        return Err(ReadError(format!(
            "{shown} is report format {format} (written by {written_by}); this ting-chaos {} \
             reads format {FORMAT}",
            env!("CARGO_PKG_VERSION")
        )));
    }
    serde_json::from_value(value).map_err(|e| {
        ReadError(format!(
            "{shown} does not have the shape of report format {FORMAT} (written by {written_by}): \
             {e}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (what the file holds, a fragment of the error).
    #[test]
    fn every_broken_report_gets_an_error_naming_what_is_wrong() {
        let good = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/report-sample/report.json"
        ))
        .unwrap();
        assert!(parse_report("r.json", good.as_bytes()).is_ok());
        let cut = &good[..good.len() / 2];
        let old_format = good.replacen("\"format\": 1", "\"format\": 0", 1);
        let no_checks = good.replacen("\"checks\":", "\"checks_gone\":", 1);
        #[rustfmt::skip]
        let cases: &[(&[u8], &str)] = &[
            (cut.as_bytes(), "r.json is cut short (it ends inside a value at line"),
            (b"", "r.json is cut short"),
            (b"<html>not json</html>", "r.json is not JSON (line 1, column 1:"),
            (b"\xff\xfe{}", "r.json is not JSON"),
            (b"[1, 2]", "r.json is not a ting-chaos report: it has no numeric `format`"),
            (b"{\"format\": \"1\"}", "has no numeric `format`"),
            (old_format.as_bytes(), "r.json is report format 0 (written by ting-chaos 0.1.0); this ting-chaos"),
            (b"{\"format\": 99}", "r.json is report format 99 (written by an unknown version)"),
            (no_checks.as_bytes(), "r.json does not have the shape of report format 1 (written by ting-chaos 0.1.0): missing field `checks`"),
        ];
        for (data, want) in cases {
            let err = parse_report("r.json", data).unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} lacks {want:?}");
        }
    }
}
