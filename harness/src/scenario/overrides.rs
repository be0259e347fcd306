//! Command-line values that replace the file's before validation: `--workers N`, `--stack FILE`
//! (a file holding `[stack.external]`) and `--set key=value` (a dotted key path into the scenario).
//!
//! Overrides are applied to the TOML tree, so the result passes exactly the rules a file with
//! those values written in it would; an error is then placed where its key came from: the
//! scenario file, the `--stack` file, or the `--set` flag that wrote it. Never validates anything
//! itself beyond the shape of a flag.

use std::path::{Path, PathBuf};

use super::error::{from_toml, line_col, ScenarioError};
use super::keys::Keys;

/// Command-line values that replace the file's before validation, so every cross-field rule
/// sees the values the run will use (`run --workers 2` with a chaos `target = 4` is an error).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `run --workers N`: replaces `[stack].workers`.
    pub workers: Option<u32>,
    /// `--stack FILE`: its `[stack.external]` replaces the scenario's stack (paths in it, `cwd`
    /// included, are relative to FILE's folder).
    pub stack: Option<PathBuf>,
    /// `--set key=value`, in order; a later one wins. The value is TOML (`200`, `false`,
    /// `["line"]`) or, when it does not parse as TOML, a string (`2s`, `resend`).
    pub set: Vec<String>,
    /// The run's database is created on a server (`--database-url` or `DATABASE_URL`, named
    /// here), not in a throwaway cluster: `db_restart` steps are refused.
    pub database_server: Option<&'static str>,
}

impl Overrides {
    /// The flag that replaced `[stack].workers`, for messages about worker numbers.
    pub fn workers_flag(&self) -> Option<String> {
        if let Some(w) = self.workers {
            return Some(format!("--workers {w}"));
        }
        self.set
            .iter()
            .rev()
            .find(|s| {
                s.split_once('=')
                    .is_some_and(|(k, _)| k.trim() == "stack.workers")
            })
            .map(|s| format!("--set {s}"))
    }
}

/// The scenario text with the overrides applied, and where each key came from.
pub(super) struct Applied {
    pub text: String,
    keys: Keys,
    file_keys: Keys,
    file_text: String,
    stack: Option<StackFile>,
    /// (path, the flag as given), in order.
    sets: Vec<(String, String)>,
}

struct StackFile {
    name: String,
    text: String,
    keys: Keys,
}

/// Applies `--stack` and `--set` to scenario `text` (read from `file`); `None` when there are
/// none, or when `text` is not TOML (its own parse error is the one to report).
pub(super) fn apply(
    file: &str,
    text: &str,
    overrides: &Overrides,
) -> Result<Option<Applied>, ScenarioError> {
    if overrides.stack.is_none() && overrides.set.is_empty() {
        return Ok(None);
    }
    let Ok(mut root) = toml::from_str::<toml::Table>(text) else {
        return Ok(None);
    };
    let stack = match &overrides.stack {
        Some(path) => Some(replace_stack(&mut root, path)?),
        None => None,
    };
    let mut sets = Vec::new();
    for flag in &overrides.set {
        let (key, value) = split_flag(flag)?;
        let segments = parse_path(key).ok_or_else(|| {
            flag_error(
                flag,
                format!("`{key}` is not a key path such as `load.recipients` or `chaos[0].at`"),
            )
        })?;
        let value = parse_value(value).map_err(|m| flag_error(flag, m))?;
        set(&mut root, &segments, value).map_err(|m| flag_error(flag, m))?;
        sets.push((key.to_string(), flag.clone()));
    }
    let new_text = toml::to_string(&root).map_err(|e| ScenarioError {
        file: file.into(),
        line: 0,
        col: 0,
        message: format!("cannot apply --set/--stack: {e}"),
        key: None,
        suggestion: None,
    })?;
    Ok(Some(Applied {
        keys: Keys::parse(&new_text).unwrap_or_default(),
        text: new_text,
        file_keys: Keys::parse(text).unwrap_or_default(),
        file_text: text.to_string(),
        stack,
        sets,
    }))
}

impl Applied {
    /// Moves an error placed in the applied text to where its key came from.
    pub fn place(&self, mut err: ScenarioError) -> ScenarioError {
        if err.line == 0 {
            return err;
        }
        let offset = offset_of(&self.text, err.line, err.col);
        let Some(path) = self.path_at(offset) else {
            (err.line, err.col) = (0, 0);
            return err;
        };
        if let Some((_, flag)) = self.sets.iter().rev().find(|(p, _)| within(&path, p)) {
            err.file = format!("--set {flag}");
            (err.line, err.col) = (0, 0);
            return err;
        }
        let (text, keys) = match &self.stack {
            Some(s) if within(&path, "stack.external") => {
                err.file = s.name.clone();
                (&s.text, &s.keys)
            }
            _ => (&self.file_text, &self.file_keys),
        };
        match translate(&self.keys, keys, &path, offset) {
            Some(o) => (err.line, err.col) = line_col(text, o),
            None => (err.line, err.col) = (0, 0),
        }
        err
    }

    /// The innermost key path written at `offset` of the applied text.
    fn path_at(&self, offset: usize) -> Option<String> {
        self.keys
            .key_at(offset)
            .or_else(|| self.keys.value_at(offset))
            .map(|e| e.path.clone())
    }
}

/// `path` is `under` or inside it.
fn within(path: &str, under: &str) -> bool {
    path == under
        || path
            .strip_prefix(under)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

/// `offset` (in the text `from` describes) moved to the same spot of `path` in `to`: the same
/// distance into its key or value, else the key (or nearest written ancestor).
fn translate(from: &Keys, to: &Keys, path: &str, offset: usize) -> Option<usize> {
    let (Some(a), Some(b)) = (from.get(path), to.get(path)) else {
        return to.offset_of(path);
    };
    if a.key.contains(&offset) {
        return Some(b.key.start + (offset - a.key.start).min(b.key.len()));
    }
    if let (Some(av), Some(bv)) = (&a.value, &b.value) {
        if av.contains(&offset) || av.start == offset {
            return Some(bv.start + (offset - av.start).min(bv.len()));
        }
    }
    Some(b.key.start)
}

/// Byte offset of 1-based `line`, `col` (columns count characters) in `text`.
fn offset_of(text: &str, line: usize, col: usize) -> usize {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    let rest = &text[start.min(text.len())..];
    start
        + rest
            .char_indices()
            .nth(col.saturating_sub(1))
            .map_or(rest.len(), |(i, _)| i)
}

/// Reads `path` (a file holding only `[stack.external]`) into `root`'s `stack.external`, with
/// its `cwd` made absolute from that file's folder.
fn replace_stack(root: &mut toml::Table, path: &Path) -> Result<StackFile, ScenarioError> {
    let name = path.display().to_string();
    let err = |line_col: (usize, usize), message: String| ScenarioError {
        file: name.clone(),
        line: line_col.0,
        col: line_col.1,
        message,
        key: None,
        suggestion: None,
    };
    let bytes = crate::files::read_bounded(path, crate::files::CONFIG_LIMIT)
        .map_err(|e| err((0, 0), format!("cannot read --stack file: {e}")))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| super::not_utf8(&name, e.as_bytes(), e.utf8_error()))?;
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| from_toml(&name, &text, &e))?;
    let keys = Keys::parse(&text).unwrap_or_default();
    let at = |p: &str| keys.offset_of(p).map_or((0, 0), |o| line_col(&text, o));
    let only = "a --stack file holds only a [stack.external] table";
    if let Some(other) = table.keys().find(|k| *k != "stack") {
        return Err(err(
            at(other),
            format!("{only}; `{other}` belongs in the scenario (or use --set)"),
        ));
    }
    let Some(toml::Value::Table(mut stack)) = table.remove("stack") else {
        return Err(err(at("stack"), format!("{only}, and it has none")));
    };
    if let Some(other) = stack.keys().find(|k| *k != "external") {
        return Err(err(
            at(&format!("stack.{other}")),
            format!("{only}; `stack.{other}` belongs in the scenario (or use --set)"),
        ));
    }
    let Some(toml::Value::Table(mut external)) = stack.remove("external") else {
        return Err(err(at("stack"), format!("{only}, and it has none")));
    };
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let folder = std::path::absolute(&folder).unwrap_or(folder);
    let cwd = match external.get("cwd") {
        None => Some(folder),
        Some(toml::Value::String(c)) => Some(folder.join(c)),
        // Not a string: left as written, for the scenario rules to reject at its position.
        Some(_) => None,
    };
    if let Some(cwd) = cwd {
        external.insert("cwd".into(), cwd.display().to_string().into());
    }
    let slot = root
        .entry("stack")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    // `stack = 3` in the scenario is left alone: its own error comes first.
    if let toml::Value::Table(t) = slot {
        t.insert("external".into(), toml::Value::Table(external));
    }
    Ok(StackFile { name, text, keys })
}

fn split_flag(flag: &str) -> Result<(&str, &str), ScenarioError> {
    match flag.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim(), v.trim())),
        _ => Err(flag_error(
            flag,
            "--set takes KEY=VALUE, e.g. --set load.recipients=200".to_string(),
        )),
    }
}

fn flag_error(flag: &str, message: String) -> ScenarioError {
    ScenarioError {
        file: format!("--set {flag}"),
        line: 0,
        col: 0,
        message,
        key: None,
        suggestion: None,
    }
}

/// One step of a key path: a key, or an index into the array the previous step named.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

/// `providers.line.transient[0].rate` → keys and indices; `None` when malformed.
fn parse_path(path: &str) -> Option<Vec<Segment>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (name, mut rest) = part.split_at(part.find('[').unwrap_or(part.len()));
        let bare = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if name.is_empty() || !name.chars().all(bare) {
            return None;
        }
        out.push(Segment::Key(name.to_string()));
        while let Some(r) = rest.strip_prefix('[') {
            let (n, tail) = r.split_once(']')?;
            out.push(Segment::Index(n.parse().ok()?));
            rest = tail;
        }
        if !rest.is_empty() {
            return None;
        }
    }
    Some(out)
}

/// A TOML value (`200`, `false`, `["line"]`, `"x"`), or the text itself as a string. Text that
/// reads as a value followed by more TOML (`200\nseed = 5`) is that text, never the value with
/// the rest dropped: the scenario's rules then refuse it at the flag. A whole number TOML cannot
/// hold is refused here, not passed on as a string (whose error would say to drop quotes that
/// were never written).
fn parse_value(v: &str) -> Result<toml::Value, String> {
    if let Some(value) = toml::from_str::<toml::Table>(&format!("v = {v}"))
        .ok()
        .filter(|t| t.len() == 1)
        .and_then(|mut t| t.remove("v"))
    {
        return Ok(value);
    }
    let digits = v.strip_prefix(['-', '+']).unwrap_or(v);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_') {
        return Err(format!(
            "`{v}` is out of range: whole numbers go up to {} (TOML's integers)",
            i64::MAX
        ));
    }
    Ok(toml::Value::String(v.to_string()))
}

/// Writes `value` at `path` under `root`, creating missing tables on the way.
fn set(root: &mut toml::Table, path: &[Segment], value: toml::Value) -> Result<(), String> {
    let mut tree = toml::Value::Table(std::mem::take(root));
    let result = set_in(&mut tree, path, value, "");
    if let toml::Value::Table(t) = tree {
        *root = t;
    }
    result
}

fn set_in(
    cur: &mut toml::Value,
    path: &[Segment],
    value: toml::Value,
    here: &str,
) -> Result<(), String> {
    let Some((seg, rest)) = path.split_first() else {
        *cur = value;
        return Ok(());
    };
    match (seg, cur) {
        (Segment::Key(k), toml::Value::Table(t)) => {
            let empty = match rest.first() {
                Some(Segment::Index(_)) => toml::Value::Array(Vec::new()),
                _ => toml::Value::Table(toml::Table::new()),
            };
            let child = t.entry(k.clone()).or_insert(empty);
            let path = if here.is_empty() {
                k.clone()
            } else {
                format!("{here}.{k}")
            };
            set_in(child, rest, value, &path)
        }
        (Segment::Index(n), toml::Value::Array(a)) => {
            let len = a.len();
            let child = a
                .get_mut(*n)
                .ok_or_else(|| format!("`{here}` has {len} elements; there is no `{here}[{n}]`"))?;
            set_in(child, rest, value, &format!("{here}[{n}]"))
        }
        (Segment::Key(_), _) => Err(format!("`{here}` is not a table")),
        (Segment::Index(_), _) => Err(format!("`{here}` is not an array")),
    }
}
