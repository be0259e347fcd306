//! Scenario errors that point at the file, line and column, and suggest the nearest valid key.

use std::fmt;

use super::keys::{leaf, parent, place, Keys};

/// A scenario that cannot be run, and exactly where it went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    pub file: String,
    /// 1-based; 0 when the error has no position (e.g. the file could not be read).
    pub line: usize,
    pub col: usize,
    pub message: String,
    /// The offending key, when the error is about one (its last segment: `rate`; the message
    /// names its table, or its whole path inside an array: `providers.line.transient[0].rate`).
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

/// The candidate closest to `word`, if it is close enough to be a plausible typo: at most one
/// edit per three characters of `word` (at least one), counting an adjacent transposition as one
/// edit (optimal string alignment), so `nht` finds `nth` and `maks` finds `max`. Ties go to the
/// candidate that shares the longer prefix (Jaro-Winkler).
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let w = word.to_lowercase();
    let allowed = w.chars().count().div_ceil(3).max(1);
    candidates
        .into_iter()
        .filter(|c| *c != word)
        .map(|c| (strsim::osa_distance(&w, c), strsim::jaro_winkler(&w, c), c))
        .filter(|(d, _, _)| *d <= allowed)
        .min_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)))
        .map(|(_, _, c)| c.to_string())
}

/// Turns a `toml` parse/deserialize error into a [`ScenarioError`] placed at the key or value it
/// is about, recognising serde's "unknown field `x`, expected one of `a`, `b`" to name the table
/// the key sits in and suggest the nearest valid key.
pub fn from_toml(file: &str, text: &str, err: &toml::de::Error) -> ScenarioError {
    let offset = err.span().map(|s| s.start);
    let msg = toml_words(err.message().trim());
    let Some(keys) = Keys::parse(text) else {
        // Not TOML at all: the parser's message and position, in plain words where we know them.
        let (line, col) = offset.map_or((0, 0), |o| line_col(text, o));
        return ScenarioError {
            file: file.into(),
            line,
            col,
            message: format!("invalid TOML: {}", plain_syntax(&msg)),
            key: offset.and_then(|o| key_on_line(text, o)),
            suggestion: None,
        };
    };
    let at = |o: Option<usize>| o.map_or((0, 0), |o| line_col(text, o));
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        if let Some((key, tail)) = rest.split_once('`') {
            let expected: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
            // The deserializer points at the key; a dotted key may come without a span, so fall
            // back to the written key of that name closest to where it points.
            let entry = offset.and_then(|o| keys.key_at(o)).or_else(|| {
                let o = offset.unwrap_or(0);
                keys.named(key)
                    .min_by_key(|e| (e.key.start < o, e.key.start.abs_diff(o)))
            });
            let (path, pos) = match entry {
                Some(e) => (e.path.clone(), Some(e.key.start)),
                None => (key.to_string(), offset),
            };
            let (line, col) = at(pos);
            let suggestion = nearest(key, expected.iter().copied());
            // No plausible typo: say what may be written here instead.
            let valid = match (&suggestion, expected.is_empty()) {
                (None, false) => format!("; valid keys here: {}", list(&expected)),
                _ => String::new(),
            };
            return ScenarioError {
                file: file.into(),
                line,
                col,
                message: format!(
                    "unknown key `{key}` {}{valid}",
                    place(parent(&path).unwrap_or(""))
                ),
                key: Some(key.to_string()),
                suggestion,
            };
        }
    }
    // The innermost key whose value holds the error; for an element of an array of plain values
    // (`channels = ["line", "fax"]`) the array's key.
    let mut path = offset
        .and_then(|o| keys.value_at(o))
        .map(|e| e.path.clone());
    while let Some(p) = path.as_deref().filter(|p| p.ends_with(']')) {
        path = parent(p).map(str::to_string);
    }
    let path = path.filter(|p| !p.is_empty());
    let (line, col) = at(offset);
    if let Some(rest) = msg.strip_prefix("unknown variant `") {
        if let Some((word, tail)) = rest.split_once('`') {
            let expected: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
            let what = path.as_deref().map(|p| format!(" for {}", describe(p)));
            return ScenarioError {
                file: file.into(),
                line,
                col,
                message: format!(
                    "unknown value `{word}`{}; expected one of {}",
                    what.unwrap_or_default(),
                    list(&expected)
                ),
                key: path.as_deref().map(|p| leaf(p).to_string()),
                suggestion: nearest(word, expected.iter().copied()),
            };
        }
    }
    if let Some(k) = msg
        .strip_prefix("missing field `")
        .and_then(|r| r.split_once('`'))
        .map(|(k, _)| k)
    {
        // The deserializer points at the table that lacks the key.
        let table = offset
            .and_then(|o| keys.value_at(o))
            .map(|e| e.path.clone())
            .unwrap_or_default();
        return ScenarioError {
            file: file.into(),
            line,
            col,
            message: format!("missing key `{k}` {}", place(&table)),
            key: Some(k.to_string()),
            suggestion: None,
        };
    }
    // A bad value: name its key and table, and say how to write it when the type is wrong.
    let hint = type_hint(&msg);
    let message = match &path {
        Some(p) => format!("bad value for {}: {msg}{hint}", describe(p)),
        None => format!("{msg}{hint}"),
    };
    ScenarioError {
        file: file.into(),
        line,
        col,
        message,
        key: path.as_deref().map(|p| leaf(p).to_string()),
        suggestion: None,
    }
}

/// serde's names for what was expected, in TOML's words: `struct RawLoad` (a Rust type a user
/// never wrote) and `a map` are a table, `a sequence` an array.
fn toml_words(msg: &str) -> String {
    let mut out = msg
        .replace("expected a sequence", "expected an array")
        .replace("expected a map", "expected a table");
    while let Some(at) = out.find("expected struct ") {
        let rest = &out[at + "expected struct ".len()..];
        let name = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        out.replace_range(at..at + "expected struct ".len() + name, "expected a table");
    }
    out
}

/// The TOML parser's message for the syntax errors people make most, in plain words first (the
/// parser's own text follows).
fn plain_syntax(msg: &str) -> String {
    let first = msg.lines().next().unwrap_or(msg);
    let plain = if first.contains("invalid basic string")
        || first.contains("invalid literal string")
    {
        Some("a string is not closed: end it with a quote on the same line (use \"\"\"…\"\"\" for text over several lines)")
    } else if first.contains("invalid table header") || first.contains("invalid array table header")
    {
        Some("a table header must be `[name]` or `[[name]]` alone on its line, with a closing bracket")
    } else if first.contains("expected `=`") || first.contains("expected `.`, `=`") {
        Some("a key must be followed by `=` and a value (`key = \"value\"`)")
    } else {
        None
    };
    match plain {
        Some(p) => format!("{p} ({})", msg.replace('\n', " ")),
        None => msg.to_string(),
    }
}

/// How to write a value whose type is wrong: `"4"` for a number, `4` for a string.
fn type_hint(msg: &str) -> &'static str {
    let Some(rest) = msg.strip_prefix("invalid type: ") else {
        return "";
    };
    let wants_number = ["expected u", "expected i", "expected f"]
        .iter()
        .any(|e| rest.contains(e));
    if rest.starts_with("string") && wants_number {
        "; write the number without quotes, e.g. `workers = 4`"
    } else if rest.starts_with("string") && rest.contains("expected a boolean") {
        "; write `true` or `false` without quotes"
    } else if (rest.starts_with("integer") || rest.starts_with("float")) && rest.contains("string")
    {
        "; write it in quotes, e.g. `lease = \"2s\"` or `rate = \"40%\"`"
    } else {
        ""
    }
}

/// "`lease` in [stack]", "`seed`", or for a key inside an array element its whole path,
/// "`providers.line.transient[0].rate`".
pub fn describe(path: &str) -> String {
    match parent(path) {
        None | Some("") => format!("`{path}`"),
        Some(t) if t.contains('[') => format!("`{path}`"),
        Some(t) => format!("`{}` in [{t}]", leaf(path)),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_counts_a_transposition_as_one_edit() {
        let chaos = ["at", "progress", "on_accept", "action", "target", "for"];
        assert_eq!(nearest("nht", ["channel", "nth"]).as_deref(), Some("nth"));
        assert_eq!(nearest("ofr", chaos).as_deref(), Some("for"));
        assert_eq!(nearest("taregt", chaos).as_deref(), Some("target"));
        assert_eq!(nearest("maks", ["min", "max"]).as_deref(), Some("max"));
        assert_eq!(
            nearest("worker", ["workers", "lease"]).as_deref(),
            Some("workers")
        );
        assert_eq!(
            nearest("bad_adresses", ["recipients", "bad_addresses"]).as_deref(),
            Some("bad_addresses")
        );
        // Too far to be a typo.
        assert_eq!(nearest("fax", ["line", "email", "sms"]), None);
        assert_eq!(nearest("zzz", chaos), None);
    }

    #[test]
    fn invalid_toml_keeps_the_parsers_message_and_position() {
        let text = "[stack]\nworkers = 1\nworkers = 2\n";
        let err = toml::from_str::<toml::Value>(text).unwrap_err();
        let e = from_toml("x.toml", text, &err);
        assert!(e.message.starts_with("invalid TOML: duplicate key"), "{e}");
        assert_eq!((e.line, e.col), (3, 1));
        assert_eq!(e.key.as_deref(), Some("workers"));
    }
}
