//! The subset's one lexer and parser: source → [`Template`], or the first [`Error`] with its
//! position. Comments are dropped here, and a comment alone on its line takes the line with it,
//! exactly as Handlebars (which the reference stack rendered with before) trims standalone
//! statements, so stored payloads keep their bytes.

use crate::error::{Error, ErrorKind, Feature};
use crate::{Options, Pos};

/// A parsed template: text and variable slots, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    pub nodes: Vec<Node>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Text(String),
    /// `{{a.b}}` (`escaped`) or `{{{a.b}}}` / `{{&a.b}}`.
    Var {
        path: Vec<String>,
        escaped: bool,
        at: Pos,
        tag: String,
    },
}

impl Template {
    /// Every variable slot: its path, position and tag as written.
    pub fn variables(&self) -> impl Iterator<Item = (&[String], Pos, &str)> {
        self.nodes.iter().filter_map(|n| match n {
            Node::Var { path, at, tag, .. } => Some((path.as_slice(), *at, tag.as_str())),
            Node::Text(_) => None,
        })
    }
}

/// Whitespace skipped inside a tag (Handlebars' grammar's `WHITESPACE`). Any other character,
/// Unicode whitespace included, is part of the name (and then no name).
pub(crate) const TAG_SPACE: [char; 4] = [' ', '\t', '\n', '\r'];

/// The start of a tag never closed: up to the end of its line, at most 30 characters.
pub(crate) fn snippet(s: &str) -> String {
    let line = s.lines().next().unwrap_or(s);
    let mut out: String = line.chars().take(30).collect();
    if out.len() < line.len() {
        out.push('…');
    }
    out
}

/// One token before standalone comments are trimmed.
enum Token {
    Text(String),
    /// A comment's byte range in the source.
    Comment(usize, usize),
    Var(Node),
}

/// Parses `src` into the subset's AST.
pub fn parse(src: &str, opts: Options) -> Result<Template, Error> {
    parse_checked(src, opts, &not_a_variable)
}

/// [`parse`], with `check` deciding each slot's name in order (`None`: a variable), so the first
/// error in the source is the one reported, whether of syntax or of names.
pub(crate) fn parse_checked(
    src: &str,
    opts: Options,
    check: &dyn Fn(&str) -> Option<ErrorKind>,
) -> Result<Template, Error> {
    let err = |kind, at: usize, tag: String| Error {
        kind,
        at: Pos::of(src, at),
        tag,
    };
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(p) = src[i..].find("{{") {
        let start = i + p;
        if start > i {
            if src[i..start].ends_with('\\') {
                return Err(err(
                    ErrorKind::EscapedMustache,
                    start - 1,
                    snippet(&src[start..]),
                ));
            }
            tokens.push(Token::Text(src[i..start].to_string()));
        }
        let at = &src[start..];
        // A long comment may hold `}}`; the first `--}}` closes it.
        if let Some(body) = at.strip_prefix("{{!--") {
            let Some(q) = body.find("--}}") else {
                return Err(err(ErrorKind::UnclosedComment, start, snippet(at)));
            };
            i = start + 5 + q + 4;
            tokens.push(Token::Comment(start, i));
            continue;
        }
        let (inner, len, triple) = if let Some(body) = at.strip_prefix("{{{") {
            let Some(q) = body.find("}}}") else {
                return Err(err(ErrorKind::UnclosedTriple, start, snippet(at)));
            };
            (&body[..q], 3 + q + 3, true)
        } else {
            let Some(q) = at[2..].find("}}") else {
                return Err(err(ErrorKind::UnclosedTag, start, snippet(at)));
            };
            (&at[2..2 + q], 2 + q + 2, false)
        };
        let tag = &at[..len];
        i = start + len;
        if !triple && inner.starts_with('!') {
            tokens.push(Token::Comment(start, i));
            continue;
        }
        let fail = |kind| Err(err(kind, start, tag.to_string()));
        let body = inner.trim_matches(TAG_SPACE);
        if triple && !opts.allow_unescaped {
            let name = body.trim_start_matches('&').trim_matches(TAG_SPACE);
            return fail(ErrorKind::Unescaped { name: name.into() });
        }
        if inner.starts_with('~') || inner.ends_with('~') {
            return fail(ErrorKind::Unsupported(Feature::WhitespaceControl));
        }
        let (name, escaped) = match body.chars().next() {
            Some('&') if triple => {
                let name = body[1..].trim_matches(TAG_SPACE);
                return fail(ErrorKind::UnescapedCombined { name: name.into() });
            }
            Some('&') if !opts.allow_unescaped => {
                let name = body[1..].trim_matches(TAG_SPACE);
                return fail(ErrorKind::Unescaped { name: name.into() });
            }
            Some('&') => (body[1..].trim_matches(TAG_SPACE), false),
            Some('#' | '^' | '/') => {
                let what = body[1..].trim_matches(TAG_SPACE);
                return fail(ErrorKind::Unsupported(if what.starts_with('*') {
                    Feature::Decorator
                } else if what.contains(TAG_SPACE) {
                    Feature::BlockHelper
                } else {
                    Feature::Section
                }));
            }
            Some('>') => return fail(ErrorKind::Unsupported(Feature::Partial)),
            Some('*') => return fail(ErrorKind::Unsupported(Feature::Decorator)),
            Some('=') => return fail(ErrorKind::Unsupported(Feature::DelimiterChange)),
            _ => (body, !triple),
        };
        if name == "else" {
            return fail(ErrorKind::Unsupported(Feature::Else));
        }
        if name.contains(TAG_SPACE) {
            return fail(ErrorKind::Unsupported(Feature::HelperCall));
        }
        if let Some(kind) = check(name) {
            return fail(kind);
        }
        tokens.push(Token::Var(Node::Var {
            path: name.split('.').map(str::to_string).collect(),
            escaped,
            at: Pos::of(src, start),
            tag: tag.to_string(),
        }));
    }
    if i < src.len() {
        tokens.push(Token::Text(src[i..].to_string()));
    }
    Ok(Template {
        nodes: standalone(src, tokens),
    })
}

/// Why `name` is no variable path, or `None` when it is one: `name` or `a.b.c`, segments of
/// ASCII letters, digits, `_` and `-`, the first starting with a letter or `_`, none `this`.
pub(crate) fn not_a_variable(name: &str) -> Option<ErrorKind> {
    let n = || name.to_string();
    if name.is_empty() {
        return Some(ErrorKind::Empty);
    }
    if name.starts_with('@') {
        return Some(ErrorKind::DataVariable(n()));
    }
    if name == "this"
        || name == "."
        || ["this.", "this/", "./", "../", ".."]
            .iter()
            .any(|p| name.starts_with(p))
    {
        return Some(ErrorKind::ContextPath(n()));
    }
    if name.starts_with(|c: char| c.is_ascii_digit() || "-\"'[".contains(c))
        || ["true", "false", "null", "undefined"].contains(&name)
    {
        return Some(ErrorKind::Literal(n()));
    }
    let ok = name.split('.').enumerate().all(|(i, seg)| {
        let mut chars = seg.chars();
        let first_ok = match chars.next() {
            Some(c) if i == 0 => c.is_ascii_alphabetic() || c == '_',
            Some(c) => c.is_ascii_alphanumeric() || c == '_' || c == '-',
            None => false,
        };
        first_ok
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            && seg != "this"
    });
    (!ok).then(|| ErrorKind::NotAName(n()))
}

/// Spaces and tabs: what Handlebars trims around a standalone statement.
fn blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// Drops the comments, trimming a standalone one's line as Handlebars does: a comment followed
/// by blanks and a line break (or the end) and preceded by a line break and blanks (or the
/// start) takes the blanks before it and the blanks and first line break after it.
fn standalone(src: &str, tokens: Vec<Token>) -> Vec<Node> {
    // Comments stay in the list until the end: "the element before" may be one.
    let mut out: Vec<Token> = Vec::with_capacity(tokens.len());
    let mut trim_next = false;
    for t in tokens {
        match t {
            Token::Text(s) => {
                let s = if trim_next {
                    let s = s.trim_start_matches(blank);
                    s.strip_prefix("\r\n")
                        .or_else(|| s.strip_prefix('\n'))
                        .unwrap_or(s)
                        .to_string()
                } else {
                    s
                };
                trim_next = false;
                out.push(Token::Text(s));
            }
            Token::Comment(start, end) => {
                let after = &src[end..];
                let trailing =
                    after.trim_start_matches(blank).starts_with(['\n', '\r']) || after.is_empty();
                trim_next = false;
                if trailing {
                    let before = src[..start].trim_end_matches(blank);
                    let leading = before.is_empty() || before.ends_with(['\n', '\r']);
                    if leading {
                        if let Some(Token::Text(prev)) = out.last_mut() {
                            prev.truncate(prev.trim_end_matches(blank).len());
                        }
                    }
                    trim_next = start == 0 || leading;
                }
                out.push(Token::Comment(start, end));
            }
            Token::Var(v) => out.push(Token::Var(v)),
        }
    }
    out.into_iter()
        .filter_map(|t| match t {
            Token::Text(s) if s.is_empty() => None,
            Token::Text(s) => Some(Node::Text(s)),
            Token::Var(v) => Some(v),
            Token::Comment(..) => None,
        })
        .collect()
}
