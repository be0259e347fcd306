//! The fake SMTP server over real TCP, driven by a raw client: pipelining, dot-unstuffing,
//! the small commands, protocol errors, limits, idle timeout and shutdown.
//!
//! PIPELINING (RFC 2920) is tested here with a raw client that writes several commands in one
//! write, because lettre, the third-party client of `tests/smtp_lettre.rs`, does not pipeline
//! (it waits for each reply before the next command).

mod smtp_support;

use std::time::Duration;

use mock_providers::config::SmtpConfig;
use mock_providers::ledger::Outcome;
use mock_providers::smtp::Limits;
use smtp_support::*;

fn code(reply: &str) -> &str {
    &reply[..reply.len().min(9)]
}

#[tokio::test]
async fn pipelined_transaction_with_dot_unstuffing() {
    let w = spawn(1, SmtpConfig::default()).await;
    let mut c = w.client().await;
    assert!(c.greeting.starts_with("220 "), "{}", c.greeting);
    let ehlo = c.cmd("EHLO client.test").await;
    for ext in [
        "PIPELINING",
        "8BITMIME",
        "SIZE 10485760",
        "ENHANCEDSTATUSCODES",
    ] {
        assert!(ehlo.contains(ext), "{ext} not in {ehlo:?}");
    }
    // MAIL, two RCPTs and DATA in one write, as PIPELINING allows.
    c.send("MAIL FROM:<shop@x.test>\r\nRCPT TO:<a@x.test>\r\nRCPT TO:<b@x.test>\r\nDATA\r\n")
        .await;
    let replies = [
        c.reply().await,
        c.reply().await,
        c.reply().await,
        c.reply().await,
    ];
    let codes: Vec<_> = replies.iter().map(|r| code(r)).collect();
    assert_eq!(codes, ["250 2.1.0", "250 2.1.5", "250 2.1.5", "354 end d"]);
    c.send(
        "Message-ID: <m1@x.test>\r\nSubject: dots\r\n\r\n..leading dot\r\n...\r\nmiddle . dot\r\n.\r\n",
    )
    .await;
    let end = c.reply().await;
    assert!(end.starts_with("250 2.0.0 OK queued as m1@x.test"), "{end}");
    let sends = w.sends();
    assert_eq!(sends.len(), 2);
    for (e, rcpt) in sends.iter().zip(["a@x.test", "b@x.test"]) {
        assert_eq!(
            (e.recipient.as_str(), e.outcome, e.attempt),
            (rcpt, Outcome::Accepted, 1)
        );
        assert_eq!(e.body.as_deref(), Some(".leading dot\n..\nmiddle . dot\n"));
        assert_eq!(e.message_id.as_deref(), Some("m1@x.test"));
        assert_eq!(e.status, "250 2.0.0");
    }
    // A second transaction on the same connection is attempt 2.
    let r = c
        .transaction(
            "shop@x.test",
            &["a@x.test"],
            &simple_message("m2@x.test", "s", "b"),
        )
        .await;
    assert!(r.last().unwrap().starts_with("250 2.0.0"), "{r:?}");
    assert_eq!(w.sends().last().unwrap().attempt, 2);
    assert_eq!(c.cmd("QUIT").await, "221 2.0.0 bye\r\n");
    assert_eq!(c.until_closed().await, "");
}

/// RFC 2920: MAIL, an accepted RCPT, a rejected RCPT and DATA in a single write; the replies
/// come back in command order, DATA still gets 354 for the accepted recipient, and the message
/// is committed for that one only.
#[tokio::test]
async fn pipelined_transaction_with_a_rejected_rcpt_answers_in_order() {
    use mock_providers::faults::is_bad_address;
    use mock_providers::ledger::Provider;
    use mock_providers::units::Ratio;
    let (seed, rate) = (5, Ratio(0.5));
    let addrs: Vec<String> = (0..50).map(|i| format!("p{i}@x.test")).collect();
    let bad = |a: &&String| is_bad_address(seed, Provider::Smtp, a, rate);
    let good = addrs.iter().find(|a| !bad(a)).unwrap();
    let worst = addrs.iter().find(bad).unwrap();
    let cfg = SmtpConfig {
        bad_addresses: rate,
        ..SmtpConfig::default()
    };
    let w = spawn(seed, cfg).await;
    let mut c = w.client().await;
    assert!(c.cmd("EHLO client.test").await.contains("PIPELINING"));
    c.send(format!(
        "MAIL FROM:<shop@x.test>\r\nRCPT TO:<{good}>\r\nRCPT TO:<{worst}>\r\nDATA\r\n"
    ))
    .await;
    let replies = [
        c.reply().await,
        c.reply().await,
        c.reply().await,
        c.reply().await,
    ];
    let codes: Vec<_> = replies.iter().map(|r| code(r)).collect();
    assert_eq!(
        codes,
        ["250 2.1.0", "250 2.1.5", "550 5.1.1", "354 end d"],
        "{replies:?}"
    );
    c.send("Message-ID: <pl@x.test>\r\nSubject: p\r\n\r\nhi\r\n.\r\nQUIT\r\n")
        .await;
    assert!(c.reply().await.starts_with("250 2.0.0"));
    assert!(c.reply().await.starts_with("221"));
    let got: Vec<_> = w
        .sends()
        .into_iter()
        .map(|e| (e.recipient, e.outcome, e.email.map(|d| d.rcpt_to)))
        .collect();
    assert_eq!(
        got,
        [
            (worst.clone(), Outcome::Permanent, None),
            (good.clone(), Outcome::Accepted, Some(vec![good.clone()])),
        ]
    );
}

#[tokio::test]
async fn small_commands_and_rset() {
    let w = spawn(1, SmtpConfig::default()).await;
    let mut c = w.client().await;
    c.cmd("HELO client.test").await;
    let cases = [
        ("NOOP", "250 2.0.0"),
        ("VRFY someone", "252 2.5.0"),
        ("MAIL FROM:<shop@x.test>", "250 2.1.0"),
        ("RCPT TO:<a@x.test>", "250 2.1.5"),
        ("RSET", "250 2.0.0"),
        // RSET dropped the transaction.
        ("DATA", "503 5.5.1"),
        ("RCPT TO:<a@x.test>", "503 5.5.1"),
        ("MAIL FROM:<shop@x.test>", "250 2.1.0"),
        ("rcpt to:<a@x.test>", "250 2.1.5"),
        ("RSET", "250 2.0.0"),
        ("QUIT", "221 2.0.0"),
    ];
    for (line, want) in cases {
        let got = c.cmd(line).await;
        assert_eq!(code(&got), want, "{line}: {got}");
    }
    c.until_closed().await;
    assert!(
        w.sends().is_empty(),
        "abandoned transactions leave no send entry"
    );
}

#[tokio::test]
async fn garbage_bare_lf_and_long_lines_always_get_an_answer() {
    let w = spawn(1, SmtpConfig::default()).await;
    let mut c = w.client().await;
    let long = format!("NOOP {}", "x".repeat(1200));
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"EHLO bare.lf\n".to_vec(), "250"),
        (b"\xff\xfe\x00\x01garbage\r\n".to_vec(), "500 5.5.2"),
        (b"GET / HTTP/1.1\r\n".to_vec(), "500 5.5.1"),
        (b"\r\n".to_vec(), "500 5.5.2"),
        (format!("{long}\r\n").into_bytes(), "500 5.5.2"),
        (b"MAIL FROM:<a@x.test> SIZE=nope\r\n".to_vec(), "501 5.5.4"),
        (
            b"MAIL FROM:<a@x.test> SIZE=99999999999\r\n".to_vec(),
            "552 5.3.4",
        ),
        (b"MAIL FROM:<a@x.test> FOO=1\r\n".to_vec(), "555 5.5.4"),
        (b"STARTTLS\r\n".to_vec(), "502 5.5.1"),
        (b"NOOP\n".to_vec(), "250 2.0.0"),
    ];
    for (input, want) in &cases {
        c.send(input).await;
        let got = c.reply().await;
        assert!(
            got.starts_with(want),
            "{:?}: {got}",
            String::from_utf8_lossy(input)
        );
    }
    // Bare-LF message accepted leniently.
    c.send("MAIL FROM:<a@x.test>\nRCPT TO:<r@x.test>\nDATA\n")
        .await;
    for want in ["250", "250", "354"] {
        assert!(c.reply().await.starts_with(want));
    }
    c.send("Subject: lf\n\nbody\n.\n").await;
    assert!(c.reply().await.starts_with("250 2.0.0"));
    assert_eq!(w.sends().last().unwrap().body.as_deref(), Some("body\n"));

    let errors: Vec<_> = w
        .ledger
        .snapshot()
        .into_iter()
        .filter(|e| e.outcome == Outcome::ProtocolError)
        .map(|e| (e.recipient, e.status))
        .collect();
    let want: Vec<_> = [
        "500 5.5.2",
        "500 5.5.1",
        "500 5.5.2",
        "500 5.5.2",
        "501 5.5.4",
        "555 5.5.4",
        "502 5.5.1",
    ]
    .iter()
    .map(|s| (String::new(), s.to_string()))
    .collect();
    assert_eq!(errors, want);
}

#[tokio::test]
async fn too_many_errors_close_the_connection() {
    let w = spawn(1, SmtpConfig::default()).await;
    let mut c = w.client().await;
    for _ in 0..20 {
        assert!(c.cmd("BOGUS").await.starts_with("500"));
    }
    assert!(c.cmd("BOGUS").await.starts_with("421 4.7.0"));
    assert_eq!(c.until_closed().await, "");
}

#[tokio::test]
async fn oversized_message_and_long_data_line_are_rejected_after_the_dot() {
    let cfg = SmtpConfig {
        max_size: 200,
        ..SmtpConfig::default()
    };
    let w = spawn(1, cfg).await;
    let mut c = w.client().await;
    let big = simple_message("big@x.test", "big", &"y".repeat(300));
    let r = c.transaction("a@x.test", &["r@x.test"], &big).await;
    assert!(r.last().unwrap().starts_with("552 5.3.4"), "{r:?}");
    // The rest of the big message was not read as commands: the session is still in order.
    assert!(c.cmd("NOOP").await.starts_with("250"));
    let long = simple_message("long@x.test", "long", &"z".repeat(1100));
    w.config.write().unwrap().max_size = 10_000;
    let r = c.transaction("a@x.test", &["r@x.test"], &long).await;
    assert!(r.last().unwrap().starts_with("500 5.5.2"), "{r:?}");
    let got: Vec<_> = w
        .ledger
        .snapshot()
        .into_iter()
        .map(|e| (e.recipient, e.attempt, e.outcome, e.status))
        .collect();
    assert_eq!(
        got,
        [
            ("r@x.test".into(), 1, Outcome::Permanent, "552 5.3.4".into()),
            (
                "r@x.test".into(),
                2,
                Outcome::ProtocolError,
                "500 5.5.2".into()
            ),
        ]
    );
}

#[tokio::test]
async fn idle_connections_time_out_with_421() {
    let limits = Limits {
        idle_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let w = spawn_with(1, SmtpConfig::default(), limits).await;
    let mut c = w.client().await;
    c.cmd("EHLO c").await;
    let started = std::time::Instant::now();
    let rest = c.until_closed().await;
    assert_eq!(rest, "421 4.4.2 idle timeout, closing connection\r\n");
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn shutdown_closes_idle_connections_and_returns() {
    let w = spawn(1, SmtpConfig::default()).await;
    let mut c = w.client().await;
    c.cmd("EHLO c").await;
    let addr = w.addr;
    w.shutdown().await;
    assert_eq!(
        c.until_closed().await,
        "421 4.3.2 service shutting down\r\n"
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener still open"
    );
}

#[tokio::test]
async fn a_reply_is_not_held_back_for_half_a_pipelined_line() {
    let w = spawn(1, SmtpConfig::default()).await;
    let mut c = w.client().await;
    c.send("EHLO c\r\nNOO").await;
    assert!(c.reply().await.starts_with("250-"));
    c.send("P\r\n").await;
    assert!(c.reply().await.starts_with("250 2.0.0"));
}
