//! Where every key of a scenario file is written, so an error can point at the key itself.
//!
//! The file is parsed a second time with `toml_edit`, which keeps the byte span of every key and
//! value whichever way it was written: under a `[table]` header, as a dotted key
//! (`stack.workers = 0`), inside an inline table (`backoff = { base = "0ms" }`) or inside an array
//! (`transient = [{ status = 500, rate = 1.5 }]`). Paths are dotted, with 0-based array indices:
//! `stack.backoff.base`, `chaos[1].target`, `providers.line.transient[0].rate`.

use std::ops::Range;

use toml_edit::{ImDocument, Item, Table, Value};

/// One written key (or array element) and where it is.
#[derive(Debug, Clone)]
pub struct Entry {
    /// `stack.backoff.base`, `chaos[0]`, `providers.line.transient[1].rate`.
    pub path: String,
    /// The key's bytes; for an array element, the element's.
    pub key: Range<usize>,
    /// The value's bytes, when known (a `[table]`'s span starts at its header).
    pub value: Option<Range<usize>>,
    /// Byte offset of the `[table]` / `[[table]]` header that defines this table, if any.
    pub header: Option<usize>,
}

/// Every key of one file.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    entries: Vec<Entry>,
}

impl Keys {
    /// Collects the keys of `text`; `None` when it is not valid TOML (the parser's own error, with
    /// its position, is reported instead).
    pub fn parse(text: &str) -> Option<Keys> {
        let doc = ImDocument::parse(text).ok()?;
        let mut keys = Keys::default();
        keys.table("", doc.as_table());
        Some(keys)
    }

    /// The key written at exactly `path`.
    pub fn get(&self, path: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.path == path)
    }

    /// Byte offset to report for `path`: its key, or (when it is not written) the header or key of
    /// its nearest written ancestor. `None` when nothing on the way is written.
    pub fn offset_of(&self, path: &str) -> Option<usize> {
        if let Some(e) = self.get(path) {
            return Some(e.key.start);
        }
        let mut p = path;
        while let Some(parent) = parent(p) {
            if parent.is_empty() {
                return None;
            }
            if let Some(e) = self.get(parent) {
                return Some(e.header.unwrap_or(e.key.start));
            }
            p = parent;
        }
        None
    }

    /// The key whose name starts at byte `offset` (where the TOML deserializer puts an unknown
    /// key).
    pub fn key_at(&self, offset: usize) -> Option<&Entry> {
        self.entries
            .iter()
            .filter(|e| !e.path.ends_with(']'))
            .find(|e| e.key.contains(&offset) || e.key.start == offset)
    }

    /// The innermost written key whose value holds byte `offset` (where the TOML deserializer
    /// puts a bad value).
    pub fn value_at(&self, offset: usize) -> Option<&Entry> {
        self.entries
            .iter()
            .filter(|e| {
                e.value
                    .as_ref()
                    .is_some_and(|v| v.contains(&offset) || v.start == offset)
            })
            // Equal spans (an array of tables and its only element): the deeper path.
            .min_by_key(|e| {
                let len = e.value.as_ref().map_or(usize::MAX, |v| v.end - v.start);
                (len, std::cmp::Reverse(e.path.len()))
            })
    }

    /// Written keys named `name` (the last path segment), in file order.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Entry> + 'a {
        self.entries.iter().filter(move |e| leaf(&e.path) == name)
    }

    fn table(&mut self, prefix: &str, t: &Table) {
        for (name, item) in t.iter() {
            let Some(key) = t.key(name).and_then(|k| k.span()) else {
                continue;
            };
            let path = join(prefix, name);
            self.item(path, key, item);
        }
    }

    fn item(&mut self, path: String, key: Range<usize>, item: &Item) {
        match item {
            Item::None => {}
            Item::Value(v) => self.value(path, key, v),
            Item::Table(t) => {
                let header = (!t.is_implicit() && !t.is_dotted())
                    .then(|| t.span().map(|s| s.start))
                    .flatten();
                self.entries.push(Entry {
                    path: path.clone(),
                    key,
                    value: t.span(),
                    header,
                });
                self.table(&path, t);
            }
            Item::ArrayOfTables(a) => {
                self.entries.push(Entry {
                    path: path.clone(),
                    key,
                    value: a.span(),
                    header: None,
                });
                for (i, t) in a.iter().enumerate() {
                    let elem = format!("{path}[{i}]");
                    let span = t.span().unwrap_or(0..0);
                    self.entries.push(Entry {
                        path: elem.clone(),
                        key: span.clone(),
                        value: Some(span.clone()),
                        header: Some(span.start),
                    });
                    self.table(&elem, t);
                }
            }
        }
    }

    fn value(&mut self, path: String, key: Range<usize>, v: &Value) {
        self.entries.push(Entry {
            path: path.clone(),
            key,
            value: v.span(),
            header: None,
        });
        match v {
            Value::InlineTable(t) => {
                for (name, x) in t.iter() {
                    if let Some(k) = t.key(name).and_then(|k| k.span()) {
                        self.value(join(&path, name), k, x);
                    }
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    let span = x.span().unwrap_or(0..0);
                    self.value(format!("{path}[{i}]"), span, x);
                }
            }
            _ => {}
        }
    }
}

/// `a.b` from `a` and `b`; keys that are not bare are quoted.
pub fn join(prefix: &str, name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let name = if bare {
        name.to_string()
    } else {
        format!("{name:?}")
    };
    if prefix.is_empty() {
        name
    } else {
        format!("{prefix}.{name}")
    }
}

/// The path one level up: `a.b[2]` → `a.b`, `a.b` → `a`, `a` → `` (root), `` → none.
pub fn parent(path: &str) -> Option<&str> {
    if path.is_empty() {
        return None;
    }
    if path.ends_with(']') {
        if let Some(i) = path.rfind('[') {
            return Some(&path[..i]);
        }
    }
    Some(path.rfind('.').map_or("", |i| &path[..i]))
}

/// The last segment of `path` (`rate` for `providers.line.transient[0].rate`).
pub fn leaf(path: &str) -> &str {
    match parent(path) {
        Some("") | None => path,
        Some(p) => path[p.len()..].trim_start_matches('.'),
    }
}

/// How to name the table a key sits in: `at the top level`, `in [stack.backoff]`, or for a table
/// inside an array `in `providers.line.transient[0]``.
pub fn place(table: &str) -> String {
    if table.is_empty() {
        "at the top level".to_string()
    } else if table.contains('[') {
        format!("in `{table}`")
    } else {
        format!("in [{table}]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::error::line_col;

    const TEXT: &str = r#"name = "x"
stack.workers = 0
stack.backoff = { base = "0ms", max = "1s" }
[load]
recipients = 3
[load.bad_adresses]
line = 1
[[chaos]]
at = "1s"
on_accept = { channel = "line", nht = 3 }
[[chaos]]
target = 2
[providers.line]
transient = [ { status = 500, rate = 1.5 } ]
"#;

    fn at(keys: &Keys, path: &str) -> (usize, usize) {
        line_col(TEXT, keys.offset_of(path).expect(path))
    }

    #[test]
    fn every_way_of_writing_a_key_is_placed() {
        let k = Keys::parse(TEXT).unwrap();
        assert_eq!(at(&k, "stack.workers"), (2, 7));
        assert_eq!(at(&k, "stack.backoff.base"), (3, 19));
        assert_eq!(at(&k, "load.recipients"), (5, 1));
        assert_eq!(at(&k, "load.bad_adresses"), (6, 7));
        assert_eq!(at(&k, "chaos[0].on_accept.nht"), (10, 33));
        assert_eq!(at(&k, "chaos[1].target"), (12, 1));
        assert_eq!(at(&k, "providers.line.transient[0].rate"), (14, 31));
        // Not written: the nearest written ancestor (a table's header, an element's header).
        assert_eq!(at(&k, "load.batches"), (4, 1));
        assert_eq!(at(&k, "chaos[1].for"), (11, 1));
        assert_eq!(at(&k, "stack.backoff.factor"), (3, 7));
        assert_eq!(k.offset_of("expect.quiescence"), None);
    }

    #[test]
    fn offsets_map_back_to_keys_and_values() {
        let k = Keys::parse(TEXT).unwrap();
        let rate = TEXT.find("1.5").unwrap();
        assert_eq!(
            k.value_at(rate).unwrap().path,
            "providers.line.transient[0].rate"
        );
        let nht = TEXT.find("nht").unwrap();
        assert_eq!(k.key_at(nht).unwrap().path, "chaos[0].on_accept.nht");
        let typo = TEXT.find("bad_adresses").unwrap();
        assert_eq!(k.key_at(typo).unwrap().path, "load.bad_adresses");
    }

    #[test]
    fn paths_split_into_parent_and_leaf() {
        assert_eq!(parent("a.b[2]"), Some("a.b"));
        assert_eq!(parent("a.b[2].c"), Some("a.b[2]"));
        assert_eq!(parent("a"), Some(""));
        assert_eq!(parent(""), None);
        assert_eq!(leaf("providers.line.transient[0].rate"), "rate");
        assert_eq!(leaf("seed"), "seed");
        assert_eq!(
            join("stack.external.env", "A.B"),
            "stack.external.env.\"A.B\""
        );
        assert_eq!(place(""), "at the top level");
        assert_eq!(place("stack.backoff"), "in [stack.backoff]");
        assert_eq!(place("chaos[0]"), "in `chaos[0]`");
    }
}
