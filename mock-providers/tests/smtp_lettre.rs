//! The fake SMTP server against `lettre`, a real client the project did not write: decoding of
//! multipart messages, the whole message and envelope in the ledger, partial recipient
//! rejection, content hashes across encodings, and the capacity figure (`cargo test --release -p
//! mock-providers --test smtp_lettre -- --ignored --nocapture`).
//!
//! lettre does not pipeline: although the server advertises PIPELINING, lettre 0.11 writes MAIL,
//! each RCPT and DATA one at a time and waits for each reply. PIPELINING conformance (commands
//! sent in one write, a rejected RCPT among them, replies in order) is therefore covered by the
//! raw pipelined client in `tests/smtp_protocol.rs`
//! (`pipelined_transaction_with_a_rejected_rcpt_answers_in_order`), not here.

mod smtp_support;

use std::time::Instant;

use lettre::address::Envelope;
use lettre::message::header::{ContentTransferEncoding, ContentType};
use lettre::message::{Body, MultiPart, SinglePart};
use lettre::transport::smtp::PoolConfig;
use lettre::{Address, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use mock_providers::config::SmtpConfig;
use mock_providers::faults::is_bad_address;
use mock_providers::ledger::{Outcome, Provider};
use mock_providers::smtp::mime::payload_hash;
use mock_providers::units::Ratio;
use smtp_support::*;

const SUBJECT: &str = "Order A-1001 <received> for Ana & \u{5c71}\u{7530}";
const TEXT: &str = "Hi Ana <b>&</b> \u{5c71}\u{7530},\nyour order A-1001 is confirmed \u{2713}\n.leading dot line\n";
const HTML: &str = "<p>Hi Ana &lt;b&gt;&amp;&lt;/b&gt; \u{5c71}\u{7530}</p>\n<p>order &quot;A-1001&quot; \u{2713}</p>\n";

fn transport(w: &World, pool: u32) -> AsyncSmtpTransport<Tokio1Executor> {
    AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
        .port(w.addr.port())
        .pool_config(PoolConfig::new().max_size(pool))
        .build()
}

fn multipart(id: &str, to: &[&str]) -> Message {
    let mut b = Message::builder()
        .from("Shop <shop@x.test>".parse().unwrap())
        .subject(SUBJECT)
        .message_id(Some(format!("<{id}>")))
        .header(XEventsUrl("http://127.0.0.1:1/v1/callbacks/email".into()));
    for t in to {
        b = b.to(t.parse().unwrap());
    }
    b.multipart(MultiPart::alternative_plain_html(
        TEXT.to_string(),
        HTML.to_string(),
    ))
    .unwrap()
}

#[tokio::test]
async fn multipart_message_is_decoded_into_the_ledger() {
    let w = spawn(1, SmtpConfig::default()).await;
    let t = transport(&w, 1);
    let resp = t
        .send(multipart("m1@shop.test", &["Ana <a@x.test>"]))
        .await
        .unwrap();
    assert_eq!(resp.code().to_string(), "250");
    let sends = w.sends();
    assert_eq!(sends.len(), 1);
    let e = &sends[0];
    assert_eq!(
        (e.recipient.as_str(), e.outcome, e.status.as_str()),
        ("a@x.test", Outcome::Accepted, "250 2.0.0")
    );
    assert_eq!(e.subject.as_deref(), Some(SUBJECT));
    assert_eq!(e.body.as_deref(), Some(TEXT));
    assert_eq!(e.html.as_deref(), Some(HTML));
    assert_eq!(e.message_id.as_deref(), Some("m1@shop.test"));
    assert_eq!(e.idempotency_key.as_deref(), Some("m1@shop.test"));
    assert_eq!(
        e.payload_hash.as_deref(),
        Some(payload_hash(SUBJECT, TEXT, HTML).as_str())
    );
    assert_eq!(
        e.callback_url.as_deref(),
        Some("http://127.0.0.1:1/v1/callbacks/email")
    );
    assert!(e.peer.is_some());
    w.wait_ledger("on_commit", |_| w.commits.lock().unwrap().len() == 1)
        .await;
}

/// The whole accepted message, as the ledger (and its JSON Lines export) keeps it: the envelope
/// (MAIL FROM distinct from the From header, every RCPT TO), every header in order, the raw size
/// and hashes, beside the decoded content.
#[tokio::test]
async fn whole_message_and_envelope_are_recorded() {
    use sha2::{Digest, Sha256};
    let w = spawn(1, SmtpConfig::default()).await;
    let t = transport(&w, 1);
    let msg = multipart("whole@shop.test", &["Ana <a@x.test>", "b@x.test"]);
    let raw = msg.formatted();
    let envelope = Envelope::new(
        Some("bounces+42@shop.test".parse::<Address>().unwrap()),
        vec!["a@x.test".parse().unwrap(), "b@x.test".parse().unwrap()],
    )
    .unwrap();
    t.send_raw(&envelope, &raw).await.unwrap();
    let sends = w.sends();
    assert_eq!(sends.len(), 2, "one entry per recipient");

    // What lettre wrote, parsed independently: every header line, unfolded.
    let text = String::from_utf8(raw.clone()).unwrap();
    let (head, _) = text.split_once("\r\n\r\n").unwrap();
    let mut want: Vec<(String, String)> = Vec::new();
    for line in head.split("\r\n") {
        if line.starts_with([' ', '\t']) {
            want.last_mut().unwrap().1.push_str(line);
        } else {
            let (n, v) = line.split_once(':').unwrap();
            want.push((n.to_string(), v.trim_start().to_string()));
        }
    }
    let names: Vec<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
    for h in [
        "From",
        "To",
        "Date",
        "Subject",
        "Message-ID",
        "X-Events-Url",
        "MIME-Version",
    ] {
        assert!(names.contains(&h), "lettre wrote no {h}: {names:?}");
    }
    let hex = |b: &[u8]| hex::encode(Sha256::digest(b));
    // lettre ends the data with CRLF "." CRLF after the formatted message, whatever its last
    // bytes: the server receives the message followed by one more CRLF.
    let received = [raw.as_slice(), b"\r\n"].concat();
    let body = format!("{}\r\n", &text[head.len() + 4..]);

    for (e, rcpt) in sends.iter().zip(["a@x.test", "b@x.test"]) {
        assert_eq!((e.recipient.as_str(), e.outcome), (rcpt, Outcome::Accepted));
        assert_eq!(e.message_id.as_deref(), Some("whole@shop.test"));
        assert_eq!(e.body.as_deref(), Some(TEXT));
        let d = e
            .email
            .as_deref()
            .expect("email detail on an accepted send");
        assert_eq!(d.mail_from, "bounces+42@shop.test");
        assert_eq!(d.rcpt_to, ["a@x.test", "b@x.test"]);
        let got: Vec<(String, String)> = d
            .headers
            .iter()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        assert_eq!(got, want);
        let header = |n: &str| {
            d.headers
                .iter()
                .find(|h| h.name == n)
                .map(|h| h.value.as_str())
        };
        assert_eq!(header("From"), Some("Shop <shop@x.test>"));
        assert_eq!(header("To"), Some("Ana <a@x.test>, b@x.test"));
        let date = header("Date").unwrap();
        chrono::DateTime::parse_from_rfc2822(date).unwrap_or_else(|e| panic!("{date}: {e}"));
        // The message as received is byte for byte what lettre formatted (dot-stuffing undone).
        assert_eq!(d.size, received.len() as u64);
        assert_eq!(d.sha256, hex(&received));
        assert_eq!(d.body_sha256, hex(body.as_bytes()));
    }

    // The JSON Lines export carries it all.
    let mut out = Vec::new();
    w.ledger.write_jsonl(&mut out).unwrap();
    let line: serde_json::Value =
        serde_json::from_str(String::from_utf8(out).unwrap().lines().next().unwrap()).unwrap();
    let email = &line["email"];
    assert_eq!(email["mail_from"], "bounces+42@shop.test");
    assert_eq!(
        email["rcpt_to"],
        serde_json::json!(["a@x.test", "b@x.test"])
    );
    assert_eq!(email["size"], received.len());
    assert_eq!(email["sha256"], hex(&received));
    assert_eq!(email["headers"][0]["name"], want[0].0.as_str());
    assert_eq!(email["headers"][0]["value"], want[0].1.as_str());
    assert_eq!(email["headers"].as_array().unwrap().len(), want.len());
    assert_eq!(line["body"], TEXT);
    assert_eq!(line["message_id"], "whole@shop.test");
}

#[tokio::test]
async fn one_rejected_recipient_fails_the_message_in_lettre() {
    let seed = 11;
    let rate = Ratio(0.5);
    let addrs: Vec<String> = (0..50).map(|i| format!("u{i}@x.test")).collect();
    let bad = |a: &String| is_bad_address(seed, Provider::Smtp, a, rate);
    let good: Vec<&String> = addrs.iter().filter(|a| !bad(a)).take(2).collect();
    let worst = addrs.iter().find(|a| bad(a)).unwrap();
    let w = spawn(
        seed,
        SmtpConfig {
            bad_addresses: rate,
            ..SmtpConfig::default()
        },
    )
    .await;
    let t = transport(&w, 1);
    let to = [good[0].as_str(), worst.as_str(), good[1].as_str()];
    let err = t.send(multipart("m2@shop.test", &to)).await.unwrap_err();
    assert!(err.is_permanent(), "{err}");
    // lettre stops at the first rejected RCPT and abandons the transaction: the recipient before
    // it was accepted at RCPT but never reached a decision, the one after was never tried.
    let got: Vec<_> = w
        .sends()
        .into_iter()
        .map(|e| (e.recipient, e.outcome, e.fault))
        .collect();
    assert_eq!(
        got,
        [(
            worst.clone(),
            Outcome::Permanent,
            Some("bad_address".to_string())
        )]
    );
    assert!(w.commits.lock().unwrap().is_empty());
    // Sent again to the good recipients only: both accepted, each on its second attempt.
    t.send(multipart("m2@shop.test", &[to[0], to[2]]))
        .await
        .unwrap();
    let accepted: Vec<_> = w
        .sends()
        .into_iter()
        .filter(|e| e.outcome == Outcome::Accepted)
        .map(|e| (e.recipient, e.attempt))
        .collect();
    assert_eq!(accepted, [(good[0].clone(), 2), (good[1].clone(), 1)]);
}

#[tokio::test]
async fn same_content_with_other_boundaries_and_encodings_hashes_the_same() {
    let w = spawn(1, SmtpConfig::default()).await;
    let t = transport(&w, 1);
    let (m1, m2) = (
        multipart("h1@shop.test", &["a@x.test"]),
        multipart("h2@shop.test", &["a@x.test"]),
    );
    let boundary = |m: &Message| {
        let raw = String::from_utf8_lossy(&m.formatted()).into_owned();
        let at = raw.find("boundary=").expect("multipart");
        raw[at..].lines().next().unwrap().to_string()
    };
    assert_ne!(
        boundary(&m1),
        boundary(&m2),
        "lettre picks a fresh boundary per message"
    );
    t.send(m1).await.unwrap();
    t.send(m2).await.unwrap();
    let b64 = |s: &str, ct: ContentType| {
        SinglePart::builder()
            .header(ct)
            .body(Body::new_with_encoding(s.to_string(), ContentTransferEncoding::Base64).unwrap())
    };
    let other = Message::builder()
        .from("shop@x.test".parse().unwrap())
        .to("a@x.test".parse().unwrap())
        .subject(SUBJECT)
        .message_id(Some("<h3@shop.test>".into()))
        .multipart(
            MultiPart::alternative()
                .boundary("a-completely-different-boundary")
                .singlepart(b64(TEXT, ContentType::TEXT_PLAIN))
                .singlepart(b64(HTML, ContentType::TEXT_HTML)),
        )
        .unwrap();
    assert!(String::from_utf8_lossy(&other.formatted()).contains("base64"));
    t.send(other).await.unwrap();
    let changed = Message::builder()
        .from("shop@x.test".parse().unwrap())
        .to("a@x.test".parse().unwrap())
        .subject(SUBJECT)
        .message_id(Some("<h4@shop.test>".into()))
        .multipart(MultiPart::alternative_plain_html(
            TEXT.replace("Ana", "Ann"),
            HTML.to_string(),
        ))
        .unwrap();
    t.send(changed).await.unwrap();
    let hashes: Vec<_> = w
        .sends()
        .into_iter()
        .map(|e| e.payload_hash.unwrap())
        .collect();
    assert_eq!(hashes.len(), 4);
    assert_eq!(hashes[0], hashes[1]);
    assert_eq!(hashes[0], hashes[2]);
    assert_ne!(hashes[0], hashes[3]);
}

/// Capacity of the fake SMTP server through lettre with a connection pool, on loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints messages/s"]
async fn capacity_through_lettre_pool() {
    let w = spawn(1, SmtpConfig::default()).await;
    let t = transport(&w, 16);
    let n = 4000;
    let tasks = 16;
    let start = Instant::now();
    let mut handles = Vec::new();
    for k in 0..tasks {
        let t = t.clone();
        handles.push(tokio::spawn(async move {
            for i in (k..n).step_by(tasks) {
                let to = format!("r{i}@x.test");
                t.send(multipart(&format!("cap{i}@shop.test"), &[to.as_str()]))
                    .await
                    .unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(w.sends().len(), n);
    println!(
        "smtp capacity: {n} multipart messages via lettre pool of 16, 16 senders, loopback: {:.0} msg/s ({secs:.2}s)",
        n as f64 / secs
    );
}
