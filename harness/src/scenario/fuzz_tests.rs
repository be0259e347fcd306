//! The scenario boundary under hostile text: every shipped scenario, mutated at random (seeded,
//! bounded in count and time) with bytes TOML cares about and multi-byte characters, and read
//! with random `--set` flags. Whatever the text, the answer is a `Scenario` or an error placed
//! inside the text (or at a flag) — never a panic.
//!
//! The seed is printed and can be set with `TING_FUZZ_SEED`, so a failing case replays.

use std::path::Path;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{parse_with, Overrides};

const CASES: usize = 4000;
const BUDGET: Duration = Duration::from_secs(5);

/// What a mutation inserts: TOML's syntax, quotes and escapes, numbers at their edges, and
/// characters of two, three and four bytes (a byte offset inside one must never be sliced).
const PIECES: &[&str] = &[
    "=",
    "[",
    "]",
    "[[",
    "]]",
    "{",
    "}",
    ",",
    ".",
    "\"",
    "'",
    "\"\"\"",
    "\n",
    "\r\n",
    "#",
    " ",
    "\\u0000",
    "\\",
    "-",
    "0",
    "1e400",
    "9223372036854775808",
    "-1",
    "nan",
    "inf",
    "true",
    "\"2s\"",
    "\"1e30s\"",
    "\"150%\"",
    "é",
    "山田",
    "🚀",
    "\u{202e}",
    "\u{0}",
    "x.y",
    "chaos",
    "workers",
    "target",
    "at",
    "progress",
    "stack.external",
    "1979-05-27T07:32:00Z",
];

/// A `--set` flag: a key path (maybe broken) and a value (maybe hostile).
fn random_flag(rng: &mut ChaCha8Rng) -> String {
    const KEYS: &[&str] = &[
        "seed",
        "name",
        "stack.workers",
        "stack.lease",
        "load.recipients",
        "load.channels",
        "chaos[0].target",
        "chaos[0].at",
        "chaos[9].at",
        "providers.line.latency",
        "providers.sms.transient[0].rate",
        "expect.quiescence",
        "a..b",
        "stack.workers.x",
        "load[0]",
        "é.ü",
        "",
    ];
    const VALUES: &[&str] = &[
        "2",
        "0",
        "-1",
        "18446744073709551616",
        "\"2s\"",
        "2s",
        "[\"line\"]",
        "{ kind = \"fixed\" }",
        "1\nseed = 5",
        "🚀",
        "\"unterminated",
        "[",
        "",
        "1e400",
        "[[1]]",
    ];
    let key = KEYS[rng.gen_range(0..KEYS.len())];
    let value = VALUES[rng.gen_range(0..VALUES.len())];
    format!("{key}={value}")
}

fn mutate(rng: &mut ChaCha8Rng, text: &str) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for _ in 0..rng.gen_range(1..6) {
        let at = rng.gen_range(0..=chars.len());
        match rng.gen_range(0..4) {
            0 if at < chars.len() => {
                let end = (at + rng.gen_range(1..20)).min(chars.len());
                chars.drain(at..end);
            }
            1 => {
                let piece = PIECES[rng.gen_range(0..PIECES.len())];
                chars.splice(at..at, piece.chars());
            }
            2 if at < chars.len() => {
                let end = (at + rng.gen_range(1..40)).min(chars.len());
                let copy: Vec<char> = chars[at..end].to_vec();
                chars.splice(at..at, copy);
            }
            _ => {
                let c = char::from_u32(rng.gen_range(0..0x11_0000)).unwrap_or('\u{fffd}');
                chars.insert(at, c);
            }
        }
    }
    chars.into_iter().collect()
}

#[test]
fn no_scenario_text_or_flag_panics_the_boundary() {
    let seed = std::env::var("TING_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("TING_FUZZ_SEED={seed}");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    let mut shipped: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    shipped.sort();
    assert!(!shipped.is_empty());
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let started = Instant::now();
    let mut errors = 0;
    for n in 0..CASES {
        if started.elapsed() > BUDGET {
            break;
        }
        let text = mutate(&mut rng, &shipped[n % shipped.len()]);
        let overrides = Overrides {
            set: (0..rng.gen_range(0..3))
                .map(|_| random_flag(&mut rng))
                .collect(),
            workers: rng.gen_bool(0.1).then(|| rng.gen_range(0..100)),
            ..Default::default()
        };
        let path = dir.join("fuzz.toml");
        let outcome = std::panic::catch_unwind(|| parse_with(&path, &text, &overrides));
        match outcome {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                errors += 1;
                let lines = text.lines().count().max(1) + 1;
                assert!(
                    e.line <= lines,
                    "seed {seed} case {n}: error past the text's end: {e}\n--- text ---\n{text}"
                );
            }
            Err(_) => panic!(
                "seed {seed} case {n}: the boundary panicked on {:?}\n--- text ---\n{text}",
                overrides.set
            ),
        }
    }
    assert!(errors > 0, "the mutations never broke a scenario");
}
