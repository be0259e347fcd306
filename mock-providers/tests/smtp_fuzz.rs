//! The fake SMTP server under hostile input: random bytes and random command sequences, seeded
//! and bounded in count and time. Whatever arrives, no connection task may panic, the server keeps
//! accepting, and a well-formed transaction still gets its 250 afterwards.
//!
//! The seed is printed and can be set with `TING_FUZZ_SEED`, so a failing run replays; the same
//! seed writes the same bytes (what the server answers in between may interleave differently).

mod smtp_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mock_providers::config::SmtpConfig;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use smtp_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sessions per run, and the wall-clock bound on them (whichever comes first).
const SESSIONS: usize = 300;
const BUDGET: Duration = Duration::from_secs(8);

/// Commands in every state, valid and not, with arguments filled in at random.
const VERBS: &[&str] = &[
    "EHLO",
    "HELO",
    "MAIL FROM:",
    "RCPT TO:",
    "DATA",
    ".",
    "RSET",
    "NOOP",
    "QUIT",
    "VRFY",
    "EXPN",
    "HELP",
    "BDAT",
    "AUTH PLAIN",
    "STARTTLS",
    "mail from:",
    "RCPT",
    "MAIL",
    "",
];

fn random_bytes(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let n = rng.gen_range(0..3000);
    let mut v: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
    // Sprinkle the bytes SMTP cares about so the parser's line and dot handling is reached.
    for _ in 0..rng.gen_range(0..20) {
        if !v.is_empty() {
            let i = rng.gen_range(0..v.len());
            v[i] = *[b'\r', b'\n', b'.', 0, b' ', b':', b'<', b'>']
                .get(rng.gen_range(0..8))
                .unwrap_or(&b'\n');
        }
    }
    v
}

fn random_arg(rng: &mut ChaCha8Rng) -> String {
    match rng.gen_range(0..8) {
        0 => String::new(),
        1 => "<a@x.test>".into(),
        2 => format!(
            "<{}@x.test> SIZE={}",
            "r".repeat(rng.gen_range(0..80)),
            rng.gen::<u64>()
        ),
        3 => "x".repeat(rng.gen_range(900..2100)),
        4 => "<>".into(),
        5 => "<a@x.test> BODY=8BITMIME SMTPUTF8".into(),
        6 => "\u{202e}é\u{0}".into(),
        _ => format!("{}", rng.gen::<i64>()),
    }
}

fn random_session(rng: &mut ChaCha8Rng) -> Vec<u8> {
    if rng.gen_bool(0.3) {
        return random_bytes(rng);
    }
    let mut out = Vec::new();
    for _ in 0..rng.gen_range(1..30) {
        let verb = VERBS[rng.gen_range(0..VERBS.len())];
        out.extend_from_slice(format!("{verb}{}", random_arg(rng)).as_bytes());
        // Mostly CRLF; sometimes a bare LF, a bare CR, or no line end at all.
        let end: &[u8] = match rng.gen_range(0..10) {
            0 => b"\n",
            1 => b"\r",
            2 => b"",
            _ => b"\r\n",
        };
        out.extend_from_slice(end);
        if verb == "DATA" && rng.gen_bool(0.5) {
            out.extend_from_slice(&random_bytes(rng));
            if rng.gen_bool(0.5) {
                out.extend_from_slice(b"\r\n.\r\n");
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_and_command_sequences_never_break_the_server() {
    let seed: u64 = std::env::var("TING_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5A1F_F00D);
    eprintln!("smtp fuzz seed {seed} (TING_FUZZ_SEED to replay)");
    let panics = Arc::new(AtomicUsize::new(0));
    let seen = panics.clone();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        seen.fetch_add(1, Ordering::SeqCst);
        default_hook(info);
    }));

    let cfg = SmtpConfig {
        max_size: 4096,
        ..SmtpConfig::default()
    };
    let w = spawn(seed, cfg).await;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let started = Instant::now();
    let mut sessions = 0;
    while sessions < SESSIONS && started.elapsed() < BUDGET {
        sessions += 1;
        let bytes = random_session(&mut rng);
        let mut s = tokio::net::TcpStream::connect(w.addr)
            .await
            .unwrap_or_else(|e| panic!("session {sessions}: server stopped accepting: {e}"));
        // The server may close mid-write (too many errors, a line too long): that is its right.
        let _ = s.write_all(&bytes).await;
        let mut sink = vec![0u8; 8192];
        // Read what it answers for a moment, then hang up (half the time without reading).
        if rng.gen_bool(0.5) {
            let _ = tokio::time::timeout(Duration::from_millis(20), s.read(&mut sink)).await;
        }
    }
    eprintln!("{sessions} sessions in {:?}", started.elapsed());
    assert!(
        sessions >= 50,
        "only {sessions} sessions ran within {BUDGET:?}"
    );

    // Still serving, and serving right.
    let mut c = w.client().await;
    assert!(c.greeting.starts_with("220 "), "{}", c.greeting);
    let replies = c
        .transaction(
            "shop@x.test",
            &["after-fuzz@x.test"],
            &simple_message("after-fuzz@x.test", "still here", "hello"),
        )
        .await;
    assert!(
        replies.last().is_some_and(|r| r.starts_with("250")),
        "{replies:?}"
    );
    assert_eq!(
        panics.load(Ordering::SeqCst),
        0,
        "a connection task panicked (seed {seed})"
    );
    w.shutdown().await;
}
