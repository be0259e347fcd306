//! The crate boundaries ARCHITECTURE.md promises, checked on the dependency graph Cargo resolved
//! (`cargo metadata`), not on the source text: the harness library never depends on the reference
//! stack, the stack never depends on the harness or the fake providers, and the fake providers
//! depend on neither. Only the thin `ting-chaos` binary package links the harness and the stack.
//! The one template engine (`ting-template`), which both the harness and the stack use, depends
//! on none of them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The workspace's dependency graph as Cargo reads it (`cargo metadata --no-deps`): member
/// package name → the names it depends on for building and running (normal and build
/// dependencies; dev-dependencies are the tests' business). Crates from the registry cannot
/// depend on a member, so the members' own edges are the whole story. Read once per test binary.
fn dependency_graph() -> &'static BTreeMap<String, BTreeSet<String>> {
    static GRAPH: std::sync::OnceLock<BTreeMap<String, BTreeSet<String>>> =
        std::sync::OnceLock::new();
    GRAPH.get_or_init(|| {
        let out = std::process::Command::new(env!("CARGO"))
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("cargo metadata runs");
        assert!(
            out.status.success(),
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("metadata is JSON");
        meta["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .map(|p| {
                let deps = p["dependencies"]
                    .as_array()
                    .expect("dependencies")
                    .iter()
                    .filter(|d| d["kind"].as_str() != Some("dev"))
                    .map(|d| d["name"].as_str().expect("dependency name").to_string())
                    .collect();
                (p["name"].as_str().expect("package name").to_string(), deps)
            })
            .collect()
    })
}

/// Every package `root` depends on, directly or through others.
fn reachable(graph: &BTreeMap<String, BTreeSet<String>>, root: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.to_string()];
    while let Some(p) = todo.pop() {
        for d in graph.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

fn assert_never_reaches(root: &str, forbidden: &[&str]) {
    let graph = dependency_graph();
    assert!(graph.contains_key(root), "{root} is not in the workspace");
    let deps = reachable(graph, root);
    let bad: Vec<&&str> = forbidden.iter().filter(|f| deps.contains(**f)).collect();
    assert!(bad.is_empty(), "{root} depends on {bad:?}");
}

#[test]
fn harness_library_never_depends_on_the_stack() {
    assert_never_reaches("ting-chaos-harness", &["stack", "ting-chaos"]);
}

#[test]
fn stack_never_depends_on_the_harness_or_the_fakes() {
    assert_never_reaches(
        "stack",
        &["ting-chaos", "ting-chaos-harness", "mock-providers"],
    );
}

#[test]
fn fakes_depend_on_neither() {
    assert_never_reaches(
        "mock-providers",
        &["ting-chaos", "ting-chaos-harness", "stack"],
    );
}

/// The harness validates and the stack renders with the same engine, and the engine reaches
/// neither (nor the fakes): it is a leaf, std only, so it cannot become a path between them.
#[test]
fn the_template_engine_is_a_leaf_both_sides_use() {
    assert_never_reaches(
        "ting-template",
        &[
            "ting-chaos",
            "ting-chaos-harness",
            "stack",
            "mock-providers",
            "throwaway-pg",
        ],
    );
    let graph = dependency_graph();
    assert_eq!(
        graph["ting-template"],
        BTreeSet::new(),
        "ting-template depends on nothing beyond std"
    );
    for user in ["stack", "ting-chaos-harness"] {
        assert!(
            graph[user].contains("ting-template"),
            "{user} does not use it"
        );
    }
}

#[test]
fn only_the_binary_links_harness_and_stack() {
    let graph = dependency_graph();
    let both: Vec<&String> = graph
        .iter()
        .filter(|(_, deps)| deps.contains("stack") && deps.contains("ting-chaos-harness"))
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        both,
        ["ting-chaos"],
        "packages linking both the harness and the stack"
    );
}

/// `[stack].flaws` is validated against the harness's list, and the stack switches on its own:
/// the two lists, the flaws documented in docs/flaws.md and the flaws tests/flaws.rs proves
/// caught are one set, so a new flaw cannot be refused by `validate` or go unproven.
#[test]
fn every_flaw_is_known_documented_and_proven_caught() {
    let stack: std::collections::BTreeSet<&str> =
        stack::config::Flaw::ALL.iter().map(|(n, _)| *n).collect();
    let harness: std::collections::BTreeSet<&str> = ting_chaos_harness::scenario::KNOWN_FLAWS
        .iter()
        .copied()
        .collect();
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
