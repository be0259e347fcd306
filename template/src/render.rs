//! Rendering a parsed [`Template`] with a caller's values. Values come through [`Values`], so
//! this crate knows no data format; escaping is [`escape_html`], byte for byte the function
//! Handlebars' `html_escape` is (and the reference stack's payloads were escaped with), or none.

use crate::parse::{Node, Template};

/// Whether escaped slots (`{{x}}`) are HTML-escaped. Unescaped slots never are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Escape {
    Html,
    /// Nothing is escaped (the reference stack's `unescaped-template` flaw).
    None,
}

/// What a path finds among a caller's values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The value, as text.
    Found(String),
    /// Nothing at this path.
    Missing,
    /// The path cannot be followed (e.g. a word used as an index into a list): the reason.
    Invalid(String),
}

/// A caller's values by path (`["a", "b"]` for `{{a.b}}`).
pub trait Values {
    fn lookup(&self, path: &[String]) -> Lookup;
}

/// A slot whose path found nothing, or could not be followed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    /// The path, dotted as written.
    pub path: String,
    /// `Some(reason)` for a path that cannot be followed; `None` for nothing found.
    pub invalid: Option<String>,
}

/// Renders `t` with `values`; every slot must find a value.
pub fn render(t: &Template, values: &dyn Values, escape: Escape) -> Result<String, Missing> {
    let mut out = String::new();
    for n in &t.nodes {
        match n {
            Node::Text(s) => out.push_str(s),
            Node::Var { path, escaped, .. } => {
                let missing = |invalid| Missing {
                    path: path.join("."),
                    invalid,
                };
                let v = match values.lookup(path) {
                    Lookup::Found(v) => v,
                    Lookup::Missing => return Err(missing(None)),
                    Lookup::Invalid(why) => return Err(missing(Some(why))),
                };
                if *escaped && escape == Escape::Html {
                    out.push_str(&escape_html(&v));
                } else {
                    out.push_str(&v);
                }
            }
        }
    }
    Ok(out)
}

/// HTML-escapes `s` as Handlebars does (after handlebars.js): `<`, `>`, `"`, `&`, `'`, `` ` ``
/// and `=`.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '&' => out.push_str("&amp;"),
            '\'' => out.push_str("&#x27;"),
            '`' => out.push_str("&#x60;"),
            '=' => out.push_str("&#x3D;"),
            _ => out.push(c),
        }
    }
    out
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.invalid {
            None => write!(f, "`{{{{{}}}}}` finds no value", self.path),
            Some(why) => write!(f, "`{{{{{}}}}}`: {why}", self.path),
        }
    }
}

impl std::error::Error for Missing {}
