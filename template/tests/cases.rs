//! The one engine's language as a table: every template the former agreement test
//! (`tests/template_agreement.rs`), the stack's renderer tests and the harness's lexer tests
//! held, plus Handlebars' standalone-comment whitespace, one line per case:
//! `(template, without unescaped slots, with them)`, each `= rendered output` (validated against
//! the recipient variables, then rendered with HTML escaping, or none when unescaped slots are
//! allowed, as the stack's `unescaped-template` flaw does) or `! line:col kind argument`.
//! `SAME`: the second outcome is the first. Every accepted row's output is what the reference
//! stack's Handlebars renderer produced for the same template and values.
//! An empty template parses (to nothing): refusing an empty part is its caller's rule.

mod common;

use common::{short, Flat, KNOWN};
use ting_template::{parse, render, validate, Escape, Lookup, Options, Values};

const SAME: &str = "";

#[rustfmt::skip]
const CASES: &[(&str, &str, &str)] = &[
    ("plain text, no tags", "= plain text, no tags", SAME),
    ("Hi {{name}}", "= Hi Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;", "= Hi Zoë <b>&</b> 'Q'"),
    ("{{id}} {{name}} {{order_id}} {{item}} {{total}}", "= r1 Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27; A-1 Tea ¥500", "= r1 Zoë <b>&</b> 'Q' A-1 Tea ¥500"),
    ("{{name}}{{item}}", "= Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;Tea", "= Zoë <b>&</b> 'Q'Tea"),
    ("{{ name }}", "= Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;", "= Zoë <b>&</b> 'Q'"),
    ("{{\tname\n}}", "= Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;", "= Zoë <b>&</b> 'Q'"),
    ("{{! a comment }}", "= ", SAME),
    ("{{!}}", "= ", SAME),
    ("{{!-- a comment with }} inside --}}", "= ", SAME),
    ("{{!-- {{#each name}}{{@index}}{{/each}} --}}", "= ", SAME),
    ("{{! {{nmae}} }}", "=  }}", SAME),
    ("{{! trailing tilde ~}}", "= ", SAME),
    ("{{!-- x --}} --}}", "=  --}}", SAME),
    ("こんにちは {{name}} 🚀 Zoë, ご注文 {{order_id}}", "= こんにちは Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27; 🚀 Zoë, ご注文 A-1", "= こんにちは Zoë <b>&</b> 'Q' 🚀 Zoë, ご注文 A-1"),
    ("<p>Hi <b>{{name}}</b> &amp; <a href=\"x?a=1&b=2\">{{item}}</a></p>", "= <p>Hi <b>Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;</b> &amp; <a href=\"x?a=1&b=2\">Tea</a></p>", "= <p>Hi <b>Zoë <b>&</b> 'Q'</b> &amp; <a href=\"x?a=1&b=2\">Tea</a></p>"),
    ("a { b } c }} d {", "= a { b } c }} d {", SAME),
    ("{{name}}}", "= Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;}", "= Zoë <b>&</b> 'Q'}"),
    ("{{name}}}}", "= Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;}}", "= Zoë <b>&</b> 'Q'}}"),
    ("\\ {{name}} back\\slash", "= \\ Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27; back\\slash", "= \\ Zoë <b>&</b> 'Q' back\\slash"),
    ("{ {name} }", "= { {name} }", SAME),
    ("{{!-- --}}", "= ", SAME),
    ("{{!----}}", "= ", SAME),
    ("{{!--x}}--}}{{name}}", "= Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;", "= Zoë <b>&</b> 'Q'"),
    ("{{!-}}", "= ", SAME),
    ("{{!\n multi\n line }}", "= ", SAME),
    ("{{! a }}}", "= }", SAME),
    ("{{@index}}", "! 1:1 data-variable @index", SAME),
    ("{{@root.name}}", "! 1:1 data-variable @root.name", SAME),
    ("{{this}}", "! 1:1 context-path this", SAME),
    ("{{this.name}}", "! 1:1 context-path this.name", SAME),
    ("{{./name}}", "! 1:1 context-path ./name", SAME),
    ("{{.}}", "! 1:1 context-path .", SAME),
    ("{{42}}", "! 1:1 literal 42", SAME),
    ("{{-1}}", "! 1:1 literal -1", SAME),
    ("{{true}}", "! 1:1 literal true", SAME),
    ("{{null}}", "! 1:1 literal null", SAME),
    ("{{\"x\"}}", "! 1:1 literal \"x\"", SAME),
    ("{{'x'}}", "! 1:1 literal 'x'", SAME),
    ("{{../name}}", "! 1:1 context-path ../name", SAME),
    ("\\{{name}}", "! 1:1 escaped-mustache", SAME),
    ("\\\\{{name}}", "! 1:2 escaped-mustache", SAME),
    ("Hi {{name}} \\{{item}}", "! 1:13 escaped-mustache", SAME),
    ("{{name.first}}", "! 1:1 path-into-text name.first", SAME),
    ("{{order_id.x}}", "! 1:1 path-into-text order_id.x", SAME),
    ("{{name/first}}", "! 1:1 path-into-text name/first", SAME),
    ("{{[name]}}", "! 1:1 literal [name]", SAME),
    ("{{name.}}", "! 1:1 path-into-text name.", SAME),
    ("{{!-- a --}}\\{{name}}", "! 1:13 escaped-mustache", SAME),
    ("{{! a }}\\{{name}}", "! 1:9 escaped-mustache", SAME),
    ("{{nmae}}", "! 1:1 unknown-variable nmae", SAME),
    ("{{user}}", "! 1:1 unknown-variable user", SAME),
    ("{{if}}", "! 1:1 unknown-variable if", SAME),
    ("{{len}}", "! 1:1 unknown-variable len", SAME),
    ("{{名前}}", "! 1:1 unknown-variable 名前", SAME),
    ("{{name\u{a0}}}", "! 1:1 unknown-variable name\u{a0}", SAME),
    ("{{\u{a0}name}}", "! 1:1 unknown-variable \u{a0}name", SAME),
    ("{{\u{c}name}}", "! 1:1 unknown-variable \u{c}name", SAME),
    ("{{order-id}}", "! 1:1 unknown-variable order-id", SAME),
    ("{{Name}}", "! 1:1 unknown-variable Name", SAME),
    ("{{#name}}x{{/name}}", "! 1:1 unsupported Section", SAME),
    ("{{^name}}x{{/name}}", "! 1:1 unsupported Section", SAME),
    ("{{#if name}}x{{/if}}", "! 1:1 unsupported BlockHelper", SAME),
    ("{{#each name}}{{this}}{{/each}}", "! 1:1 unsupported BlockHelper", SAME),
    ("{{#with name}}{{.}}{{/with}}", "! 1:1 unsupported BlockHelper", SAME),
    ("{{else}}", "! 1:1 unsupported Else", SAME),
    ("{{ else }}", "! 1:1 unsupported Else", SAME),
    ("{{else if name}}", "! 1:1 unsupported HelperCall", SAME),
    ("{{^}}", "! 1:1 unsupported Section", SAME),
    ("{{/name}}", "! 1:1 unsupported Section", SAME),
    ("{{lookup name 0}}", "! 1:1 unsupported HelperCall", SAME),
    ("{{eq item \"x\"}}", "! 1:1 unsupported HelperCall", SAME),
    ("{{order id}}", "! 1:1 unsupported HelperCall", SAME),
    ("{{> footer}}", "! 1:1 unsupported Partial", SAME),
    ("{{#> layout}}x{{/layout}}", "! 1:1 unsupported BlockHelper", SAME),
    ("{{*dec}}", "! 1:1 unsupported Decorator", SAME),
    ("{{=<% %>=}}", "! 1:1 unsupported DelimiterChange", SAME),
    ("{{~name}}", "! 1:1 unsupported WhitespaceControl", SAME),
    ("{{name~}}", "! 1:1 unsupported WhitespaceControl", SAME),
    ("{{~name~}}", "! 1:1 unsupported WhitespaceControl", SAME),
    ("{{~! comment }}", "! 1:1 unsupported WhitespaceControl", SAME),
    ("{{~!-- comment --}}", "! 1:1 unsupported WhitespaceControl", SAME),
    ("{{!-- comment --~}}", "! 1:1 unclosed-comment", SAME),
    ("{{ ! x }}", "! 1:1 unsupported HelperCall", SAME),
    ("{{ !x }}", "! 1:1 unknown-variable !x", SAME),
    ("{{}}", "! 1:1 empty", SAME),
    ("{{ }}", "! 1:1 empty", SAME),
    ("{{name}", "! 1:1 unclosed-tag", SAME),
    ("Hi {{name", "! 1:4 unclosed-tag", SAME),
    ("{{!-- never closed", "! 1:1 unclosed-comment", SAME),
    ("{{!--}}", "! 1:1 unclosed-comment", SAME),
    ("{{!-- a -- }}", "! 1:1 unclosed-comment", SAME),
    ("", "= ", SAME),
    ("   ", "=    ", SAME),
    ("{{{name}}}", "! 1:1 unescaped name", "= Zoë <b>&</b> 'Q'"),
    ("{{{ name }}}", "! 1:1 unescaped name", "= Zoë <b>&</b> 'Q'"),
    ("{{&name}}", "! 1:1 unescaped name", "= Zoë <b>&</b> 'Q'"),
    ("{{& name}}", "! 1:1 unescaped name", "= Zoë <b>&</b> 'Q'"),
    ("{{ &name}}", "! 1:1 unescaped name", "= Zoë <b>&</b> 'Q'"),
    ("Hi {{{name}}}, {{&item}} {{total}}", "! 1:4 unescaped name", "= Hi Zoë <b>&</b> 'Q', Tea ¥500"),
    ("{{{name}}}}", "! 1:1 unescaped name", "= Zoë <b>&</b> 'Q'}"),
    ("{{{\tname\n}}}", "! 1:1 unescaped name", "= Zoë <b>&</b> 'Q'"),
    ("{{&  name  }}", "! 1:1 unescaped name", "= Zoë <b>&</b> 'Q'"),
    ("{{{}}}", "! 1:1 unescaped ", "! 1:1 empty"),
    ("{{&}}", "! 1:1 unescaped ", "! 1:1 empty"),
    ("{{{{name}}}}", "! 1:1 unescaped {name", "! 1:1 unknown-variable {name"),
    ("{{{name~}}}", "! 1:1 unescaped name~", "! 1:1 unsupported WhitespaceControl"),
    ("{{&name~}}", "! 1:1 unsupported WhitespaceControl", SAME),
    ("{{{name}}", "! 1:1 unclosed-triple", SAME),
    ("{{{nmae}}}", "! 1:1 unescaped nmae", "! 1:1 unknown-variable nmae"),
    ("{{&nmae}}", "! 1:1 unescaped nmae", "! 1:1 unknown-variable nmae"),
    ("{{{name.first}}}", "! 1:1 unescaped name.first", "! 1:1 path-into-text name.first"),
    ("{{{&name}}}", "! 1:1 unescaped name", "! 1:1 unescaped-combined name"),
    ("{{{! x}}}", "! 1:1 unescaped ! x", "! 1:1 unsupported HelperCall"),
    ("{{{~name}}}", "! 1:1 unescaped ~name", "! 1:1 unsupported WhitespaceControl"),
    ("{{~{name}~}}", "! 1:1 unsupported WhitespaceControl", SAME),
    ("{{{{raw}}}} x {{{{/raw}}}}", "! 1:1 unescaped {raw", "! 1:1 unknown-variable {raw"),
    ("{{{#if name}}}", "! 1:1 unescaped #if name", "! 1:1 unsupported BlockHelper"),
    ("Hi {{{name}}}", "! 1:4 unescaped name", "= Hi Zoë <b>&</b> 'Q'"),
    ("Hi {{&name}}", "! 1:4 unescaped name", "= Hi Zoë <b>&</b> 'Q'"),
    ("Hi {{~{name}~}}", "! 1:4 unsupported WhitespaceControl", SAME),
    ("Hi {{#if}}", "! 1:4 unsupported Section", SAME),
    ("{{#each items}}{{name}}{{/each}}", "! 1:1 unsupported BlockHelper", SAME),
    ("{{#unless name}}no{{/unless}}", "! 1:1 unsupported BlockHelper", SAME),
    ("{{#with vars}}{{a}}{{/with}}", "! 1:1 unsupported BlockHelper", SAME),
    ("{{log name}}", "! 1:1 unsupported HelperCall", SAME),
    ("{{len name}}", "! 1:1 unsupported HelperCall", SAME),
    ("{{upper name}}", "! 1:1 unsupported HelperCall", SAME),
    ("{{#*inline \"p\"}}x{{/inline}}", "! 1:1 unsupported Decorator", SAME),
    ("{{vars.[a b]}}", "! 1:1 unsupported HelperCall", SAME),
    ("{{! a comment }}Hi {{ name }}, {{order_id}} {{!-- {{#each}} --}}{{item}}", "= Hi Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;, A-1 Tea", "= Hi Zoë <b>&</b> 'Q', A-1 Tea"),
    ("{{len}} {{if}}", "! 1:1 unknown-variable len", SAME),
    ("{{ordr_id}}", "! 1:1 unknown-variable ordr_id", SAME),
    ("Order {{ordr_id}} {{#broken", "! 1:7 unknown-variable ordr_id", SAME),
    ("Order {{order_id}} {{#broken", "! 1:20 unclosed-tag", SAME),
    ("{{#item}}x", "! 1:1 unsupported Section", SAME),
    ("{{#item}}x{{/name}}", "! 1:1 unsupported Section", SAME),
    ("x{{/item}}", "! 1:2 unsupported Section", SAME),
    ("{{#if nmae}}{{/if}}", "! 1:1 unsupported BlockHelper", SAME),
    ("{{user.email}}", "! 1:1 unknown-variable user", SAME),
    ("{{!-- open", "! 1:1 unclosed-comment", SAME),
    ("{{nmae.first}}", "! 1:1 unknown-variable nmae", SAME),
    ("Hi \\{{name}}", "! 1:4 escaped-mustache", SAME),
    ("{{!-- x --~}}", "! 1:1 unclosed-comment", SAME),
    ("{{! x ~}}{{!----}}{{!-- }} {{@index}} --}}{{! {{this}} }}}", "=  }}}", SAME),
    ("{{{ name }}} {{&  item }}", "! 1:1 unescaped name", "= Zoë <b>&</b> 'Q' Tea"),
    ("{{{this}}}", "! 1:1 unescaped this", "! 1:1 context-path this"),
    ("{{&name.first}}", "! 1:1 unescaped name.first", "! 1:1 path-into-text name.first"),
    ("Hi {{name}} {{ order_id }} {{! note }}{{!-- x --}}", "= Hi Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27; A-1 ", "= Hi Zoë <b>&</b> 'Q' A-1 "),
    ("{{item}} {{ order_id }} {{! note }}", "= Tea A-1 ", SAME),
    ("{{!-- {{#each}} --}}<p>{{ name }} 🚀</p>", "= <p>Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27; 🚀</p>", "= <p>Zoë <b>&</b> 'Q' 🚀</p>"),
    ("Order {{order_id}}", "= Order A-1", SAME),
    ("{{! c }}\nHi", "= Hi", SAME),
    ("  {{! c }}  \nHi", "= Hi", SAME),
    ("a\n  {{! c }}  \nb", "= a\nb", SAME),
    ("a\n{{! c }}\r\nb", "= a\nb", SAME),
    ("a {{! c }}\nb", "= a \nb", SAME),
    ("a\n{{! c }}", "= a\n", SAME),
    ("a\n  {{! c }}  ", "= a\n    ", SAME),
    ("{{!-- c --}}\n{{name}}", "= Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;", "= Zoë <b>&</b> 'Q'"),
    ("{{name}}\n  {{! c }}\n  x", "= Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;\n  x", "= Zoë <b>&</b> 'Q'\n  x"),
    ("\n{{!a}}{{!b}}\n", "= \n\n", SAME),
    ("a\n\t{{!c}}\t\n\tb", "= a\n\tb", SAME),
    ("{{!a}}\n{{!b}}\nc", "= c", SAME),
    ("x\n{{!a}} \n", "= x\n", SAME),
    ("x\n {{!a}}\n\n", "= x\n\n", SAME),
    ("x\r\n{{!a}}\r\ny", "= x\r\ny", SAME),
    ("x\n{{!a}}\ry", "= x\n\ry", SAME),
    ("{{! a }}b", "= b", SAME),
    ("x  {{! c }}\n\ny", "= x  \n\ny", SAME),
    ("line one\n{{name}}\n  {{item}}  \nend", "= line one\nZoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;\n  Tea  \nend", "= line one\nZoë <b>&</b> 'Q'\n  Tea  \nend"),
    ("{{!-- multi\nline --}}\n  {{name}}\n", "=   Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;\n", "=   Zoë <b>&</b> 'Q'\n"),
    ("Hi\n{{! a }}\n{{! b }}\nthere", "= Hi\nthere", SAME),
    ("{{name}}{{! x }}\n", "= Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;\n", "= Zoë <b>&</b> 'Q'\n"),
    ("\t{{! x }}\n{{name}}", "= Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;", "= Zoë <b>&</b> 'Q'"),
    ("Order {{order_id}} received", "= Order A-1 received", SAME),
    ("Hi {{name}}, we received order {{order_id}} ({{item}}). Total {{total}}.", "= Hi Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;, we received order A-1 (Tea). Total ¥500.", "= Hi Zoë <b>&</b> 'Q', we received order A-1 (Tea). Total ¥500."),
    ("<p>Hi {{name}},</p><p>We received order <b>{{order_id}}</b> ({{item}}). Total {{total}}.</p>", "= <p>Hi Zoë &lt;b&gt;&amp;&lt;/b&gt; &#x27;Q&#x27;,</p><p>We received order <b>A-1</b> (Tea). Total ¥500.</p>", "= <p>Hi Zoë <b>&</b> 'Q',</p><p>We received order <b>A-1</b> (Tea). Total ¥500.</p>"),
    // Positions are line:col of the tag (or backslash), the column in characters.
    ("Hi\n  {{#if name}}x{{/if}}", "! 2:3 unsupported BlockHelper", SAME),
    ("Zoë 🚀 {{nmae}}", "! 1:7 unknown-variable nmae", SAME),
    ("a\r\nb {{name", "! 2:3 unclosed-tag", SAME),
    ("{{name}}\n\n\\{{x}}", "! 3:1 escaped-mustache", SAME),
];

fn outcome(src: &str, allow: bool) -> String {
    let opts = Options {
        allow_unescaped: allow,
    };
    let escape = if allow { Escape::None } else { Escape::Html };
    match validate(src, KNOWN, opts) {
        Ok(t) => format!(
            "= {}",
            render(&t, &Flat::recipient(), escape).expect("validated")
        ),
        Err(e) => format!("! {} {}", e.at, short(&e.kind)),
    }
}

#[test]
fn every_case() {
    let mut wrong = Vec::new();
    for &(src, plain, unescaped) in CASES {
        let unescaped = if unescaped == SAME { plain } else { unescaped };
        for (allow, want) in [(false, plain), (true, unescaped)] {
            let got = outcome(src, allow);
            if got != want {
                wrong.push(format!(
                    "{src:?} (unescaped {allow}): want {want:?}, got {got:?}"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// What `validate` accepts, `parse` + `render` (the stack's path, which learns the variables
/// only from each recipient) renders identically; what `validate` refuses for syntax, `parse`
/// refuses at the same place, and what it refuses for names, rendering does not find.
#[test]
fn validate_agrees_with_parse_then_render() {
    for &(src, ..) in CASES {
        for allow in [false, true] {
            let opts = Options {
                allow_unescaped: allow,
            };
            let rendered = parse(src, opts).map(|t| render(&t, &Flat::recipient(), Escape::Html));
            match validate(src, KNOWN, opts) {
                Ok(t) => {
                    let want = render(&t, &Flat::recipient(), Escape::Html).unwrap();
                    assert_eq!(rendered, Ok(Ok(want)), "{src:?}");
                }
                Err(e) => match rendered {
                    Ok(Ok(out)) => panic!("{src:?}: validate says {e}, rendering gave {out:?}"),
                    Ok(Err(_)) => {}
                    Err(p) if p.at >= e.at => {}
                    Err(p) => panic!("{src:?}: validate says {e}, parse {p} earlier"),
                },
            }
        }
    }
}

/// The table holds both verdicts in both modes, so it does not pass by refusing everything.
#[test]
fn the_table_has_accepted_and_refused_rows_in_both_modes() {
    for allow in [false, true] {
        let accepted = CASES
            .iter()
            .filter(|(src, ..)| outcome(src, allow).starts_with('='))
            .count();
        assert!(accepted >= 40, "unescaped {allow}: {accepted} accepted");
        assert!(
            CASES.len() - accepted >= 40,
            "unescaped {allow}: too few refused"
        );
    }
}

/// Values that are not plain text: the stack looks paths up in JSON, so `parse` keeps dotted
/// paths and reports what a lookup says.
struct Nested;

impl Values for Nested {
    fn lookup(&self, path: &[String]) -> Lookup {
        match path.join(".").as_str() {
            "vars.city" => Lookup::Found("Q&A".into()),
            "list.x" => Lookup::Invalid("cannot index a list with `x`".into()),
            _ => Lookup::Missing,
        }
    }
}

#[test]
fn paths_render_through_the_callers_lookup() {
    let t = parse(
        "{{vars.city}} {{{vars.city}}}",
        Options {
            allow_unescaped: true,
        },
    )
    .unwrap();
    assert_eq!(render(&t, &Nested, Escape::Html).unwrap(), "Q&amp;A Q&A");
    assert_eq!(render(&t, &Nested, Escape::None).unwrap(), "Q&A Q&A");
    let t = parse("a {{list.x}}", Options::default()).unwrap();
    let e = render(&t, &Nested, Escape::Html).unwrap_err();
    assert_eq!((e.path.as_str(), e.invalid.is_some()), ("list.x", true));
    let t = parse("a {{nope}}", Options::default()).unwrap();
    assert_eq!(
        render(&t, &Nested, Escape::Html).unwrap_err().to_string(),
        "`{{nope}}` finds no value"
    );
    // Without a list of variables, a name that is no path is refused as such.
    let e = parse("x {{名前}}", Options::default()).unwrap_err();
    assert_eq!(
        (e.at.to_string(), short(&e.kind)),
        ("1:3".into(), "not-a-name 名前".into())
    );
    assert!(
        e.to_string()
            .starts_with("1:3: `{{名前}}`: `名前` is not a variable name"),
        "{e}"
    );
}

/// Escaping is Handlebars' `html_escape`, byte for byte.
#[test]
fn escaping_is_handlebars_html_escape() {
    assert_eq!(
        ting_template::escape_html("<>\"&'`= /\\ 山 \r\n\0"),
        "&lt;&gt;&quot;&amp;&#x27;&#x60;&#x3D; /\\ 山 \r\n\0"
    );
}
