//! Full Mustache, and the Handlebars helpers an external stack's engine may know: sections
//! `{{#x}}…{{/x}}` and `{{^x}}`, block helpers (`if`, `unless`, `each`, `with`) with `{{else}}`,
//! inline helpers, whitespace control, unescaped slots when allowed. Validation only (this crate
//! renders the subset alone): sections balance, and every variable outside an `each` / `with`
//! (where names refer to the item) is one the caller knows. Partials and delimiter changes are
//! refused: the scenario gives none.

use crate::error::{Error, ErrorKind};
use crate::parse::snippet;
use crate::{Options, Pos};

/// Block helpers Handlebars knows (`{{#if x}}…{{/if}}`).
const BLOCK_HELPERS: &[&str] = &["if", "unless", "each", "with"];
/// Inline helpers Handlebars knows (`{{lookup x "k"}}`).
const INLINE_HELPERS: &[&str] = &[
    "lookup", "eq", "ne", "gt", "gte", "lt", "lte", "and", "or", "not", "len", "log",
];

/// An open section: its name, its tag, whether names inside refer to an item (`each`, `with`).
struct Open {
    name: String,
    tag: String,
    /// Byte offset of the tag.
    start: usize,
    new_context: bool,
}

/// Checks `src` as full Mustache against `known`, reporting the first error.
pub fn validate(src: &str, known: &[&str], opts: Options) -> Result<(), Error> {
    let mut open: Vec<Open> = Vec::new();
    let mut i = 0;
    while let Some(p) = src[i..].find("{{") {
        let start = i + p;
        let err = |kind, tag: &str| Error {
            kind,
            at: Pos::of(src, start),
            tag: tag.to_string(),
        };
        let after = &src[start + 2..];
        let lead = usize::from(after.starts_with('~'));
        // A long comment may hold `}}`.
        if after[lead..].starts_with("!--") {
            let Some(q) = after.find("--}}").or_else(|| after.find("--~}}")) else {
                return Err(err(ErrorKind::UnclosedComment, &snippet(&src[start..])));
            };
            i = start + 2 + q + after[q..].find("}}").unwrap_or(0) + 2;
            continue;
        }
        let Some(q) = after.find("}}") else {
            return Err(err(ErrorKind::UnclosedTag, &snippet(&src[start..])));
        };
        let mut end = start + 2 + q + 2;
        let mut body = after[..q].trim_start_matches('~').trim_end_matches('~');
        let mut unescaped = false;
        if let Some(b) = body.strip_prefix('{') {
            unescaped = true;
            body = match b.strip_suffix('}') {
                Some(b) => b.trim_end_matches('~'),
                None if src[end..].starts_with('}') => {
                    end += 1;
                    b
                }
                None => return Err(err(ErrorKind::UnclosedTriple, &snippet(&src[start..]))),
            };
        } else if let Some(b) = body.strip_prefix('&') {
            unescaped = true;
            body = b;
        }
        let tag = &src[start..end];
        i = end;
        let body = body.trim();
        if unescaped && !opts.allow_unescaped {
            let name = body.trim().to_string();
            return Err(err(ErrorKind::Unescaped { name }, tag));
        }
        let in_new_context = open.iter().any(|o| o.new_context);
        let vars = |words: &[&str]| -> Result<(), Error> {
            if in_new_context {
                return Ok(());
            }
            words
                .iter()
                .try_for_each(|w| variable(w, known).map_err(|k| err(k, tag)))
        };
        let words: Vec<&str> = body.split_whitespace().collect();
        match body.chars().next() {
            None => return Err(err(ErrorKind::Empty, tag)),
            Some('!') => {}
            Some('#') | Some('^') if body.len() > 1 || body.starts_with('#') => {
                let rest: Vec<&str> = body[1..].split_whitespace().collect();
                let Some(&name) = rest.first() else {
                    return Err(err(ErrorKind::SectionWithoutName, tag));
                };
                if name.starts_with('>') || name.starts_with('*') {
                    return Err(err(ErrorKind::Unsupported(crate::Feature::Partial), tag));
                }
                let helper = body.starts_with('#') && BLOCK_HELPERS.contains(&name);
                if helper {
                    if rest.len() < 2 {
                        return Err(err(ErrorKind::HelperNeedsVariable(name.into()), tag));
                    }
                    vars(&rest[1..])?;
                } else {
                    if rest.len() > 1 {
                        return Err(err(ErrorKind::UnknownBlockHelper(name.into()), tag));
                    }
                    vars(&rest)?;
                }
                open.push(Open {
                    name: name.to_string(),
                    tag: tag.to_string(),
                    start,
                    new_context: helper && (name == "each" || name == "with"),
                });
            }
            // `{{^}}`: Handlebars' `else`.
            Some('^') if open.is_empty() => return Err(err(ErrorKind::OutsideSection, tag)),
            Some('^') => {}
            Some('/') => {
                let name = body[1..].trim();
                match open.pop() {
                    None => return Err(err(ErrorKind::StrayClose, tag)),
                    Some(o) if o.name != name => {
                        let kind = ErrorKind::MismatchedClose {
                            open: o.tag,
                            name: o.name,
                        };
                        return Err(err(kind, tag));
                    }
                    Some(_) => {}
                }
            }
            Some('>') => return Err(err(ErrorKind::Unsupported(crate::Feature::Partial), tag)),
            Some('=') => {
                return Err(err(
                    ErrorKind::Unsupported(crate::Feature::DelimiterChange),
                    tag,
                ))
            }
            _ if words[0] == "else" => {
                if open.is_empty() {
                    return Err(err(ErrorKind::OutsideSection, tag));
                }
                match words.get(1) {
                    None => {}
                    Some(&"if") | Some(&"unless") if words.len() > 2 => vars(&words[2..])?,
                    Some(_) => return Err(err(ErrorKind::ExpectedElse, tag)),
                }
            }
            _ if words.len() == 1 => vars(&words)?,
            _ if INLINE_HELPERS.contains(&words[0]) => vars(&words[1..])?,
            _ => return Err(err(ErrorKind::NotAHelper(words[0].into()), tag)),
        }
    }
    if let Some(o) = open.pop() {
        return Err(Error {
            kind: ErrorKind::UnclosedSection { name: o.name },
            at: Pos::of(src, o.start),
            tag: o.tag,
        });
    }
    Ok(())
}

/// One argument of a tag: literals, data and context paths pass; a variable must be known.
fn variable(word: &str, known: &[&str]) -> Result<(), ErrorKind> {
    let word = word.split_once('=').map_or(word, |(_, v)| v);
    let literal = word.starts_with(['"', '\''])
        || word.starts_with(|c: char| c.is_ascii_digit() || c == '-')
        || ["true", "false", "null", "undefined"].contains(&word);
    if literal || word.starts_with('@') || word.starts_with("../") || word.starts_with('(') {
        return Ok(());
    }
    let path = word
        .strip_prefix("this.")
        .or_else(|| word.strip_prefix("./"))
        .unwrap_or(word);
    if path == "this" || path == "." {
        return Ok(());
    }
    let root = path.split(['.', '/']).next().unwrap_or(path);
    if known.contains(&root) {
        return Ok(());
    }
    Err(ErrorKind::UnknownVariable(root.into()))
}
