//! Writes the human and CI renderings beside `report.json`: `report.html`, `junit.xml`,
//! `summary.md`, and appends the summary to `$GITHUB_STEP_SUMMARY` when CI sets it. Only
//! `ting-chaos run` appends by default; `ting-chaos report DIR` re-renders without appending unless
//! asked to (`--step-summary`), so re-rendering inside the job that ran never lists a run twice.
//!
//! Every file is written atomically (temporary file, then rename) so a reader never sees half a
//! page. Rendering reads the report and the ledger only; it must never change `report.json`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use mock_providers::ledger::LedgerEntry;

use crate::check::{Entry, Interner, Keep};

use super::{html, junit, markdown, stats, Report};

/// Reads `ledger.jsonl`. A line that does not parse (a run killed mid-write leaves a torn last
/// line, a damaged disk leaves bytes that are not UTF-8) is skipped and counted rather than
/// failing the whole rendering. Each entry is kept as the checkers' [`Entry`], one at a time, so
/// a ledger of hundreds of megabytes is never in memory whole.
pub fn read_ledger(path: &Path) -> anyhow::Result<(Vec<Entry>, usize)> {
    let file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut entries = Vec::new();
    let mut skipped = 0;
    let names = Interner::default();
    let keep = Keep::NoHtml;
    for entry in read_entries(std::io::BufReader::new(file), &names, &keep) {
        match entry {
            Ok(e) => entries.push(e),
            Err(e) if e.is::<std::io::Error>() => {
                return Err(e.context(format!("read {}", path.display())))
            }
            Err(_) => skipped += 1,
        }
    }
    Ok((entries, skipped))
}

/// The entries of a ledger's JSON lines (`ledger.jsonl`), each as the checkers' [`Entry`] (its
/// strings shared through `names`, the HTML parts `keep` names), one at a time, so a ledger of
/// hundreds of megabytes is never in memory whole. Blank lines are skipped; a line that cannot
/// be read or does not parse is an `Err`.
pub fn read_entries<'a>(
    lines: impl std::io::BufRead + 'a,
    names: &'a Interner,
    keep: &'a Keep,
) -> impl Iterator<Item = anyhow::Result<Entry>> + 'a {
    lines
        .split(b'\n')
        .filter(|line| line.as_ref().map_or(true, |l| !l.trim_ascii().is_empty()))
        .map(|line| {
            let entry: LedgerEntry = serde_json::from_slice(&line?)?;
            Ok(Entry::of(&entry, names, keep))
        })
}

fn write_atomic(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    super::atomic::write_atomic(path, |w| w.write_all(data))
}

/// Renders `report.html`, `junit.xml` and `summary.md` into `dir` from `report` and `ledger`,
/// and appends the summary to `step_summary` when given. Returns the files written.
pub fn write_rendered(
    dir: &Path,
    report: &Report,
    ledger: &[Entry],
    step_summary: Option<&Path>,
) -> anyhow::Result<Vec<PathBuf>> {
    let metrics = if report.metrics.is_empty() && !ledger.is_empty() {
        stats::metrics(report, ledger)
    } else {
        report.metrics.clone()
    };
    let summary = markdown::render_with(report, &metrics);
    let outputs = [
        ("report.html", html::render_html(report, ledger)),
        ("junit.xml", junit::render_junit(report)),
        ("summary.md", summary.clone()),
    ];
    let mut written = Vec::new();
    for (name, body) in outputs {
        let path = dir.join(name);
        write_atomic(&path, body.as_bytes())?;
        written.push(path);
    }
    if let Some(path) = step_summary {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("open step summary {}", path.display()))?;
        f.write_all(summary.as_bytes())
            .and_then(|_| f.write_all(b"\n"))
            .with_context(|| format!("append to step summary {}", path.display()))?;
    }
    Ok(written)
}

/// `$GITHUB_STEP_SUMMARY`, where CI wants a Markdown summary appended (None when unset or empty).
pub fn step_summary_path() -> Option<PathBuf> {
    std::env::var_os("GITHUB_STEP_SUMMARY")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Renders everything for a run folder: reads `dir/ledger.jsonl` when present and, when
/// `step_summary` is true, appends the summary to the file `$GITHUB_STEP_SUMMARY` names when that
/// is set (and not empty).
pub fn write_all(dir: &Path, report: &Report, step_summary: bool) -> anyhow::Result<Vec<PathBuf>> {
    let ledger = saved_ledger(dir)?;
    let step_summary = step_summary.then(step_summary_path).flatten();
    write_rendered(dir, report, &ledger, step_summary.as_deref())
}

/// `dir/ledger.jsonl`'s entries (none when there is no such file), its unreadable lines skipped
/// with a warning.
fn saved_ledger(dir: &Path) -> anyhow::Result<Vec<Entry>> {
    let path = dir.join("ledger.jsonl");
    if !path.exists() {
        return Ok(Vec::new());
    }
    let (entries, skipped) = read_ledger(&path)?;
    if skipped > 0 {
        tracing::warn!("{}: skipped {skipped} unreadable lines", path.display());
    }
    Ok(entries)
}

/// Why `ting-chaos report DIR` rendered nothing: a report or ledger it cannot read (the user's
/// input, exit 2) or renderings it could not write (exit 3).
#[derive(Debug, thiserror::Error)]
pub enum RerenderError {
    #[error("{0}")]
    Input(String),
    #[error("{0:#}")]
    Output(anyhow::Error),
}

/// Loads `dir/report.json` and renders it again (`ting-chaos report DIR`); appends to
/// `$GITHUB_STEP_SUMMARY` only when `step_summary` is true (the run already did).
pub fn rerender(dir: &Path, step_summary: bool) -> Result<Vec<PathBuf>, RerenderError> {
    let report = super::read::read_report(&dir.join("report.json"))
        .map_err(|e| RerenderError::Input(e.to_string()))?;
    let ledger = saved_ledger(dir).map_err(|e| RerenderError::Input(format!("{e:#}")))?;
    let step_summary = step_summary.then(step_summary_path).flatten();
    write_rendered(dir, &report, &ledger, step_summary.as_deref()).map_err(RerenderError::Output)
}
