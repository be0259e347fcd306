//! E-mail over plain SMTP with lettre's pooled async transport. The MIME message is built from
//! the stored parts with a deterministic Message-ID, Date and boundary, so every attempt of a
//! delivery sends the same bytes.
//!
//! SMTP has no idempotency key: an error after DATA may hide a committed message, so anything
//! but a clear reply code (or a refused connection) is [`Outcome::Unknown`]. This module must
//! never resend on its own.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use lettre::message::header::ContentType;
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::PoolConfig;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::{class, Outcome};
use crate::claim::Claimed;
use crate::config::Config;

#[derive(Clone)]
pub struct EmailClient {
    smtp: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    events_url: String,
}

impl EmailClient {
    pub fn new(cfg: Arc<Config>) -> anyhow::Result<EmailClient> {
        let (host, port) = cfg
            .smtp_addr
            .rsplit_once(':')
            .context("TING_SMTP_ADDR must be host:port")?;
        let port: u16 = port.parse().context("TING_SMTP_ADDR port")?;
        let smtp = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
            .port(port)
            .timeout(Some(cfg.provider_timeout))
            .pool_config(PoolConfig::new().max_size(cfg.channel_concurrency.max(1) as u32))
            .build();
        let from: Mailbox = cfg
            .email_from
            .parse()
            .context("TING_EMAIL_FROM is not an address")?;
        Ok(EmailClient {
            smtp,
            from,
            events_url: format!("http://{}/v1/callbacks/email", cfg.api_addr),
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

    pub async fn send(&self, d: &Claimed) -> Outcome {
        let msg = match self.message(d) {
            Ok(m) => m,
            Err(e) => {
                return Outcome::Permanent {
                    error: format!("{e:#}"),
                }
            }
        };
        match self.smtp.send(msg).await {
            Ok(resp) if resp.is_positive() => Outcome::Accepted {
                provider_id: Some(d.correlation_id.clone()),
                done: false,
            },
            Ok(resp) => Outcome::Unknown {
                error: format!("unexpected reply {}", resp.code()),
            },
            Err(e) => classify(&e),
        }
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
