//! `[load.template]` checked at the boundary with `ting-template`, the one template engine the
//! reference stack renders with: only the variables the load generator gives every recipient,
//! in the stack's subset (or, for an external stack, full Mustache). A typo here would otherwise
//! surface mid-run, as a 4xx from the stack on the first batch. This file owns the messages'
//! scenario context (which variables exist, which flaw allows what); the language is the crate's.

use ting_template::{full, ErrorKind, Options, Pos};

use super::error::nearest;

/// The template variables every recipient has: `id` and `name`, plus the `vars` written by
/// `load::recipients::generate` (a test keeps the two in step).
pub const TEMPLATE_VARS: &[&str] = &["id", "name", "order_id", "item", "total"];

/// What is wrong with a template, without the field name (the caller adds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    /// Where in the template, line:col.
    pub at: Pos,
    pub message: String,
    /// The nearest variable, for an unknown one.
    pub suggestion: Option<String>,
}

/// What a template may hold besides escaped variables.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rules {
    /// Whether `{{{x}}}` / `{{&x}}` may appear (the built-in stack refuses them unless its
    /// `unescaped-template` flaw is on).
    pub allow_unescaped: bool,
    /// Only what the built-in stack renders (`ting_template::validate`): comments and bare
    /// recipient variables. An external stack may take full Mustache (`ting_template::full`).
    pub variables_only: bool,
}

/// Checks `src` under `rules`.
pub fn check(src: &str, rules: Rules) -> Result<(), TemplateError> {
    let opts = Options {
        allow_unescaped: rules.allow_unescaped,
    };
    let result = if rules.variables_only {
        ting_template::validate(src, TEMPLATE_VARS, opts).map(drop)
    } else {
        full::validate(src, TEMPLATE_VARS, opts)
    };
    result.map_err(|e| {
        let mut message = e.message();
        let mut suggestion = None;
        match &e.kind {
            ErrorKind::UnknownVariable(name) => {
                message.push_str(&format!(
                    "; every recipient has {}",
                    super::error::list(TEMPLATE_VARS)
                ));
                suggestion = nearest(name, TEMPLATE_VARS.iter().copied());
            }
            ErrorKind::Unescaped { .. } => {
                message.push_str(", or switch on the `unescaped-template` flaw");
            }
            _ => {}
        }
        TemplateError {
            at: e.at,
            message,
            suggestion,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUILT_IN: Rules = Rules {
        allow_unescaped: false,
        variables_only: true,
    };

    #[test]
    fn the_default_template_is_valid() {
        let t = crate::scenario::raw::RawTemplate::default();
        for s in [&t.subject, &t.text, &t.html, &t.line, &t.sms] {
            assert_eq!(check(s, BUILT_IN), Ok(()), "{s}");
        }
    }

    /// The language is `ting-template`'s (its table test); here, what the scenario adds: the
    /// variables every recipient has, the nearest one, the flaw that allows unescaped slots,
    /// and which dialect each kind of stack gets.
    #[test]
    fn messages_carry_the_scenarios_context() {
        let e = check("Order\n {{ordr_id}}", BUILT_IN).unwrap_err();
        assert_eq!(e.at, Pos { line: 2, col: 2 });
        assert_eq!(
            e.message,
            "`{{ordr_id}}` uses unknown variable `ordr_id`; every recipient has `id`, `name`, \
             `order_id`, `item`, `total`"
        );
        assert_eq!(e.suggestion.as_deref(), Some("order_id"));
        let e = check("{{name\u{a0}}}", BUILT_IN).unwrap_err();
        assert_eq!(e.suggestion.as_deref(), Some("name"), "{}", e.message);
        let e = check("Hi {{{name}}}", BUILT_IN).unwrap_err();
        assert!(
            e.message
                .ends_with("switch on the `unescaped-template` flaw"),
            "{}",
            e.message
        );
        let flawed = Rules {
            allow_unescaped: true,
            ..BUILT_IN
        };
        assert_eq!(check("{{{name}}} {{&item}}", flawed), Ok(()));
        assert!(check("{{#if name}}{{/if}}", flawed).is_err());
        let external = Rules {
            allow_unescaped: true,
            variables_only: false,
        };
        assert_eq!(
            check("{{#if name}}{{name}}{{else}}-{{/if}}", external),
            Ok(())
        );
        let e = check("{{#if nmae}}{{/if}}", external).unwrap_err();
        assert_eq!(e.suggestion.as_deref(), Some("name"));
    }
}
