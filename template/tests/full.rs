//! Full Mustache (an external stack's engine), one line per case: `(template, None)` accepted,
//! `(template, Some("line:col kind"))` refused. Unescaped slots are allowed here, as the harness
//! allows them for an external stack, except in the rows of `refused_unescaped`.

mod common;

use common::{short, KNOWN};
use ting_template::{full, Options};

const ALLOW: Options = Options {
    allow_unescaped: true,
};

#[rustfmt::skip]
const CASES: &[(&str, Option<&str>)] = &[
    ("", None),
    ("plain text, no tags", None),
    ("Hi {{name}}, order {{ order_id }} ({{item}}) {{total}} for {{id}}", None),
    ("{{~name~}}", None),
    ("{{! a comment }}{{!-- a comment with }} inside --}}", None),
    ("{{#order_id}}has {{order_id}}{{/order_id}}{{^item}}no item{{/item}}", None),
    ("{{#if name}}Hi {{name}}{{else}}Hi{{/if}}", None),
    ("{{#unless item}}-{{^}}{{item}}{{/unless}}", None),
    ("{{#each name}}{{this}} {{@index}} {{anything}}{{/each}}", None),
    ("{{lookup name 0}} {{eq item \"x\"}}", None),
    ("{{this.name}}", None),
    ("{{{name}}} {{&item}} {{~{total}~}}", None),
    ("{{#if item}}{{item}}{{else}}order{{/if}} {{! note }}", None),
    ("Order {{ordr_id}}", Some("1:7 unknown-variable ordr_id")),
    ("Order {{order_id}} {{#broken", Some("1:20 unclosed-tag")),
    ("{{#item}}x", Some("1:1 UnclosedSection { name: \"item\" }")),
    ("{{#item}}x{{/name}}", Some("1:11 MismatchedClose { open: \"{{#item}}\", name: \"item\" }")),
    ("x{{/item}}", Some("1:2 StrayClose")),
    ("{{}}", Some("1:1 empty")),
    ("{{#if}}", Some("1:1 HelperNeedsVariable(\"if\")")),
    ("{{#if nmae}}{{/if}}", Some("1:1 unknown-variable nmae")),
    ("{{order id}}", Some("1:1 NotAHelper(\"order\")")),
    ("{{> footer}}", Some("1:1 unsupported Partial")),
    ("{{=<% %>=}}", Some("1:1 unsupported DelimiterChange")),
    ("{{{name}}", Some("1:1 unclosed-triple")),
    ("{{else}}", Some("1:1 OutsideSection")),
    ("{{!-- open", Some("1:1 unclosed-comment")),
    ("{{user.email}}", Some("1:1 unknown-variable user")),
    ("Hi\n{{#item}}\n{{/item}}\n{{#if x}}", Some("4:1 unknown-variable x")),
    ("{{! {{#item}} }}\n{{#item}}x", Some("2:1 UnclosedSection { name: \"item\" }")),
];

#[test]
fn every_case() {
    for &(src, want) in CASES {
        let got = full::validate(src, KNOWN, ALLOW)
            .err()
            .map(|e| format!("{} {}", e.at, short(&e.kind)));
        assert_eq!(got.as_deref(), want, "{src:?}");
    }
}

#[test]
fn refused_unescaped() {
    for src in ["{{{name}}}", "{{&name}}"] {
        let e = full::validate(src, KNOWN, Options::default()).unwrap_err();
        assert_eq!(short(&e.kind), "unescaped name", "{src}");
    }
}
