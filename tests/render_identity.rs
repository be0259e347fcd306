//! The reference stack renders the same bytes for every shipped scenario's templates and the
//! load generator's hostile recipients as it did when it rendered with Handlebars: the fixtures in
//! `tests/fixtures/render/` were written by the Handlebars renderer before `ting-template`
//! replaced it. `immutable_payload` and `headers` compare what the fakes received with what the
//! stack's renderer makes, so a changed byte there is a changed verdict.
//!
//! `TING_BLESS=1 cargo test --test render_identity` rewrites the fixtures: only do that for a
//! change to the output that is meant, and say why in the commit.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;
use stack::channels::Channel;
use stack::render::{sha256_hex, Renderer, TemplateIn};
use ting_chaos_harness::load::recipients::{self, Recipient};
use ting_chaos_harness::scenario::{self, RawTemplate};

const CHANNELS: [Channel; 3] = [Channel::Line, Channel::Email, Channel::Sms];

/// How the stack is switched: flaw-free, the `subject-header-injection` flaw (raw subject), and
/// the `unescaped-template` flaw (no escaping).
const MODES: [(&str, bool, bool); 3] = [
    ("plain", false, false),
    ("raw-subject", false, true),
    ("unescaped", true, false),
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/render")
}

fn template_in(t: &RawTemplate) -> TemplateIn {
    TemplateIn {
        id: t.id.clone(),
        version: t.version as i32,
        subject: Some(t.subject.clone()),
        text: Some(t.text.clone()),
        html: Some(t.html.clone()),
        line: Some(t.line.clone()),
        sms: Some(t.sms.clone()),
    }
}

/// The context `POST /v1/batches` builds: the posted `vars`, then `id` and `name`.
fn context(person: &Recipient) -> Value {
    let Value::Object(posted) = serde_json::to_value(person).unwrap() else {
        unreachable!("a recipient serializes to an object")
    };
    let Some(Value::Object(mut ctx)) = posted.get("vars").cloned() else {
        panic!("a posted recipient has `vars`: {posted:?}")
    };
    ctx.insert("id".into(), posted["id"].clone());
    ctx.insert("name".into(), posted["name"].clone());
    Value::Object(ctx)
}

/// Every payload of one scenario's template in one mode, one JSON line per (recipient, channel):
/// the scenario's own recipients and 60 with every hostile datum likely.
fn payloads(t: &RawTemplate, people: &[Recipient], unescaped: bool, raw: bool) -> String {
    let r = Renderer::compile(&template_in(t), &CHANNELS, unescaped)
        .expect("a shipped template compiles")
        .with_raw_subject(raw);
    let mut out = String::new();
    for person in people {
        for ch in CHANNELS {
            let p = r
                .render(ch, &context(person), "recipients[0].vars")
                .expect("a generated recipient renders");
            writeln!(out, "{}", serde_json::to_string(&p).unwrap()).unwrap();
        }
    }
    out
}

#[test]
fn shipped_templates_render_the_bytes_handlebars_rendered() {
    let bless = std::env::var_os("TING_BLESS").is_some();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    let mut digests = String::new();
    for path in &files {
        let s = scenario::parse(path, &std::fs::read_to_string(path).unwrap()).unwrap();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let mut people = recipients::generate(s.seed, 60, s.load.tricky_names);
        people.extend(recipients::generate(s.seed ^ 1, 60, 1.0));
        for (mode, unescaped, raw) in MODES {
            let all = payloads(&s.load.template, &people, unescaped, raw);
            writeln!(digests, "{name} {mode} {}", sha256_hex(all.as_bytes())).unwrap();
            if name == "template-injection" {
                // The hostile scenario in full, so a difference shows as a readable diff.
                let file = fixtures().join(format!("template-injection.{mode}.jsonl"));
                if bless {
                    std::fs::write(&file, &all).unwrap();
                }
                let want = std::fs::read_to_string(&file).unwrap();
                for (i, (got, want)) in all.lines().zip(want.lines()).enumerate() {
                    assert_eq!(got, want, "{mode} line {}", i + 1);
                }
                assert_eq!(all.lines().count(), want.lines().count(), "{mode}");
            }
        }
    }
    let file = fixtures().join("digests.txt");
    if bless {
        std::fs::create_dir_all(fixtures()).unwrap();
        std::fs::write(&file, &digests).unwrap();
    }
    // The digests were written by the Handlebars renderer before it was removed: every scenario
    // it rendered must still render to the same bytes. Scenarios added since have no Handlebars
    // record to compare with (the engine's own table tests cover them).
    let recorded = std::fs::read_to_string(&file).unwrap();
    let known: std::collections::BTreeSet<&str> = recorded
        .lines()
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert!(
        known.len() >= 13,
        "the Handlebars record lost scenarios: {known:?}"
    );
    let comparable: String = digests
        .lines()
        .filter(|l| known.contains(l.split(' ').next().unwrap_or_default()))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(comparable, recorded);
}
