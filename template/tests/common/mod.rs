//! Shared by the table tests: the values every case renders with, and a one-line form of an
//! outcome (`= output`, or `! line:col kind argument`).

// Each test file uses part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;

use ting_template::{ErrorKind, Lookup, Values};

/// The variables every case may use, as the load generator gives every recipient (`name` with
/// HTML-special characters, so escaping shows).
pub const KNOWN: &[&str] = &["id", "name", "order_id", "item", "total"];

pub struct Flat(pub BTreeMap<&'static str, &'static str>);

impl Flat {
    pub fn recipient() -> Flat {
        Flat(BTreeMap::from([
            ("id", "r1"),
            ("name", "Zoë <b>&</b> 'Q'"),
            ("order_id", "A-1"),
            ("item", "Tea"),
            ("total", "¥500"),
        ]))
    }
}

impl Values for Flat {
    fn lookup(&self, path: &[String]) -> Lookup {
        match path {
            [one] => self
                .0
                .get(one.as_str())
                .map_or(Lookup::Missing, |v| Lookup::Found(v.to_string())),
            _ => Lookup::Missing,
        }
    }
}

/// `kind argument`, e.g. `unknown-variable nmae`.
pub fn short(kind: &ErrorKind) -> String {
    let s = |k: &str, a: &str| format!("{k} {a}");
    match kind {
        ErrorKind::EscapedMustache => "escaped-mustache".into(),
        ErrorKind::UnclosedComment => "unclosed-comment".into(),
        ErrorKind::UnclosedTag => "unclosed-tag".into(),
        ErrorKind::UnclosedTriple => "unclosed-triple".into(),
        ErrorKind::Unescaped { name } => s("unescaped", name),
        ErrorKind::UnescapedCombined { name } => s("unescaped-combined", name),
        ErrorKind::Unsupported(f) => s("unsupported", &format!("{f:?}")),
        ErrorKind::Empty => "empty".into(),
        ErrorKind::DataVariable(n) => s("data-variable", n),
        ErrorKind::ContextPath(n) => s("context-path", n),
        ErrorKind::Literal(n) => s("literal", n),
        ErrorKind::NotAName(n) => s("not-a-name", n),
        ErrorKind::PathIntoText { path, .. } => s("path-into-text", path),
        ErrorKind::UnknownVariable(n) => s("unknown-variable", n),
        other => format!("{other:?}"),
    }
}
