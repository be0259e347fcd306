//! `[load.template]` checked at the boundary: Mustache syntax (the subset that the reference
//! stack's Handlebars renderer and any Mustache engine read alike) and only the variables the load
//! generator gives every recipient. A typo here would otherwise surface mid-run, as a 4xx from the
//! stack on the first batch.

use super::error::nearest;

/// The template variables every recipient has: `id` and `name`, plus the `vars` written by
/// `load::recipients::generate` (a test keeps the two in step).
pub const TEMPLATE_VARS: &[&str] = &["id", "name", "order_id", "item", "total"];

/// Block helpers Handlebars knows (`{{#if x}}…{{/if}}`).
const BLOCK_HELPERS: &[&str] = &["if", "unless", "each", "with"];
/// Inline helpers Handlebars knows (`{{lookup x "k"}}`).
const INLINE_HELPERS: &[&str] = &[
    "lookup", "eq", "ne", "gt", "gte", "lt", "lte", "and", "or", "not", "len", "log",
];

/// What is wrong with a template, without the field name (the caller adds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    pub message: String,
    /// The nearest variable, for an unknown one.
    pub suggestion: Option<String>,
}

fn fail(message: String) -> TemplateError {
    TemplateError {
        message,
        suggestion: None,
    }
}

/// An open section: its name, how it was written, whether it changes the context (`each`,
/// `with`: names inside refer to the item, not the recipient).
struct Open {
    name: String,
    tag: String,
    new_context: bool,
}

/// What a template may hold besides escaped variables.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rules {
    /// Whether `{{{x}}}` / `{{&x}}` may appear (the built-in stack refuses them unless its
    /// `unescaped-template` flaw is on).
    pub allow_unescaped: bool,
    /// Only what the built-in stack's renderer takes ([`check_built_in`]): comments and bare
    /// recipient variables, no sections, helpers, whitespace control, paths or literals. An
    /// external stack may take full Mustache.
    pub variables_only: bool,
}

/// Checks `src` under `rules`.
pub fn check(src: &str, rules: Rules) -> Result<(), TemplateError> {
    if rules.variables_only {
        check_built_in(src, rules.allow_unescaped)
    } else {
        check_mustache(src, rules.allow_unescaped)
    }
}

/// Whitespace Handlebars skips inside a tag (its grammar's `WHITESPACE`). Any other character,
/// Unicode whitespace included, becomes part of the name (and then is no variable) or a syntax
/// error.
const TAG_SPACE: [char; 4] = [' ', '\t', '\n', '\r'];

/// The built-in stack's subset, exactly as `stack/src/render.rs` reads it (`check_subset`, then
/// Handlebars in strict mode with no helpers, rendered with each recipient's variables):
/// comments `{{! … }}` (closed by the first `}}`) and `{{!-- … --}}` (closed by the first
/// `--}}`), and escaped variables `{{ name }}` whose name is exactly one of [`TEMPLATE_VARS`]
/// (every one is text, so a dotted path finds nothing); with `allow_unescaped`, also `{{{ name }}}`
/// and `{{& name}}`. No `\{{`, sections, helpers, `else`, partials, decorators, delimiter
/// changes, whitespace control, `@data`, `this`, `.`/`..` paths or literals.
fn check_built_in(src: &str, allow_unescaped: bool) -> Result<(), TemplateError> {
    let only_variables = |tag: &str| {
        fail(format!(
            "`{tag}`: the built-in stack's templates hold escaped variables such as \
             `{{{{order_id}}}}` and comments only (no sections, helpers or whitespace control)"
        ))
    };
    let mut i = 0;
    while let Some(p) = src[i..].find("{{") {
        let start = i + p;
        if src[i..start].ends_with('\\') {
            return Err(fail(format!(
                "`\\{}`: the built-in stack does not support escaped mustaches `\\{{{{`",
                snippet(&src[start..])
            )));
        }
        let at = &src[start..];
        // Long comments may contain `}}`; the first `--}}` closes them.
        if let Some(body) = at.strip_prefix("{{!--") {
            let Some(q) = body.find("--}}") else {
                return Err(fail(format!(
                    "comment `{}` is never closed with `--}}}}`",
                    snippet(at)
                )));
            };
            i = start + 5 + q + 4;
            continue;
        }
        let (inner, len, triple) = if let Some(body) = at.strip_prefix("{{{") {
            let Some(q) = body.find("}}}") else {
                return Err(fail(format!(
                    "tag `{}` opens with `{{{{{{` but does not close with `}}}}}}`",
                    snippet(at)
                )));
            };
            (&body[..q], 3 + q + 3, true)
        } else {
            let Some(q) = at[2..].find("}}") else {
                return Err(fail(format!(
                    "tag `{}` is never closed with `}}}}`",
                    snippet(at)
                )));
            };
            (&at[2..2 + q], 2 + q + 2, false)
        };
        let tag = &at[..len];
        i = start + len;
        let unescaped_refused = |name: &str| {
            fail(format!(
                "`{tag}` inserts recipient data unescaped, which the built-in stack refuses; \
                 write `{{{{{}}}}}`, or switch on the `unescaped-template` flaw",
                name.trim().trim_start_matches('&').trim()
            ))
        };
        if triple && !allow_unescaped {
            return Err(unescaped_refused(inner));
        }
        if !triple && inner.starts_with('!') {
            continue;
        }
        if inner.starts_with('~') || inner.ends_with('~') {
            return Err(only_variables(tag));
        }
        let body = inner.trim_matches(TAG_SPACE);
        let name = match body.chars().next() {
            Some('&') if triple => {
                return Err(fail(format!(
                    "`{tag}`: `{{{{{{ }}}}}}` and `&` do not combine; write `{{{{{{{}}}}}}}`",
                    body[1..].trim_matches(TAG_SPACE)
                )))
            }
            Some('&') if !allow_unescaped => return Err(unescaped_refused(&body[1..])),
            Some('&') => body[1..].trim_matches(TAG_SPACE),
            Some('#' | '^' | '/') => return Err(only_variables(tag)),
            Some('>') => {
                return Err(fail(format!(
                    "`{tag}`: partials are not supported (the template has none)"
                )))
            }
            Some('*') => return Err(fail(format!("`{tag}`: decorators are not supported"))),
            Some('=') => {
                return Err(fail(format!(
                    "`{tag}`: changing the delimiters is not supported"
                )))
            }
            _ => body,
        };
        if name == "else" || name.contains(TAG_SPACE) {
            return Err(only_variables(tag));
        }
        bare_variable(name, tag)?;
    }
    Ok(())
}

/// One name in a built-in stack tag: exactly a variable every recipient has.
fn bare_variable(name: &str, tag: &str) -> Result<(), TemplateError> {
    if TEMPLATE_VARS.contains(&name) {
        return Ok(());
    }
    let not_a_variable = |what: String| {
        fail(format!(
            "`{tag}`: {what}; the built-in stack renders bare variable names only, such as \
             `{{{{order_id}}}}`"
        ))
    };
    if name.is_empty() {
        return Err(fail(format!("empty tag `{tag}`")));
    }
    if name.starts_with('@') {
        return Err(not_a_variable(format!("`{name}` is a data variable")));
    }
    if name == "this"
        || name == "."
        || ["this.", "this/", "./", "../", ".."]
            .iter()
            .any(|p| name.starts_with(p))
    {
        return Err(not_a_variable(format!("`{name}` is a context path")));
    }
    if name.starts_with(|c: char| c.is_ascii_digit() || "-\"'[".contains(c))
        || ["true", "false", "null", "undefined"].contains(&name)
    {
        return Err(not_a_variable(format!("`{name}` is a literal")));
    }
    let root = name.split(['.', '/']).next().unwrap_or(name);
    if root != name && TEMPLATE_VARS.contains(&root) {
        return Err(not_a_variable(format!(
            "`{root}` is text, so `{name}` finds nothing"
        )));
    }
    Err(TemplateError {
        message: format!(
            "`{tag}` uses unknown variable `{root}`; every recipient has {}",
            super::error::list(TEMPLATE_VARS)
        ),
        suggestion: nearest(root, TEMPLATE_VARS.iter().copied()),
    })
}

/// Full Mustache (and the Handlebars helpers any engine of an external stack may know).
fn check_mustache(src: &str, allow_unescaped: bool) -> Result<(), TemplateError> {
    let mut open: Vec<Open> = Vec::new();
    let mut i = 0;
    while let Some(p) = src[i..].find("{{") {
        let start = i + p;
        let after = &src[start + 2..];
        let lead = usize::from(after.starts_with('~'));
        // Long comments may contain `}}`.
        if after[lead..].starts_with("!--") {
            let Some(q) = after.find("--}}").or_else(|| after.find("--~}}")) else {
                return Err(fail(format!(
                    "comment `{}` is never closed with `--}}}}`",
                    snippet(&src[start..])
                )));
            };
            i = start + 2 + q + after[q..].find("}}").unwrap_or(0) + 2;
            continue;
        }
        let Some(q) = after.find("}}") else {
            return Err(fail(format!(
                "tag `{}` is never closed with `}}}}`",
                snippet(&src[start..])
            )));
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
                None => {
                    return Err(fail(format!(
                        "tag `{}` opens with `{{{{{{` but does not close with `}}}}}}`",
                        snippet(&src[start..])
                    )))
                }
            };
        } else if let Some(b) = body.strip_prefix('&') {
            unescaped = true;
            body = b;
        }
        let tag = &src[start..end];
        i = end;
        let body = body.trim();
        if unescaped && !allow_unescaped {
            return Err(fail(format!(
                "`{tag}` inserts recipient data unescaped, which the built-in stack refuses; \
                 write `{{{{{}}}}}`, or switch on the `unescaped-template` flaw",
                body.trim()
            )));
        }
        let in_new_context = open.iter().any(|o| o.new_context);
        let vars = |words: &[&str]| -> Result<(), TemplateError> {
            if in_new_context {
                return Ok(());
            }
            words.iter().try_for_each(|w| variable(w, tag))
        };
        let words: Vec<&str> = body.split_whitespace().collect();
        let first = body.chars().next();
        match first {
            None => return Err(fail(format!("empty tag `{tag}`"))),
            Some('!') => {}
            Some('#') | Some('^') if body.len() > 1 || body.starts_with('#') => {
                let rest: Vec<&str> = body[1..].split_whitespace().collect();
                let Some(&name) = rest.first() else {
                    return Err(fail(format!("`{tag}` opens a section without a name")));
                };
                if name.starts_with('>') || name.starts_with('*') {
                    return Err(fail(format!(
                        "`{tag}`: partials are not supported (the template has none)"
                    )));
                }
                let helper = body.starts_with('#') && BLOCK_HELPERS.contains(&name);
                if helper {
                    if rest.len() < 2 {
                        return Err(fail(format!("`{tag}`: `{name}` needs a variable")));
                    }
                    vars(&rest[1..])?;
                } else {
                    if rest.len() > 1 {
                        return Err(fail(format!(
                            "`{tag}`: unknown block helper `{name}`; sections are `{{{{#var}}}}`, \
                             or `{{{{#if var}}}}`, `{{{{#unless var}}}}`, `{{{{#each var}}}}`, \
                             `{{{{#with var}}}}`"
                        )));
                    }
                    vars(&rest)?;
                }
                open.push(Open {
                    name: name.to_string(),
                    tag: tag.to_string(),
                    new_context: helper && (name == "each" || name == "with"),
                });
            }
            Some('^') => {
                // `{{^}}`: Handlebars' `else`.
                if open.is_empty() {
                    return Err(fail(format!("`{tag}` outside a section")));
                }
            }
            Some('/') => {
                let name = body[1..].trim();
                match open.pop() {
                    None => return Err(fail(format!("`{tag}` closes a section that is not open"))),
                    Some(o) if o.name != name => {
                        return Err(fail(format!(
                            "`{tag}` does not close `{}`; close it with `{{{{/{}}}}}` first",
                            o.tag, o.name
                        )))
                    }
                    Some(_) => {}
                }
            }
            Some('>') => {
                return Err(fail(format!(
                    "`{tag}`: partials are not supported (the template has none)"
                )))
            }
            Some('=') => {
                return Err(fail(format!(
                    "`{tag}`: changing the delimiters is not supported"
                )))
            }
            _ if words[0] == "else" => {
                if open.is_empty() {
                    return Err(fail(format!("`{tag}` outside a section")));
                }
                match words.get(1) {
                    None => {}
                    Some(&"if") | Some(&"unless") if words.len() > 2 => vars(&words[2..])?,
                    Some(_) => return Err(fail(format!("`{tag}`: expected `{{{{else}}}}`"))),
                }
            }
            _ if words.len() == 1 => vars(&words)?,
            _ if INLINE_HELPERS.contains(&words[0]) => vars(&words[1..])?,
            _ => {
                return Err(fail(format!(
                    "`{tag}` holds more than one name and `{}` is not a helper; a tag holds one \
                     variable, e.g. `{{{{order_id}}}}`",
                    words[0]
                )))
            }
        }
    }
    if let Some(o) = open.pop() {
        return Err(fail(format!(
            "`{}` is never closed: add `{{{{/{}}}}}`",
            o.tag, o.name
        )));
    }
    Ok(())
}

/// Checks one argument of a tag: literals and context paths pass, a variable must be one the
/// load generator provides.
fn variable(word: &str, tag: &str) -> Result<(), TemplateError> {
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
    if TEMPLATE_VARS.contains(&root) {
        return Ok(());
    }
    Err(TemplateError {
        message: format!(
            "`{tag}` uses unknown variable `{root}`; every recipient has {}",
            super::error::list(TEMPLATE_VARS)
        ),
        suggestion: nearest(root, TEMPLATE_VARS.iter().copied()),
    })
}

/// The start of an unclosed tag, for the message: up to the end of the line, at most 30 chars.
fn snippet(s: &str) -> String {
    let line = s.lines().next().unwrap_or(s);
    let mut out: String = line.chars().take(30).collect();
    if out.len() < line.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_what_the_renderers_read() {
        for ok in [
            "",
            "plain text, no tags",
            "Hi {{name}}, order {{ order_id }} ({{item}}) {{total}} for {{id}}",
            "{{~name~}}",
            "{{! a comment }}{{!-- a comment with }} inside --}}",
            "{{#order_id}}has {{order_id}}{{/order_id}}{{^item}}no item{{/item}}",
            "{{#if name}}Hi {{name}}{{else}}Hi{{/if}}",
            "{{#unless item}}-{{^}}{{item}}{{/unless}}",
            "{{#each name}}{{this}} {{@index}} {{anything}}{{/each}}",
            "{{lookup name 0}} {{eq item \"x\"}}",
            "{{this.name}}",
        ] {
            assert_eq!(check(ok, Rules::default()), Ok(()), "{ok}");
        }
        let unescaped = Rules {
            allow_unescaped: true,
            variables_only: false,
        };
        assert_eq!(
            check("{{{name}}} {{&item}} {{~{total}~}}", unescaped),
            Ok(())
        );
    }

    #[test]
    fn rejects_syntax_errors_and_unknown_variables() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            (
                "Order {{ordr_id}}",
                "unknown variable `ordr_id`",
                Some("order_id"),
            ),
            (
                "Order {{order_id}} {{#broken",
                "`{{#broken` is never closed with `}}`",
                None,
            ),
            (
                "{{#item}}x",
                "`{{#item}}` is never closed: add `{{/item}}`",
                None,
            ),
            (
                "{{#item}}x{{/name}}",
                "`{{/name}}` does not close `{{#item}}`",
                None,
            ),
            ("x{{/item}}", "closes a section that is not open", None),
            ("{{}}", "empty tag", None),
            ("{{#if}}", "`if` needs a variable", None),
            (
                "{{#if nmae}}{{/if}}",
                "unknown variable `nmae`",
                Some("name"),
            ),
            ("{{order id}}", "`order` is not a helper", None),
            ("{{> footer}}", "partials are not supported", None),
            ("{{=<% %>=}}", "delimiters", None),
            ("{{{name}}", "does not close with `}}}`", None),
            ("{{{name}}}", "unescaped", None),
            ("{{&name}}", "unescaped", None),
            ("{{else}}", "outside a section", None),
            ("{{!-- open", "never closed with `--}}`", None),
            ("{{user.email}}", "unknown variable `user`", None),
        ];
        for (src, fragment, suggestion) in cases {
            let e = check(src, Rules::default()).expect_err(src);
            assert!(e.message.contains(fragment), "{src}: {}", e.message);
            assert_eq!(e.suggestion.as_deref(), *suggestion, "{src}");
        }
    }

    #[test]
    fn the_default_template_is_valid() {
        let t = crate::scenario::raw::RawTemplate::default();
        for s in [&t.subject, &t.text, &t.html, &t.line, &t.sms] {
            assert_eq!(check(s, BUILT_IN), Ok(()), "{s}");
        }
    }

    const BUILT_IN: Rules = Rules {
        allow_unescaped: false,
        variables_only: true,
    };

    #[test]
    fn the_built_in_stack_takes_variables_and_comments_only() {
        assert_eq!(
            check(
                "Hi {{name}} {{ order_id }} {{! note }}{{!-- x --}}",
                BUILT_IN
            ),
            Ok(())
        );
        for src in [
            "{{#order_id}}x{{/order_id}}",
            "{{^item}}none{{/item}}",
            "{{#if name}}x{{/if}}",
            "{{lookup name 0}}",
            "{{~name~}}",
        ] {
            let e = check(src, BUILT_IN).expect_err(src);
            assert!(e.message.contains("variables"), "{src}: {}", e.message);
        }
        // The flaw switch puts unescaped slots back, and nothing else.
        let flawed = Rules {
            allow_unescaped: true,
            ..BUILT_IN
        };
        assert_eq!(check("{{{name}}} {{&item}}", flawed), Ok(()));
        assert!(check("{{#if name}}{{/if}}", flawed).is_err());
    }

    /// What full Mustache reads as data, context paths or literals, the built-in stack's
    /// `check_subset` refuses or its strict rendering finds nothing for: a tag there names one of
    /// the recipient's variables, bare.
    #[test]
    fn the_built_in_stack_takes_bare_variable_names_only() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("{{@index}}", "`@index` is a data variable", None),
            ("{{@root.name}}", "`@root.name` is a data variable", None),
            ("{{this}}", "`this` is a context path", None),
            ("{{this.name}}", "`this.name` is a context path", None),
            ("{{.}}", "`.` is a context path", None),
            ("{{../name}}", "`../name` is a context path", None),
            ("{{42}}", "`42` is a literal", None),
            ("{{\"x\"}}", "`\"x\"` is a literal", None),
            ("{{true}}", "`true` is a literal", None),
            (
                "{{name.first}}",
                "`name` is text, so `name.first` finds nothing",
                None,
            ),
            ("{{nmae.first}}", "unknown variable `nmae`", Some("name")),
            (
                "{{name\u{a0}}}",
                "unknown variable `name\u{a0}`",
                Some("name"),
            ),
            (
                "Hi \\{{name}}",
                "`\\{{name}}`: the built-in stack does not support escaped",
                None,
            ),
            ("{{*dec}}", "decorators are not supported", None),
            (
                "{{!--}}",
                "comment `{{!--}}` is never closed with `--}}`",
                None,
            ),
            ("{{!-- x --~}}", "never closed with `--}}`", None),
            ("{{ }}", "empty tag", None),
            ("{{else}}", "variables", None),
            ("{{ ! x }}", "variables", None),
        ];
        let flawed = Rules {
            allow_unescaped: true,
            ..BUILT_IN
        };
        for (src, fragment, suggestion) in cases {
            for rules in [BUILT_IN, flawed] {
                let e = check(src, rules).expect_err(src);
                assert!(e.message.contains(fragment), "{src}: {}", e.message);
                assert_eq!(e.suggestion.as_deref(), *suggestion, "{src}");
            }
        }
        // Comments close where the stack closes them, and may hold anything, `~` included.
        assert_eq!(
            check(
                "{{! x ~}}{{!----}}{{!-- }} {{@index}} --}}{{! {{this}} }}}",
                BUILT_IN
            ),
            Ok(())
        );
        // The flaw's unescaped slots take the same bare names.
        assert_eq!(check("{{{ name }}} {{&  item }}", flawed), Ok(()));
        assert!(check("{{{this}}}", flawed).is_err());
        let e = check("{{{&name}}}", flawed).unwrap_err();
        assert!(e.message.contains("do not combine"), "{}", e.message);
        let e = check("{{{&name}}}", BUILT_IN).unwrap_err();
        assert!(e.message.contains("write `{{name}}`"), "{}", e.message);
        assert!(check("{{&name.first}}", flawed).is_err());
    }
}
