//! E-mail over plain SMTP with lettre's async connections, pooled here. The MIME message is built
//! from the stored parts with a deterministic Message-ID, Date and boundary, so every attempt of a
//! delivery sends the same bytes.
//!
//! SMTP has no idempotency key: an error after the message body went out may hide a committed
//! message, so anything but a clear reply code to the final dot is [`Outcome::Unknown`]. To keep
//! that window as small as the protocol allows, a connection is made ready
//! ([`EmailClient::checkout`]: connected, greeted, EHLO done) *before* the worker records the
//! attempt start; the transaction then runs step by step, and `MAIL`, `RCPT` and `DATA` failing
//! (a reply code, a broken connection, a timeout) commit nothing: a plain retry. Only once `DATA`
//! is answered 354 does the caller's `before_body` record, durably and fenced, that the body is
//! going out; a crash before that mark leaves nothing uncertain either. This module must never
//! resend on its own.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use lettre::address::Envelope;
use lettre::message::header::ContentType;
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::client::AsyncSmtpConnection;
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::Message;

use super::{class, Channel, Outcome};
use crate::claim::Claimed;
use crate::config::Config;

#[derive(Clone)]
pub struct EmailClient {
    addr: String,
    timeout: Duration,
    /// Idle connections, ready for the next transaction.
    idle: Arc<Mutex<Vec<AsyncSmtpConnection>>>,
    max_idle: usize,
    from: Mailbox,
    events_url: String,
    /// The `subject-header-injection` flaw: write the stored subject into the header raw.
    raw_subject: bool,
    /// The `unknown-before-body` flaw: a failure before the body went out is held `unknown`.
    unknown_before_body: bool,
}

/// A connection made ready for one transaction.
pub struct Checkout(AsyncSmtpConnection);

impl EmailClient {
    pub fn new(cfg: Arc<Config>) -> anyhow::Result<EmailClient> {
        let (host, port) = cfg
            .smtp_addr
            .rsplit_once(':')
            .context("TING_SMTP_ADDR must be host:port")?;
        let port: u16 = port.parse().context("TING_SMTP_ADDR port")?;
        let from: Mailbox = cfg
            .email_from
            .parse()
            .context("TING_EMAIL_FROM is not an address")?;
        Ok(EmailClient {
            addr: format!("{host}:{port}"),
            timeout: cfg.provider_timeout,
            idle: Arc::default(),
            max_idle: cfg.channel_limit(Channel::Email),
            from,
            events_url: format!("http://{}/v1/callbacks/email", cfg.api_addr),
            raw_subject: cfg.flaws.has(crate::config::Flaw::SubjectHeaderInjection),
            unknown_before_body: cfg.flaws.has(crate::config::Flaw::UnknownBeforeBody),
        })
    }

    /// The exact message every attempt of `d` sends.
    pub fn message(&self, d: &Claimed) -> anyhow::Result<Message> {
        let to: Mailbox = d.address.parse().context("recipient address")?;
        let created: SystemTime = d.created_at.into();
        let b = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(d.payload.subject.clone().unwrap_or_default())
            .message_id(Some(d.correlation_id.clone()))
            .date(created)
            .header(EventsUrl(self.events_url.clone()));
        let msg = match &d.payload.html {
            Some(html) => b.multipart(
                MultiPart::alternative()
                    .boundary(format!("ting-{}", &d.payload_sha256[..32]))
                    .singlepart(SinglePart::plain(d.payload.text.clone()))
                    .singlepart(SinglePart::html(html.clone())),
            )?,
            None => b
                .header(ContentType::TEXT_PLAIN)
                .body(d.payload.text.clone())?,
        };
        Ok(msg)
    }

    /// A connection ready for a transaction: an idle one that still answers NOOP, or a new one.
    /// An error here means nothing was said about any message: always safe to retry.
    pub async fn checkout(&self) -> Result<Checkout, Outcome> {
        loop {
            let idle = self.idle.lock().map(|mut v| v.pop()).unwrap_or(None);
            let Some(mut conn) = idle else { break };
            if tokio::time::timeout(self.timeout, conn.test_connected()).await == Ok(true) {
                return Ok(Checkout(conn));
            }
        }
        let retry = |error: String| Outcome::Retry {
            class: class::TRANSIENT,
            error,
            retry_after: None::<Duration>,
        };
        let connect = async {
            let stream = tokio::net::TcpStream::connect(&self.addr).await?;
            // lettre writes the body and the final dot separately: without NODELAY each message
            // waits out the peer's delayed ACK.
            stream.set_nodelay(true)?;
            Ok::<_, std::io::Error>(stream)
        };
        let stream = match tokio::time::timeout(self.timeout, connect).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(retry(format!("connecting to {}: {e}", self.addr))),
            Err(_) => return Err(retry(format!("connecting to {}: timed out", self.addr))),
        };
        let hello = ClientId::Domain("ting-stack.invalid".into());
        match tokio::time::timeout(
            self.timeout,
            AsyncSmtpConnection::connect_with_transport(Box::new(stream), &hello),
        )
        .await
        {
            Ok(Ok(conn)) => Ok(Checkout(conn)),
            Ok(Err(e)) if e.is_permanent() => Err(Outcome::Retry {
                class: class::TRANSIENT,
                error: format!("greeting refused: {e}"),
                retry_after: None,
            }),
            Ok(Err(e)) => Err(retry(format!("greeting: {e}"))),
            Err(_) => Err(retry("greeting: timed out".into())),
        }
    }

    /// Runs one transaction for `d` on a ready connection. `before_body` runs once `DATA` is
    /// answered, before a byte of the body is written: it records that the body is going out and
    /// says whether the attempt may go on (`false`: the lease is no longer ours; nothing is sent).
    pub async fn send(
        &self,
        d: &Claimed,
        conn: Checkout,
        before_body: impl std::future::Future<Output = bool>,
    ) -> Outcome {
        let mut conn = conn.0;
        let msg = match self.message(d) {
            Ok(m) => m,
            Err(e) => {
                return Outcome::Permanent {
                    error: format!("{e:#}"),
                }
            }
        };
        let mut bytes = msg.formatted();
        if self.raw_subject {
            // FLAW subject-header-injection: the subject as stored, line breaks and all, written
            // over the encoded one, as a stack that builds its headers by string concatenation.
            bytes = raw_subject(&bytes, d.payload.subject.as_deref().unwrap_or_default());
        }
        let opened =
            tokio::time::timeout(self.timeout, open_data(&mut conn, msg.envelope(), &bytes));
        let refused = match opened.await {
            Ok(Ok(())) => None,
            Ok(Err(e)) if e.is_permanent() => Some(Outcome::Permanent {
                error: e.to_string(),
            }),
            // FLAW unknown-before-body: every failure treated as a possibly sent message.
            Ok(Err(e)) if self.unknown_before_body => Some(Outcome::Unknown {
                error: e.to_string(),
            }),
            Ok(Err(e)) => Some(before_body_retry(e.to_string())),
            Err(_) => Some(before_body_retry(
                "timed out before the message body".into(),
            )),
        };
        // On the way out before the body, the connection is dropped, never QUIT: the server may
        // be hung, or waiting for the body after its 354 (where QUIT would be read as text).
        // Closing the socket there discards the transaction.
        if let Some(outcome) = refused {
            return outcome;
        }
        if !before_body.await {
            return before_body_retry("the lease is no longer ours; body not sent".into());
        }
        let sent = tokio::time::timeout(self.timeout, conn.message(&bytes)).await;
        let outcome = match sent {
            Ok(Ok(resp)) if resp.is_positive() => Outcome::Accepted {
                provider_id: Some(d.correlation_id.clone()),
                done: false,
            },
            Ok(Ok(resp)) => Outcome::Unknown {
                error: format!("unexpected reply {}", resp.code()),
            },
            Ok(Err(e)) => classify(&e),
            Err(_) => Outcome::Unknown {
                error: "timed out after sending the message body".into(),
            },
        };
        // A connection is reused only after a clean reply: anything else may have left it
        // mid-transaction.
        let clean = matches!(
            outcome,
            Outcome::Accepted { .. } | Outcome::Permanent { .. } | Outcome::Retry { .. }
        );
        if clean && !conn.has_broken() {
            if let Ok(mut idle) = self.idle.lock() {
                if idle.len() < self.max_idle {
                    idle.push(conn);
                }
            }
        }
        outcome
    }
}

/// `MAIL`, `RCPT` for every recipient, `DATA`: the transaction up to the server's 354, with the
/// parameters lettre's own `send` would give (`SMTPUTF8`, `8BITMIME`). Nothing is committed yet.
async fn open_data(
    conn: &mut AsyncSmtpConnection,
    envelope: &Envelope,
    body: &[u8],
) -> Result<(), lettre::transport::smtp::Error> {
    let mut params = Vec::new();
    let non_ascii = envelope
        .from()
        .into_iter()
        .chain(envelope.to())
        .any(|a: &lettre::Address| !a.to_string().is_ascii());
    if non_ascii && conn.server_info().supports_feature(Extension::SmtpUtfEight) {
        params.push(MailParameter::SmtpUtfEight);
    }
    if !body.is_ascii() && conn.server_info().supports_feature(Extension::EightBitMime) {
        params.push(MailParameter::Body(MailBodyParameter::EightBitMime));
    }
    conn.command(Mail::new(envelope.from().cloned(), params))
        .await?;
    for to in envelope.to() {
        conn.command(Rcpt::new(to.clone(), vec![])).await?;
    }
    conn.command(Data).await?;
    Ok(())
}

/// A failure before the body went out: nothing was committed, so a plain transient retry.
fn before_body_retry(error: String) -> Outcome {
    Outcome::Retry {
        class: class::TRANSIENT,
        error,
        retry_after: None,
    }
}

fn classify(e: &lettre::transport::smtp::Error) -> Outcome {
    let text = e.to_string();
    if e.is_permanent() {
        return Outcome::Permanent { error: text };
    }
    if e.is_transient() || refused(e) {
        return Outcome::Retry {
            class: class::TRANSIENT,
            error: text,
            retry_after: None::<Duration>,
        };
    }
    Outcome::Unknown { error: text }
}

/// A refused connection means nothing was said, let alone committed.
fn refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// `X-Events-Url`: where the provider should post this message's delivery events.
#[derive(Clone)]
struct EventsUrl(String);

impl lettre::message::header::Header for EventsUrl {
    fn name() -> lettre::message::header::HeaderName {
        lettre::message::header::HeaderName::new_from_ascii_str("X-Events-Url")
    }
    fn parse(s: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(EventsUrl(s.to_string()))
    }
    fn display(&self) -> lettre::message::header::HeaderValue {
        lettre::message::header::HeaderValue::new(Self::name(), self.0.clone())
    }
}

/// `message` with its `Subject` field (and any continuation lines) replaced by `Subject: {subject}`
/// written raw: the `subject-header-injection` flaw.
fn raw_subject(message: &[u8], subject: &str) -> Vec<u8> {
    let text = String::from_utf8_lossy(message);
    let mut out = String::with_capacity(text.len() + subject.len());
    let mut in_subject = false;
    let mut headers_done = false;
    for line in text.split_inclusive("\r\n") {
        if headers_done {
            out.push_str(line);
            continue;
        }
        if line == "\r\n" {
            headers_done = true;
        } else if in_subject && line.starts_with([' ', '\t']) {
            continue;
        } else if line.to_ascii_lowercase().starts_with("subject:") {
            in_subject = true;
            out.push_str(&format!("Subject: {subject}\r\n"));
            continue;
        }
        in_subject = false;
        out.push_str(line);
    }
    out.into_bytes()
}

#[cfg(test)]
mod flaw_tests {
    #[test]
    fn raw_subject_replaces_the_folded_field_and_injects_what_it_is_given() {
        let msg = b"From: a@x\r\nSubject: =?utf-8?b?QQ==?=\r\n =?utf-8?b?Qg==?=\r\nTo: b@x\r\n\r\nSubject: body\r\n";
        let out = super::raw_subject(msg, "Hi Ana\r\nBcc: evil@x");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "From: a@x\r\nSubject: Hi Ana\r\nBcc: evil@x\r\nTo: b@x\r\n\r\nSubject: body\r\n"
        );
    }
}
