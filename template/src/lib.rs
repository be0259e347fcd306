//! The template language of ting-chaos, in one place: the Mustache subset the reference stack
//! renders (escaped variables `{{name}}` / `{{a.b}}` and comments `{{! … }}` / `{{!-- … --}}`,
//! plus `{{{name}}}` / `{{&name}}` only when a caller allows unescaped slots), parsed once into a
//! small AST with a line:col position for every error, validated against the variables a caller
//! knows, and rendered with or without HTML escaping. The stack renders with it and the harness
//! validates scenarios with it, so the two cannot disagree on what a template means.
//!
//! [`full`] checks the wider Mustache an external stack's engine may read (sections, `else`,
//! Handlebars' helpers); it validates only and renders nothing.
//!
//! This crate must depend on nothing but std, and on neither the harness nor the stack.

mod error;
pub mod full;
mod parse;
mod render;
mod validate;

pub use error::{Error, ErrorKind, Feature};
pub use parse::{parse, Node, Template};
pub use render::{escape_html, render, Escape, Lookup, Missing, Values};
pub use validate::validate;

/// A position in a template: 1-based line and column, the column counted in characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

impl Pos {
    /// The position of byte offset `at` in `src`.
    pub fn of(src: &str, at: usize) -> Pos {
        let before = &src[..at];
        let line = 1 + before.matches('\n').count() as u32;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = 1 + before[line_start..].chars().count() as u32;
        Pos { line, col }
    }
}

impl std::fmt::Display for Pos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// What a template may hold besides escaped variables and comments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Whether `{{{x}}}` and `{{&x}}` may appear (the reference stack refuses them unless its
    /// `unescaped-template` flaw is on).
    pub allow_unescaped: bool,
}
