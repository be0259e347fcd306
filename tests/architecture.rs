//! The crate boundaries ARCHITECTURE.md promises, checked on the source: the harness library never
//! imports the reference stack, the stack never imports the harness or the fake providers, and the
//! fake providers import neither.

use std::path::Path;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Files under `dir` (except `skip`) that mention any of `forbidden` as a path root.
fn offenders(dir: &str, skip: &[&str], forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join(dir), &mut files);
    let mut bad = Vec::new();
    for f in files {
        let rel = f.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        if skip.contains(&rel.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for name in forbidden {
                if code.contains(&format!("{name}::")) && !code.contains(&format!("_{name}::")) {
                    bad.push(format!("{rel}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    bad
}

#[test]
fn harness_library_never_imports_the_stack() {
    // main.rs is the one place both meet (it serves `ting-chaos stack …`).
    let bad = offenders("src", &["src/main.rs"], &["stack"]);
    assert!(
        bad.is_empty(),
        "the harness imports the stack:\n{}",
        bad.join("\n")
    );
}

#[test]
fn stack_never_imports_the_harness_or_the_fakes() {
    let bad = offenders("stack/src", &[], &["ting_chaos", "mock_providers"]);
    assert!(
        bad.is_empty(),
        "the stack imports the harness or the fakes:\n{}",
        bad.join("\n")
    );
}

#[test]
fn fakes_import_neither() {
    let bad = offenders("mock-providers/src", &[], &["ting_chaos", "stack"]);
    assert!(
        bad.is_empty(),
        "mock-providers imports the harness or the stack:\n{}",
        bad.join("\n")
    );
}

/// `[stack].flaws` is validated against the harness's list, and the stack switches on its own:
/// the two lists, the flaws documented in docs/flaws.md and the flaws tests/flaws.rs proves
/// caught are one set, so a new flaw cannot be refused by `validate` or go unproven.
#[test]
fn every_flaw_is_known_documented_and_proven_caught() {
    let stack: std::collections::BTreeSet<&str> =
        stack::config::Flaw::ALL.iter().map(|(n, _)| *n).collect();
    let harness: std::collections::BTreeSet<&str> =
        ting_chaos::scenario::KNOWN_FLAWS.iter().copied().collect();
    assert_eq!(
        harness, stack,
        "KNOWN_FLAWS and stack::config::Flaw::ALL differ"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = std::fs::read_to_string(root.join("docs/flaws.md")).unwrap();
    let tests = std::fs::read_to_string(root.join("tests/flaws.rs")).unwrap();
    for flaw in stack {
        assert!(
            docs.contains(&format!("`{flaw}`")),
            "docs/flaws.md does not document `{flaw}`"
        );
        assert!(
            tests.contains(&format!("\"{flaw}\"")),
            "tests/flaws.rs never runs `{flaw}`"
        );
    }
}
