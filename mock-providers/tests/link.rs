//! Faults on one sender's link, as the harness's `on_request` hook returns them
//! (`mock_providers::link`): a refuse resets the connection unread and records nothing sent
//! (`link_refuse`); a reset serves the request (an accepted send is committed: a LINE retry with
//! the same key is a repeat) and resets before the answer (`link_reset`); a partition holds the
//! request until the heal, then serves it, or records it not sent when its sender hangs up first
//! (`link_partition`, `client_hung_up`); a delay serves it late. For LINE, SMS and SMTP (at the
//! final dot; an SMTP refuse also before each command, `Hook::refuses`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::future::BoxFuture;
use mock_providers::config::ProvidersConfig;
use mock_providers::ledger::{Hook, LedgerEntry, Outcome, Provider};
use mock_providers::link::{LinkFate, Partition};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Returns `fate` for every send request, and counts them.
#[derive(Default)]
struct Fates {
    fate: Mutex<LinkFate>,
    asked: std::sync::atomic::AtomicUsize,
    /// Refuse every SMTP command (`Hook::refuses`).
    refuse_commands: std::sync::atomic::AtomicBool,
}

impl Hook for Fates {
    fn on_request<'a>(
        &'a self,
        _provider: Provider,
        _peer: std::net::SocketAddr,
    ) -> BoxFuture<'a, LinkFate> {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let fate = self.fate.lock().unwrap().clone();
        Box::pin(async move { fate })
    }

    fn refuses(&self, _provider: Provider, _peer: std::net::SocketAddr) -> bool {
        self.refuse_commands
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Fates {
    fn set(&self, fate: LinkFate) {
        *self.fate.lock().unwrap() = fate;
    }

    fn asked(&self) -> usize {
        self.asked.load(std::sync::atomic::Ordering::SeqCst)
    }
}

async fn world_with_fates(seed: u64) -> (Arc<World>, Arc<Fates>) {
    let w = Arc::new(world(seed, ProvidersConfig::default()).await);
    let fates = Arc::new(Fates::default());
    w.p.ledger.add_hook(fates.clone());
    w.p.hub().arm_link_fault(true);
    (w, fates)
}

fn impatient() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap()
}

/// A LINE push or an SMS create through `client`: the status, or the error's text.
async fn send(w: &World, client: &reqwest::Client, provider: Provider) -> Result<u16, String> {
    let r = match provider {
        Provider::Line => client
            .post(format!("{}/v2/bot/message/push", w.p.line_base()))
            .bearer_auth(TOKEN)
            .header("x-line-retry-key", "123e4567-e89b-12d3-a456-426614174000")
            .json(&serde_json::json!({"to": uid(1), "messages": [{"type": "text", "text": "hi"}]}))
            .send()
            .await,
        _ => {
            let sid = w.p.config().sms.account_sid.clone();
            client
                .post(format!(
                    "{}/2010-04-01/Accounts/{sid}/Messages.json",
                    w.p.sms_base()
                ))
                .basic_auth(&sid, Some("ting-sms-auth-token"))
                .header("idempotency-key", "k-1")
                .form(&[
                    ("To", phone(1).as_str()),
                    ("From", "+15550001000"),
                    ("Body", "hi"),
                ])
                .send()
                .await
        }
    };
    r.map(|r| r.status().as_u16()).map_err(|e| format!("{e:?}"))
}

fn only_entry(w: &World) -> LedgerEntry {
    let e = w.entries();
    assert_eq!(e.len(), 1, "{e:?}");
    e[0].clone()
}

#[tokio::test]
async fn a_refuse_resets_the_connection_unread_and_nothing_is_sent() {
    for provider in [Provider::Line, Provider::Sms] {
        let (w, fates) = world_with_fates(1).await;
        fates.set(LinkFate::Refuse);
        let got = send(&w, &w.http, provider).await;
        assert!(got.is_err(), "{provider:?}: answered {got:?}");
        let e = only_entry(&w);
        assert_eq!(e.fault.as_deref(), Some("link_refuse"), "{e:?}");
        assert_eq!(
            (e.outcome, e.status.as_str()),
            (Outcome::Transient, "reset")
        );
        assert_eq!(e.message_id, None);
        // Nothing was committed: the same key is a new send once the link is back.
        fates.set(LinkFate::Pass);
        assert!(matches!(send(&w, &w.http, provider).await, Ok(200 | 201)));
        assert_eq!(w.entries()[1].outcome, Outcome::Accepted, "{provider:?}");
    }
}

#[tokio::test]
async fn a_reset_serves_the_send_then_cuts_the_answer() {
    for provider in [Provider::Line, Provider::Sms] {
        let (w, fates) = world_with_fates(2).await;
        fates.set(LinkFate::Reset);
        let got = send(&w, &w.http, provider).await;
        assert!(got.is_err(), "{provider:?}: answered {got:?}");
        let e = only_entry(&w);
        assert_eq!(e.fault.as_deref(), Some("link_reset"), "{e:?}");
        assert_eq!((e.outcome, e.status.as_str()), (Outcome::Accepted, "reset"));
        assert!(e.message_id.is_some(), "committed: {e:?}");
        // Committed: a LINE retry with the same key is a repeat; Twilio (idempotency off, as
        // by default) sends the retry as a second message.
        fates.set(LinkFate::Pass);
        let again = send(&w, &w.http, provider).await;
        assert!(matches!(again, Ok(409 | 201)), "{provider:?}: {again:?}");
        let want = match provider {
            Provider::Line => Outcome::IdempotentRepeat,
            _ => Outcome::Accepted,
        };
        assert_eq!(w.entries()[1].outcome, want, "{provider:?}");
    }
}

#[tokio::test]
async fn a_partition_holds_the_send_until_the_heal_then_serves_it() {
    for provider in [Provider::Line, Provider::Sms] {
        let (w, fates) = world_with_fates(3).await;
        let (partition, heal) = Partition::new();
        fates.set(LinkFate::Hold(heal));
        let client = {
            let w = w.clone();
            tokio::spawn(async move { send(&w, &w.http, provider).await })
        };
        until(10, || fates.asked() == 1).await;
        // Held: nothing recorded, no answer, for as long as the partition lasts.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(w.entries().is_empty() && !client.is_finished());
        partition.heal();
        let got = tokio::time::timeout(Duration::from_secs(10), client)
            .await
            .expect("served after the heal")
            .unwrap();
        assert!(matches!(got, Ok(200 | 201)), "{provider:?}: {got:?}");
        let e = only_entry(&w);
        assert_eq!((e.outcome, e.fault.as_deref()), (Outcome::Accepted, None));
        assert!(e.mono_ns >= e.received_ns + 200_000_000, "{e:?}");
    }
}

#[tokio::test]
async fn a_sender_hanging_up_on_a_partition_sent_nothing() {
    for provider in [Provider::Line, Provider::Sms] {
        let (w, fates) = world_with_fates(4).await;
        let (_partition, heal) = Partition::new();
        fates.set(LinkFate::Hold(heal));
        let got = send(&w, &impatient(), provider).await;
        assert!(got.is_err(), "{provider:?}: answered {got:?}");
        until(10, || !w.entries().is_empty()).await;
        let e = only_entry(&w);
        assert_eq!(e.fault.as_deref(), Some("link_partition"), "{e:?}");
        assert_eq!(
            (e.outcome, e.status.as_str(), e.client_hung_up),
            (Outcome::Transient, "no_answer", true)
        );
    }
}

#[tokio::test]
async fn a_delay_serves_the_send_late() {
    let (w, fates) = world_with_fates(5).await;
    fates.set(LinkFate::Delay(Duration::from_millis(250)));
    assert_eq!(send(&w, &w.http, Provider::Line).await, Ok(200));
    let e = only_entry(&w);
    assert_eq!((e.outcome, e.fault.as_deref()), (Outcome::Accepted, None));
    assert!(e.mono_ns >= e.received_ns + 250_000_000, "{e:?}");
}

/// One SMTP transaction for `to` up to its final dot: the reply line to the dot, or `None` when
/// the connection ended (reset or closed) without one, or none came within `wait`.
async fn smtp_send(w: &World, to: &str, wait: Duration) -> Option<String> {
    let addr = w.p.server_addrs()[2];
    let (r, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
    let mut r = BufReader::new(r);
    let mut read = String::new();
    r.read_line(&mut read).await.unwrap();
    for cmd in [
        "HELO me\r\n".to_string(),
        "MAIL FROM:<shop@example.com>\r\n".to_string(),
        format!("RCPT TO:<{to}>\r\n"),
        "DATA\r\n".to_string(),
    ] {
        wr.write_all(cmd.as_bytes()).await.unwrap();
        read.clear();
        r.read_line(&mut read).await.unwrap();
        assert!(
            read.starts_with('2') || read.starts_with('3'),
            "{cmd}: {read}"
        );
    }
    wr.write_all(b"Subject: hi\r\nMessage-ID: <m1@example.com>\r\n\r\nhello\r\n.\r\n")
        .await
        .unwrap();
    read.clear();
    match tokio::time::timeout(wait, r.read_line(&mut read)).await {
        Ok(Ok(n)) if n > 0 => Some(read),
        // Reset, closed, or nothing in time.
        _ => None,
    }
}

#[tokio::test]
async fn smtp_link_faults_act_at_the_final_dot() {
    let wait = Duration::from_secs(5);
    let (w, fates) = world_with_fates(6).await;
    fates.set(LinkFate::Refuse);
    assert_eq!(smtp_send(&w, "a@example.com", wait).await, None);
    let e = only_entry(&w);
    assert_eq!(
        (e.fault.as_deref(), e.outcome),
        (Some("link_refuse"), Outcome::Transient)
    );

    let (w, fates) = world_with_fates(7).await;
    fates.set(LinkFate::Reset);
    assert_eq!(smtp_send(&w, "b@example.com", wait).await, None);
    let e = only_entry(&w);
    assert_eq!(
        (e.fault.as_deref(), e.outcome, e.status.as_str()),
        (Some("link_reset"), Outcome::Accepted, "reset")
    );

    let (w, fates) = world_with_fates(8).await;
    let (partition, heal) = Partition::new();
    fates.set(LinkFate::Hold(heal));
    let client = {
        let w = w.clone();
        tokio::spawn(async move { smtp_send(&w, "c@example.com", wait).await })
    };
    until(10, || fates.asked() == 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(w.entries().is_empty() && !client.is_finished());
    partition.heal();
    let reply = client.await.unwrap();
    assert!(
        reply.as_deref().unwrap_or("").starts_with("250"),
        "{reply:?}"
    );
    assert_eq!(only_entry(&w).outcome, Outcome::Accepted);

    let (w, fates) = world_with_fates(9).await;
    let (_partition, heal) = Partition::new();
    fates.set(LinkFate::Hold(heal));
    assert_eq!(
        smtp_send(&w, "d@example.com", Duration::from_millis(300)).await,
        None
    );
    until(10, || !w.entries().is_empty()).await;
    let e = only_entry(&w);
    assert_eq!(
        (e.fault.as_deref(), e.status.as_str(), e.client_hung_up),
        (Some("link_partition"), "no_answer", true)
    );
}

#[tokio::test]
async fn an_smtp_link_refused_at_a_command_ends_before_any_of_the_message() {
    let (w, fates) = world_with_fates(10).await;
    fates
        .refuse_commands
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let addr = w.p.server_addrs()[2];
    let (r, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
    let mut r = BufReader::new(r);
    let mut read = String::new();
    r.read_line(&mut read).await.unwrap();
    assert!(read.starts_with("220"), "{read}");
    wr.write_all(b"HELO me\r\n").await.unwrap();
    read.clear();
    let got = tokio::time::timeout(Duration::from_secs(5), r.read_line(&mut read))
        .await
        .expect("the fake acts at once");
    assert!(
        got.is_err() || got.as_ref().is_ok_and(|n| *n == 0),
        "the command was answered: {read:?}"
    );
    assert!(w.entries().is_empty(), "no message, no entry");
    // The link back: the next connection is served.
    fates
        .refuse_commands
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let reply = smtp_send(&w, "e@example.com", Duration::from_secs(5)).await;
    assert!(
        reply.as_deref().unwrap_or("").starts_with("250"),
        "{reply:?}"
    );
}
