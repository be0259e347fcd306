//! Scenario errors that point at the file, line and column, and suggest the nearest valid key.

use std::fmt;

/// A scenario that cannot be run, and exactly where it went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    pub file: String,
    /// 1-based; 0 when the error has no position (e.g. the file could not be read).
    pub line: usize,
    pub col: usize,
    pub message: String,
    /// The offending key, when the error is about one.
    pub key: Option<String>,
    /// The nearest valid key, for unknown keys.
    pub suggestion: Option<String>,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(
                f,
                "{} at {}:{}:{}",
                self.message, self.file, self.line, self.col
            )?;
        } else {
            write!(f, "{}: {}", self.file, self.message)?;
        }
        if let Some(s) = &self.suggestion {
            write!(f, " — did you mean `{s}`?")?;
        }
        Ok(())
    }
}

impl std::error::Error for ScenarioError {}

/// 1-based line and column of byte `offset` in `text` (columns count characters).
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let col = text[line_start..offset].chars().count() + 1;
    (line, col)
}

/// The `[table]` (or `[[table]]`) header in force at byte `offset`, or "" for the root table.
pub fn table_at(text: &str, offset: usize) -> String {
    let mut current = String::new();
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        if pos > offset {
            break;
        }
        let t = line.trim();
        if t.starts_with('[') {
            let name = t.trim_start_matches('[');
            if let Some(end) = name.find(']') {
                current = name[..end].trim().to_string();
            }
        }
        pos += line.len();
    }
    current
}

/// Finds where `key` is set inside `[table]` ("" = root), for errors that serde could not place.
/// Returns 1-based (line, col) of the key, or of the table header when the key is not written.
pub fn locate(text: &str, table: &str, key: &str) -> (usize, usize) {
    let mut current = String::new();
    let mut header_line = 1;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with('[') {
            let name = t.trim_start_matches('[');
            if let Some(end) = name.find(']') {
                current = name[..end].trim().to_string();
                if current == table {
                    header_line = i + 1;
                }
            }
            continue;
        }
        if current == table {
            if let Some(rest) = t.strip_prefix(key) {
                if rest.trim_start().starts_with('=') {
                    return (i + 1, line.len() - t.len() + 1);
                }
            }
        }
    }
    (header_line, 1)
}

/// The candidate closest to `word`, if it is close enough to be a plausible typo.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score >= 0.7)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c.to_string())
}

/// Turns a `toml` parse/deserialize error into a [`ScenarioError`], recognising serde's
/// "unknown field `x`, expected one of `a`, `b`" to name the table and suggest the nearest key.
pub fn from_toml(file: &str, text: &str, err: &toml::de::Error) -> ScenarioError {
    let offset = err.span().map(|s| s.start).unwrap_or(0);
    let (line, col) = if err.span().is_some() {
        line_col(text, offset)
    } else {
        (0, 0)
    };
    let msg = err.message().trim().to_string();
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        if let Some((key, tail)) = rest.split_once('`') {
            let expected: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
            return ScenarioError {
                file: file.into(),
                line,
                col,
                message: format!("unknown key `{key}` {}", place(text, offset)),
                key: Some(key.to_string()),
                suggestion: nearest(key, expected.iter().copied()),
            };
        }
    }
    if let Some(rest) = msg.strip_prefix("unknown variant `") {
        if let Some((word, tail)) = rest.split_once('`') {
            let expected: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
            let key = key_on_line(text, offset);
            let table = table_at(text, offset);
            let place = match (&key, table.is_empty()) {
                (Some(k), true) => format!(" for `{k}`"),
                (Some(k), false) => format!(" for `{k}` in [{table}]"),
                (None, _) => String::new(),
            };
            return ScenarioError {
                file: file.into(),
                line,
                col,
                message: format!(
                    "unknown value `{word}`{place}; expected one of {}",
                    list(&expected)
                ),
                key,
                suggestion: nearest(word, expected.iter().copied()),
            };
        }
    }
    if let Some(k) = msg
        .strip_prefix("missing field `")
        .and_then(|r| r.split_once('`'))
        .map(|(k, _)| k)
    {
        return ScenarioError {
            file: file.into(),
            line,
            col,
            message: format!("missing key `{k}` {}", place(text, offset)),
            key: Some(k.to_string()),
            suggestion: None,
        };
    }
    // A bad value: name the key written on that line, and its table.
    let key = err.span().and_then(|_| key_on_line(text, offset));
    let message = match &key {
        Some(k) => {
            let table = table_at(text, offset);
            let place = if table.is_empty() {
                String::new()
            } else {
                format!(" in [{table}]")
            };
            format!("bad value for `{k}`{place}: {msg}")
        }
        None => msg,
    };
    ScenarioError {
        file: file.into(),
        line,
        col,
        message,
        key,
        suggestion: None,
    }
}

/// "in [table]" or "at the top level" for byte `offset`.
fn place(text: &str, offset: usize) -> String {
    match table_at(text, offset) {
        t if t.is_empty() => "at the top level".to_string(),
        t => format!("in [{t}]"),
    }
}

/// The key assigned on the line containing `offset` (`key = …`), if any.
fn key_on_line(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let start = text[..offset].rfind('\n').map(|i| i + 1).unwrap_or(0);
    let line = text[start..].lines().next()?;
    let (k, _) = line.split_once('=')?;
    let k = k.trim().trim_matches('"');
    (!k.is_empty() && !k.starts_with('[') && !k.contains(' ')).then(|| k.to_string())
}

pub fn list(items: &[&str]) -> String {
    items
        .iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
