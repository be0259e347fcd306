//! `ting-chaos validate` and the built-in stack agree on every template: what the harness's
//! scenario validation accepts, the stack's renderer compiles and renders strictly for the
//! recipients the load generator writes; what the harness rejects (at `load.template.<part>`),
//! the stack refuses too. A disagreement either fails a valid scenario at validation or lets a
//! template through that the stack then answers with a 4xx on the first batch.

use std::path::Path;

use serde_json::Value;
use stack::channels::Channel;
use stack::render::{RenderError, Renderer, TemplateIn};
use ting_chaos_harness::scenario::{self, RawTemplate};

/// What the built-in stack does with a template in a part every batch needs (`sms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// Compiles and renders, flaw or not.
    Ok,
    /// Only with the `unescaped-template` flaw on.
    FlawOnly,
    /// Never.
    No,
}
use Want::{FlawOnly, No, Ok};

const ROWS: &[(&str, Want)] = &[
    // Plain text, every variable the load generator writes, comments, unicode, HTML.
    ("plain text, no tags", Ok),
    ("Hi {{name}}", Ok),
    ("{{id}} {{name}} {{order_id}} {{item}} {{total}}", Ok),
    ("{{name}}{{item}}", Ok),
    ("{{ name }}", Ok),
    ("{{\tname\n}}", Ok),
    ("{{! a comment }}", Ok),
    ("{{!}}", Ok),
    ("{{!-- a comment with }} inside --}}", Ok),
    ("{{!-- {{#each name}}{{@index}}{{/each}} --}}", Ok),
    ("{{! {{nmae}} }}", Ok),
    ("{{! trailing tilde ~}}", Ok),
    ("{{!-- x --}} --}}", Ok),
    ("こんにちは {{name}} 🚀 Zoë, ご注文 {{order_id}}", Ok),
    (
        "<p>Hi <b>{{name}}</b> &amp; <a href=\"x?a=1&b=2\">{{item}}</a></p>",
        Ok,
    ),
    ("a { b } c }} d {", Ok),
    ("{{name}}}", Ok),
    ("{{name}}}}", Ok),
    ("\\ {{name}} back\\slash", Ok),
    ("{ {name} }", Ok),
    ("{{!-- --}}", Ok),
    ("{{!----}}", Ok),
    ("{{!--x}}--}}{{name}}", Ok),
    ("{{!-}}", Ok),
    ("{{!\n multi\n line }}", Ok),
    ("{{! a }}}", Ok),
    // What the review found accepted by the harness and refused by the stack.
    ("{{@index}}", No),
    ("{{@root.name}}", No),
    ("{{this}}", No),
    ("{{this.name}}", No),
    ("{{./name}}", No),
    ("{{.}}", No),
    ("{{42}}", No),
    ("{{-1}}", No),
    ("{{true}}", No),
    ("{{null}}", No),
    ("{{\"x\"}}", No),
    ("{{'x'}}", No),
    ("{{../name}}", No),
    ("\\{{name}}", No),
    ("\\\\{{name}}", No),
    ("Hi {{name}} \\{{item}}", No),
    ("{{name.first}}", No),
    ("{{order_id.x}}", No),
    ("{{name/first}}", No),
    ("{{[name]}}", No),
    ("{{name.}}", No),
    ("{{!-- a --}}\\{{name}}", No),
    ("{{! a }}\\{{name}}", No),
    // Unknown variables (the stack renders strictly: a missing one is an error).
    ("{{nmae}}", No),
    ("{{user}}", No),
    ("{{if}}", No),
    ("{{len}}", No),
    ("{{名前}}", No),
    ("{{name\u{a0}}}", No),
    ("{{\u{a0}name}}", No),
    ("{{\u{c}name}}", No),
    ("{{order-id}}", No),
    ("{{Name}}", No),
    // Sections, helpers, partials, decorators, delimiters, whitespace control.
    ("{{#name}}x{{/name}}", No),
    ("{{^name}}x{{/name}}", No),
    ("{{#if name}}x{{/if}}", No),
    ("{{#each name}}{{this}}{{/each}}", No),
    ("{{#with name}}{{.}}{{/with}}", No),
    ("{{else}}", No),
    ("{{ else }}", No),
    ("{{else if name}}", No),
    ("{{^}}", No),
    ("{{/name}}", No),
    ("{{lookup name 0}}", No),
    ("{{eq item \"x\"}}", No),
    ("{{order id}}", No),
    ("{{> footer}}", No),
    ("{{#> layout}}x{{/layout}}", No),
    ("{{*dec}}", No),
    ("{{=<% %>=}}", No),
    ("{{~name}}", No),
    ("{{name~}}", No),
    ("{{~name~}}", No),
    ("{{~! comment }}", No),
    ("{{~!-- comment --}}", No),
    ("{{!-- comment --~}}", No),
    ("{{ ! x }}", No),
    ("{{ !x }}", No),
    // Broken syntax, empty tags, empty parts.
    ("{{}}", No),
    ("{{ }}", No),
    ("{{name}", No),
    ("Hi {{name", No),
    ("{{!-- never closed", No),
    ("{{!--}}", No),
    ("{{!-- a -- }}", No),
    ("", No),
    ("   ", No),
    // Unescaped slots: only with the flaw, and then only around a variable.
    ("{{{name}}}", FlawOnly),
    ("{{{ name }}}", FlawOnly),
    ("{{&name}}", FlawOnly),
    ("{{& name}}", FlawOnly),
    ("{{ &name}}", FlawOnly),
    ("Hi {{{name}}}, {{&item}} {{total}}", FlawOnly),
    ("{{{name}}}}", FlawOnly),
    ("{{{\tname\n}}}", FlawOnly),
    ("{{&  name  }}", FlawOnly),
    ("{{{}}}", No),
    ("{{&}}", No),
    ("{{{{name}}}}", No),
    ("{{{name~}}}", No),
    ("{{&name~}}", No),
    ("{{{name}}", No),
    ("{{{nmae}}}", No),
    ("{{&nmae}}", No),
    ("{{{name.first}}}", No),
    ("{{{&name}}}", No),
    ("{{{! x}}}", No),
    ("{{{~name}}}", No),
    ("{{~{name}~}}", No),
    ("{{{{raw}}}} x {{{{/raw}}}}", No),
    ("{{{#if name}}}", No),
];

/// Where a row goes: `sms`, which the `sms` channel needs, and `html`, which no channel needs.
const PARTS: [&str; 2] = ["sms", "html"];
const CHANNELS: [Channel; 3] = [Channel::Line, Channel::Email, Channel::Sms];

fn scenario_toml(part: &str, src: &str, flaw: bool) -> String {
    let flaws = if flaw {
        "flaws = [\"unescaped-template\"]\n"
    } else {
        ""
    };
    let quoted = toml::Value::String(src.to_string()).to_string();
    format!(
        "name = \"t\"\nseed = 7\n\n[stack]\nworkers = 1\nlease = \"2s\"\nheartbeat = \"500ms\"\n\
         {flaws}\n[load]\nrecipients = 10\nchannels = [\"line\", \"email\", \"sms\"]\n\n\
         [load.template]\n{part} = {quoted}\n"
    )
}

/// The harness's verdict: `Ok`, or the message of a rejection placed at `[load.template]`'s
/// `part` key.
fn harness(part: &str, src: &str, flaw: bool) -> Result<(), String> {
    let text = scenario_toml(part, src, flaw);
    match scenario::parse(Path::new("case.toml"), &text) {
        Result::Ok(s) => {
            let got = match part {
                "sms" => &s.load.template.sms,
                _ => &s.load.template.html,
            };
            assert_eq!(got, src, "the scenario carries the template as written");
            Result::Ok(())
        }
        Err(e) => {
            // Placed at the part's key (`file:line:col`).
            let line = 1 + text
                .lines()
                .position(|l| l.starts_with(&format!("{part} = ")))
                .expect("the part's key");
            let at = (e.key.as_deref(), e.line, e.col);
            assert_eq!(
                at,
                (Some(part), line, 1),
                "{src:?} in `{part}` was rejected for something else: {e}"
            );
            assert!(e.message.starts_with(&format!("template `{part}`")), "{e}");
            Err(e.to_string())
        }
    }
}

/// The stack's verdict: compiled as `POST /v1/batches` compiles it, then rendered strictly for
/// each channel of generated recipients with the context the API builds (`vars`, `id`, `name`).
fn stack(part: &str, src: &str, flaw: bool) -> Result<(), String> {
    let d = RawTemplate::default();
    let mut t = TemplateIn {
        id: d.id,
        version: d.version as i32,
        subject: Some(d.subject),
        text: Some(d.text),
        html: Some(d.html),
        line: Some(d.line),
        sms: Some(d.sms),
    };
    match part {
        "sms" => t.sms = Some(src.to_string()),
        _ => t.html = Some(src.to_string()),
    }
    let shown = |e: RenderError| e.to_string();
    let r = Renderer::compile(&t, &CHANNELS, flaw).map_err(shown)?;
    for person in ting_chaos_harness::load::recipients::generate(7, 20, 0.5) {
        // The recipient as the harness posts it, read back as the API reads it.
        let Value::Object(posted) = serde_json::to_value(&person).unwrap() else {
            unreachable!("a recipient serializes to an object")
        };
        let Some(Value::Object(mut ctx)) = posted.get("vars").cloned() else {
            panic!("a posted recipient has `vars`: {posted:?}")
        };
        ctx.insert("id".into(), posted["id"].clone());
        ctx.insert("name".into(), posted["name"].clone());
        let ctx = Value::Object(ctx);
        for ch in CHANNELS {
            r.render(ch, &ctx, "recipients[0].vars").map_err(shown)?;
        }
    }
    Result::Ok(())
}

#[test]
fn harness_validation_and_the_stack_agree_on_every_template() {
    let mut disagree = Vec::new();
    let mut unexpected = Vec::new();
    for &(src, want) in ROWS {
        for flaw in [false, true] {
            for part in PARTS {
                let h = harness(part, src, flaw);
                let s = stack(part, src, flaw);
                if h.is_ok() != s.is_ok() {
                    disagree.push(format!(
                        "{src:?} in `{part}`, flaw {flaw}: harness {h:?}, stack {s:?}"
                    ));
                }
                let expected = match want {
                    Ok => true,
                    FlawOnly => flaw,
                    No => false,
                };
                if part == "sms" && s.is_ok() != expected {
                    unexpected.push(format!(
                        "{src:?}, flaw {flaw}: the table says {want:?}, the stack says {s:?}"
                    ));
                }
            }
        }
    }
    assert!(
        unexpected.is_empty(),
        "the table misdescribes the stack:\n{}",
        unexpected.join("\n")
    );
    assert!(
        disagree.is_empty(),
        "{} disagreement(s):\n{}",
        disagree.len(),
        disagree.join("\n")
    );
}

/// The table holds both verdicts in both modes, so agreement is not "both refuse everything".
#[test]
fn the_table_has_accepted_and_refused_rows_in_both_modes() {
    for flaw in [false, true] {
        let accepted = ROWS
            .iter()
            .filter(|(src, _)| stack("sms", src, flaw).is_ok())
            .count();
        assert!(accepted >= 10, "flaw {flaw}: {accepted} accepted");
        assert!(ROWS.len() - accepted >= 10, "flaw {flaw}: too few refused");
    }
}
