//! Test world for the fake SMTP server: a server on 127.0.0.1:0 with its own ledger, and a raw
//! TCP client that reads whole SMTP replies with deadlines (never sleeps to synchronise).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use mock_providers::config::SmtpConfig;
use mock_providers::ledger::{Ledger, LedgerEntry, Provider};
use mock_providers::smtp::{self, Limits, SmtpContext};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const DEADLINE: Duration = Duration::from_secs(10);

pub struct World {
    pub addr: SocketAddr,
    pub ledger: Ledger,
    pub config: Arc<RwLock<SmtpConfig>>,
    /// Entries passed to `on_commit`, in call order.
    pub commits: Arc<Mutex<Vec<LedgerEntry>>>,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

pub async fn spawn(seed: u64, cfg: SmtpConfig) -> World {
    spawn_with(seed, cfg, Limits::default()).await
}

pub async fn spawn_with(seed: u64, cfg: SmtpConfig, limits: Limits) -> World {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ledger = Ledger::new();
    let config = Arc::new(RwLock::new(cfg));
    let commits = Arc::new(Mutex::new(Vec::new()));
    let sink = commits.clone();
    let ctx = SmtpContext {
        seed,
        config: config.clone(),
        ledger: ledger.clone(),
        on_commit: Arc::new(move |e: &LedgerEntry| sink.lock().unwrap().push(e.clone())),
        on_outage: Arc::new(|| {}),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(smtp::serve(listener, ctx, limits, async move {
        let _ = stopped.await;
    }));
    World {
        addr,
        ledger,
        config,
        commits,
        stop: Some(stop),
        server: Some(server),
    }
}

impl World {
    pub async fn client(&self) -> Client {
        Client::connect(self.addr).await
    }

    /// SMTP send entries, without protocol errors.
    pub fn sends(&self) -> Vec<LedgerEntry> {
        self.ledger
            .snapshot()
            .into_iter()
            .filter(|e| {
                e.provider == Provider::Smtp
                    && e.outcome != mock_providers::ledger::Outcome::ProtocolError
            })
            .collect()
    }

    /// Waits until the ledger satisfies `pred`, or panics at the deadline.
    pub async fn wait_ledger(
        &self,
        what: &str,
        pred: impl Fn(&[LedgerEntry]) -> bool,
    ) -> Vec<LedgerEntry> {
        let start = tokio::time::Instant::now();
        loop {
            let snap = self.ledger.snapshot();
            if pred(&snap) {
                return snap;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "timed out waiting for {what}; ledger: {snap:#?}"
            );
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Stops the server and waits for it to return.
    pub async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let server = self.server.take().unwrap();
        tokio::time::timeout(DEADLINE, server)
            .await
            .expect("server did not stop")
            .unwrap()
            .unwrap();
    }
}

pub struct Client {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    pub greeting: String,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (r, w) = stream.into_split();
        let mut c = Client {
            reader: BufReader::new(r),
            writer: w,
            greeting: String::new(),
        };
        c.greeting = c.reply().await;
        c
    }

    pub async fn send(&mut self, raw: impl AsRef<[u8]>) {
        self.writer.write_all(raw.as_ref()).await.unwrap();
    }

    /// Reads one complete (possibly multi-line) reply; panics on EOF or at the deadline.
    pub async fn reply(&mut self) -> String {
        self.try_reply()
            .await
            .expect("connection closed instead of a reply")
    }

    /// One reply, or `None` if the server closed the connection first.
    pub async fn try_reply(&mut self) -> Option<String> {
        tokio::time::timeout(DEADLINE, self.read_reply())
            .await
            .expect("no reply before deadline")
    }

    async fn read_reply(&mut self) -> Option<String> {
        let mut out = String::new();
        loop {
            let mut line = String::new();
            match self.reader.read_line(&mut line).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
            assert!(line.ends_with("\r\n"), "reply line without CRLF: {line:?}");
            out.push_str(&line);
            if line.as_bytes().get(3) != Some(&b'-') {
                return Some(out);
            }
        }
    }

    /// Sends one command line and returns its reply.
    pub async fn cmd(&mut self, line: &str) -> String {
        self.send(format!("{line}\r\n")).await;
        self.reply().await
    }

    /// Waits for the server to close; returns whatever it wrote before that.
    pub async fn until_closed(&mut self) -> String {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(DEADLINE, self.reader.read_to_end(&mut rest)).await;
        read.expect("connection not closed before deadline").ok();
        String::from_utf8_lossy(&rest).into_owned()
    }

    /// EHLO, MAIL, each RCPT, and DATA with `message` (dot-stuffed here) if DATA gets 354.
    /// Returns every reply after EHLO, in order.
    pub async fn transaction(&mut self, from: &str, rcpts: &[&str], message: &str) -> Vec<String> {
        let mut replies = vec![self.cmd("EHLO client.test").await];
        replies.push(self.cmd(&format!("MAIL FROM:<{from}>")).await);
        if !replies[1].starts_with("250") {
            return replies;
        }
        for r in rcpts {
            replies.push(self.cmd(&format!("RCPT TO:<{r}>")).await);
        }
        let Some(data) = self.try_cmd("DATA").await else {
            return replies;
        };
        let ok = data.starts_with("354");
        replies.push(data);
        if ok {
            self.send(stuff(message)).await;
            match self.try_reply().await {
                Some(r) => replies.push(r),
                None => replies.push("<closed>".into()),
            }
        }
        replies
    }

    pub async fn try_cmd(&mut self, line: &str) -> Option<String> {
        self.send(format!("{line}\r\n")).await;
        self.try_reply().await
    }
}

/// Dot-stuffs `message` (LF or CRLF lines) and appends the terminating `.`.
pub fn stuff(message: &str) -> String {
    let mut out = String::new();
    for line in message.lines() {
        if line.starts_with('.') {
            out.push('.');
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(".\r\n");
    out
}

/// A minimal single-part message.
pub fn simple_message(id: &str, subject: &str, body: &str) -> String {
    format!("Message-ID: <{id}>\r\nSubject: {subject}\r\nFrom: shop@x.test\r\nTo: r@x.test\r\n\r\n{body}\r\n")
}

/// The `X-Events-Url` header for lettre: where the fake posts this message's delivery events.
#[derive(Clone)]
pub struct XEventsUrl(pub String);

impl lettre::message::header::Header for XEventsUrl {
    fn name() -> lettre::message::header::HeaderName {
        lettre::message::header::HeaderName::new_from_ascii_str("X-Events-Url")
    }
    fn parse(s: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(XEventsUrl(s.to_string()))
    }
    fn display(&self) -> lettre::message::header::HeaderValue {
        lettre::message::header::HeaderValue::new(Self::name(), self.0.clone())
    }
}
