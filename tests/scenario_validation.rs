//! The scenario language at its boundary: good files load, and every bad file is rejected with
//! the exact key, line and column (and the nearest valid key for typos).

use std::path::Path;

use ting_chaos::scenario::{self, Target, Trigger};

const BASE: &str = r#"name = "t"
seed = 7

[stack]
workers = 4
lease = "2s"
heartbeat = "500ms"

[load]
recipients = 100
channels = ["line", "sms"]

[[chaos]]
progress = "40%"
action = "sigkill"
target = 2
"#;

/// Replaces the first occurrence of `from` in BASE with `to`.
fn with(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "fixture does not contain {from:?}");
    BASE.replacen(from, to, 1)
}

fn parse(text: &str) -> Result<scenario::Scenario, scenario::ScenarioError> {
    scenario::parse(Path::new("case.toml"), text)
}

#[test]
fn base_fixture_is_valid() {
    let s = parse(BASE).expect("valid");
    assert_eq!(s.stack.workers, 4);
    assert!(matches!(s.chaos[0].trigger, Trigger::Progress(p) if (p - 0.4).abs() < 1e-9));
    assert_eq!(s.chaos[0].target, Target::Worker(2));
}

/// (what is changed, into what, expected key, line, col, message fragment, suggestion)
type Case = (
    &'static str,
    &'static str,
    &'static str,
    usize,
    usize,
    &'static str,
    Option<&'static str>,
);

#[test]
fn bad_scenarios_name_key_line_and_column() {
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("workers = 4", "worker = 4", "worker", 5, 1, "unknown key `worker` in [stack]", Some("workers")),
        ("seed = 7", "sed = 7", "sed", 2, 1, "unknown key `sed` at the top level", Some("seed")),
        ("recipients = 100", "recipient = 100", "recipient", 10, 1, "in [load]", Some("recipients")),
        ("workers = 4", "workers = 0", "workers", 5, 1, "between 1 and 64", None),
        ("lease = \"2s\"", "lease = \"-2s\"", "lease", 6, 9, "negative", None),
        ("lease = \"2s\"", "lease = \"2 parsecs\"", "lease", 6, 9, "invalid duration", None),
        ("heartbeat = \"500ms\"", "heartbeat = \"5s\"", "heartbeat", 7, 1, "shorter than `lease`", None),
        ("progress = \"40%\"", "progress = \"140%\"", "progress", 14, 12, "out of range", None),
        ("progress = \"40%\"", "progress = 1.5", "progress", 14, 12, "out of range", None),
        ("channels = [\"line\", \"sms\"]", "channels = [\"line\", \"fax\"]", "channels", 11, 21, "unknown value `fax`", None),
        ("channels = [\"line\", \"sms\"]", "channels = []", "channels", 11, 12, "at least one", None),
        ("action = \"sigkill\"", "action = \"sigkil\"", "action", 15, 10, "unknown value `sigkil`", Some("sigkill")),
        ("target = 2", "target = 9", "target", 13, 1, "does not exist", None),
        ("target = 2", "target = \"busyest\"", "target", 13, 1, "unknown `target`", Some("busiest")),
        ("progress = \"40%\"", "at = \"1s\"\nprogress = \"40%\"", "at", 13, 1, "exactly one trigger", None),
        ("action = \"sigkill\"", "action = \"sigstop\"", "for", 13, 1, "needs `for`", None),
        ("[load]\n", "[load]\nbatches = 0\n", "batches", 10, 1, "`batches` must be between", None),
        ("[load]\n", "[load]\nrate = 2.0\n", "rate", 10, 1, "needs a `duration`", None),
        ("[stack]\n", "[stack]\nflaws = [\"racy-clam\"]\n", "flaws", 5, 1, "unknown flaw", Some("racy-claim")),
        ("[stack]\n", "[stack.external]\napi = [\"a\"]\nworkr = [\"w\"]\n[stack]\n", "workr", 6, 1, "unknown key `workr` in [stack.external]", Some("worker")),
        ("recipients = 100", "recipients = \"lots\"", "recipients", 10, 14, "bad value for `recipients` in [load]", None),
    ];
    for (from, to, key, line, col, fragment, suggestion) in cases {
        let text = with(from, to);
        let err = match parse(&text) {
            Ok(_) => panic!("case {to:?} was accepted"),
            Err(e) => e,
        };
        let shown = err.to_string();
        assert_eq!(err.key.as_deref(), Some(*key), "case {to:?}: {shown}");
        assert_eq!((err.line, err.col), (*line, *col), "case {to:?}: {shown}");
        assert!(
            shown.contains(fragment),
            "case {to:?}: {shown:?} lacks {fragment:?}"
        );
        assert!(
            shown.contains(&format!("case.toml:{line}:{col}")),
            "{shown}"
        );
        assert_eq!(
            err.suggestion.as_deref(),
            *suggestion,
            "case {to:?}: {shown}"
        );
    }
}

#[test]
fn issue_example_message_is_exact() {
    let err = parse(&with("workers = 4", "worker = 4")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown key `worker` in [stack] at case.toml:5:1 — did you mean `workers`?"
    );
}

#[test]
fn shipped_scenarios_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 1, "no scenarios found in {}", dir.display());
}

#[test]
fn committed_schema_is_in_sync_with_the_types() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/scenario.schema.json");
    let want = serde_json::to_string_pretty(&scenario::json_schema()).unwrap() + "\n";
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if std::env::var_os("UPDATE_SCHEMAS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    assert!(
        have == want,
        "{} is out of date: run `UPDATE_SCHEMAS=1 cargo test --test scenario_validation` and commit it",
        path.display()
    );
}
