//! A sender that hangs up before the provider answers is recorded as such (`client_hung_up`),
//! while the provider still commits the send; one that waits for the answer is not. This is how
//! the harness sees a worker abandoning in-flight sends. Arrival time is taken before latency.

mod common;

use std::time::Duration;

use common::*;
use mock_providers::config::{Latency, ProvidersConfig};
use mock_providers::ledger::Outcome;
use serde_json::json;

/// The fakes' latency: the impatient client hangs up well inside it, with seconds to spare for a
/// descheduled test process.
const LATENCY_MS: u64 = 3_000;

/// How long the impatient client waits: long enough to have written its request (or the fake
/// would record nothing), far shorter than [`LATENCY_MS`].
const IMPATIENCE: Duration = Duration::from_millis(500);

fn slow(ms_: u64) -> ProvidersConfig {
    let mut c = ProvidersConfig::default();
    c.line.latency = Latency::Fixed { value: ms(ms_) };
    c.sms.latency = Latency::Fixed { value: ms(ms_) };
    c
}

#[tokio::test]
async fn hang_up_before_the_answer_is_recorded() {
    let w = world(1, slow(LATENCY_MS)).await;
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(IMPATIENCE)
        .build()
        .unwrap();
    // (channel, waits for the answer)
    for (i, (channel, waits)) in [
        ("line", true),
        ("line", false),
        ("sms", true),
        ("sms", false),
    ]
    .into_iter()
    .enumerate()
    {
        let client = if waits { &w.http } else { &impatient };
        let to = if channel == "line" {
            uid(i as u32)
        } else {
            phone(i as u32)
        };
        let rb = if channel == "line" {
            client
                .post(format!("{}/v2/bot/message/push", w.p.line_base()))
                .header("authorization", format!("Bearer {TOKEN}"))
                .json(&json!({"to": to, "messages": [{"type": "text", "text": "hi"}]}))
        } else {
            client
                .post(w.sms_url("Messages.json"))
                .basic_auth(
                    "AC00000000000000000000000000000000",
                    Some("ting-sms-auth-token"),
                )
                .form(&[
                    ("To", to.as_str()),
                    ("From", "+15550001000"),
                    ("Body", "hi"),
                ])
        };
        let answered = rb.send().await.is_ok();
        assert_eq!(answered, waits, "{channel} waits={waits}");
        until(20, || w.entries().iter().any(|e| e.recipient == to)).await;
        let e = w.entries().into_iter().find(|e| e.recipient == to).unwrap();
        assert_eq!(e.outcome, Outcome::Accepted, "{channel}: {e:?}");
        assert_eq!(e.client_hung_up, !waits, "{channel} waits={waits}: {e:?}");
        let latency = e.mono_ns - e.received_ns;
        assert!(
            latency >= (LATENCY_MS - 10) * 1_000_000,
            "{channel}: arrival is taken before the {LATENCY_MS} ms latency, got {latency} ns"
        );
    }
}

/// The same for SMTP: a client that closes the connection after its final `.` while the fake
/// holds the 250 is recorded as having hung up (the message still commits); one that reads the
/// reply is not.
#[tokio::test]
async fn smtp_client_closing_before_the_final_reply_is_recorded() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut cfg = ProvidersConfig::default();
    cfg.smtp.latency = Latency::Fixed {
        value: ms(LATENCY_MS),
    };
    let w = world(2, cfg).await;
    for (i, waits) in [true, false].into_iter().enumerate() {
        let to = format!("hang{i}@example.test");
        let stream = tokio::net::TcpStream::connect(w.p.smtp_addr).await.unwrap();
        let (r, mut wr) = stream.into_split();
        let mut r = BufReader::new(r);
        let mut line = String::new();
        // Reads one reply (possibly multi-line) and returns its code.
        async fn reply(
            r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
            line: &mut String,
        ) -> String {
            loop {
                line.clear();
                r.read_line(line).await.unwrap();
                if line.len() < 4 || line.as_bytes()[3] != b'-' {
                    return line.get(..3).unwrap_or("").to_string();
                }
            }
        }
        assert_eq!(reply(&mut r, &mut line).await, "220");
        for (cmd, want) in [
            ("EHLO t.example\r\n".to_string(), "250"),
            ("MAIL FROM:<s@t.example>\r\n".to_string(), "250"),
            (format!("RCPT TO:<{to}>\r\n"), "250"),
            ("DATA\r\n".to_string(), "354"),
        ] {
            wr.write_all(cmd.as_bytes()).await.unwrap();
            assert_eq!(reply(&mut r, &mut line).await, want, "{cmd}");
        }
        wr.write_all(b"Subject: x\r\nMessage-ID: <m@t.example>\r\n\r\nhi\r\n.\r\n")
            .await
            .unwrap();
        if waits {
            assert_eq!(reply(&mut r, &mut line).await, "250");
        } else {
            drop(wr);
            drop(r);
        }
        until(20, || w.entries().iter().any(|e| e.recipient == to)).await;
        let e = w.entries().into_iter().find(|e| e.recipient == to).unwrap();
        assert_eq!(e.outcome, Outcome::Accepted, "{e:?}");
        assert_eq!(e.client_hung_up, !waits, "waits={waits}: {e:?}");
        // The transaction began (MAIL FROM) before its final dot arrived.
        let started = e.started_ns.expect("started_ns on an SMTP send");
        assert!(started > 0 && started < e.received_ns, "{e:?}");
    }
}
