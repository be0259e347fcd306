//! What is wrong with a template: one kind per reason, each with the tag as written and the
//! position of its first character. The messages name the tag and say what to write instead;
//! callers add their own context (which template field, which variables exist).

use crate::Pos;

/// A template error at a position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    /// Where the tag (or, for `\{{`, the backslash) begins.
    pub at: Pos,
    /// The tag as written; for a tag never closed, its start (to the end of its line, at most
    /// 30 characters).
    pub tag: String,
}

/// A Mustache feature the subset refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// `{{#x}}`, `{{^x}}`, `{{/x}}`.
    Section,
    /// `{{#each xs}}`, `{{#if x}}`, `{{#> layout}}`.
    BlockHelper,
    /// `{{~x}}`, `{{x~}}`.
    WhitespaceControl,
    /// `{{else}}`.
    Else,
    /// `{{lookup x "k"}}`: more than one word in a tag.
    HelperCall,
    /// `{{> p}}`.
    Partial,
    /// `{{* d}}`, `{{#*inline}}`.
    Decorator,
    /// `{{=<% %>=}}`.
    DelimiterChange,
}

impl Feature {
    fn what(self) -> &'static str {
        match self {
            Feature::Section => "sections are",
            Feature::BlockHelper => "block helpers are",
            Feature::WhitespaceControl => "whitespace control is",
            Feature::Else => "`else` is",
            Feature::HelperCall => "helper calls are",
            Feature::Partial => "partials are",
            Feature::Decorator => "decorators are",
            Feature::DelimiterChange => "changing the delimiters is",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// `\{{`: Handlebars would print the tag literally; the subset has no escape.
    EscapedMustache,
    UnclosedComment,
    UnclosedTag,
    /// `{{{` without `}}}`.
    UnclosedTriple,
    /// `{{{name}}}` or `{{&name}}` where unescaped slots are not allowed.
    Unescaped {
        name: String,
    },
    /// `{{{&name}}}`.
    UnescapedCombined {
        name: String,
    },
    Unsupported(Feature),
    Empty,
    /// `{{@index}}`.
    DataVariable(String),
    /// `{{this}}`, `{{.}}`, `{{../x}}`.
    ContextPath(String),
    /// `{{42}}`, `{{"x"}}`, `{{true}}`, `{{[x]}}`.
    Literal(String),
    /// Anything else that is not `name` or `a.b.c` (segments of ASCII letters, digits, `_`, `-`;
    /// the first starting with a letter or `_`).
    NotAName(String),
    /// A path below a known variable that is plain text (`{{name.first}}`), from [`crate::validate`].
    PathIntoText {
        root: String,
        path: String,
    },
    /// A variable the caller does not know, from [`crate::validate`].
    UnknownVariable(String),
    // Full Mustache ([`crate::full`]) only.
    /// A section opened and never closed.
    UnclosedSection {
        name: String,
    },
    /// `{{/b}}` while `{{#a}}` is open.
    MismatchedClose {
        open: String,
        name: String,
    },
    /// `{{/a}}` with nothing open.
    StrayClose,
    /// `{{else}}` or `{{^}}` outside a section.
    OutsideSection,
    /// `{{#}}`.
    SectionWithoutName,
    /// `{{#if}}`.
    HelperNeedsVariable(String),
    /// `{{#x y}}` where `x` is no block helper.
    UnknownBlockHelper(String),
    /// `{{x y}}` where `x` is no helper.
    NotAHelper(String),
    /// `{{else x}}` for an `x` other than `if` / `unless`.
    ExpectedElse,
}

const ONLY: &str = "a template holds escaped variables such as `{{order_id}}` and comments only";
const BARE: &str = "a template holds bare variable names only, such as `{{order_id}}`";

impl Error {
    /// The message without the position.
    pub fn message(&self) -> String {
        let tag = &self.tag;
        match &self.kind {
            ErrorKind::EscapedMustache => {
                format!("`\\{tag}`: escaped mustaches `\\{{{{` are not supported")
            }
            ErrorKind::UnclosedComment => format!("comment `{tag}` is never closed with `--}}}}`"),
            ErrorKind::UnclosedTag => format!("tag `{tag}` is never closed with `}}}}`"),
            ErrorKind::UnclosedTriple => {
                format!("tag `{tag}` opens with `{{{{{{` but does not close with `}}}}}}`")
            }
            ErrorKind::Unescaped { name } => format!(
                "`{tag}` inserts recipient data unescaped, which is not allowed; write `{{{{{name}}}}}`"
            ),
            ErrorKind::UnescapedCombined { name } => {
                format!("`{tag}`: `{{{{{{ }}}}}}` and `&` do not combine; write `{{{{{{{name}}}}}}}`")
            }
            ErrorKind::Unsupported(f) => {
                format!("`{tag}`: {} not supported; {ONLY}", f.what())
            }
            ErrorKind::Empty => format!("empty tag `{tag}`"),
            ErrorKind::DataVariable(n) => format!("`{tag}`: `{n}` is a data variable; {BARE}"),
            ErrorKind::ContextPath(n) => format!("`{tag}`: `{n}` is a context path; {BARE}"),
            ErrorKind::Literal(n) => format!("`{tag}`: `{n}` is a literal; {BARE}"),
            ErrorKind::NotAName(n) => format!(
                "`{tag}`: `{n}` is not a variable name (ASCII letters, digits, `_` and `-`, dotted)"
            ),
            ErrorKind::PathIntoText { root, path } => {
                format!("`{tag}`: `{root}` is text, so `{path}` finds nothing; {BARE}")
            }
            ErrorKind::UnknownVariable(n) => format!("`{tag}` uses unknown variable `{n}`"),
            ErrorKind::UnclosedSection { name } => {
                format!("`{tag}` is never closed: add `{{{{/{name}}}}}`")
            }
            ErrorKind::MismatchedClose { open, name } => {
                format!("`{tag}` does not close `{open}`; close it with `{{{{/{name}}}}}` first")
            }
            ErrorKind::StrayClose => format!("`{tag}` closes a section that is not open"),
            ErrorKind::OutsideSection => format!("`{tag}` outside a section"),
            ErrorKind::SectionWithoutName => format!("`{tag}` opens a section without a name"),
            ErrorKind::HelperNeedsVariable(n) => format!("`{tag}`: `{n}` needs a variable"),
            ErrorKind::UnknownBlockHelper(n) => format!(
                "`{tag}`: unknown block helper `{n}`; sections are `{{{{#var}}}}`, or \
                 `{{{{#if var}}}}`, `{{{{#unless var}}}}`, `{{{{#each var}}}}`, `{{{{#with var}}}}`"
            ),
            ErrorKind::NotAHelper(w) => format!(
                "`{tag}` holds more than one name and `{w}` is not a helper; a tag holds one \
                 variable, e.g. `{{{{order_id}}}}`"
            ),
            ErrorKind::ExpectedElse => format!("`{tag}`: expected `{{{{else}}}}`"),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.at, self.message())
    }
}

impl std::error::Error for Error {}
