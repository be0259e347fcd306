//! Capacity benchmark of the fakes on loopback: LINE and SMS requests/s with keep-alive, SMTP
//! messages/s, each beside a plain echo server measured the same way in the same run (the
//! ceiling: what this machine and client can do with no provider logic at all).
//!
//! This is a command that prints figures, not a test; it asserts nothing. It must never be
//! pointed at anything but loopback servers it started itself.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::config::ProvidersConfig;
use crate::ledger::Ledger;

/// Concurrent keep-alive connections per measurement.
pub const CONNECTIONS: usize = 8;

/// One measured target beside its ceiling.
#[derive(Clone, Debug)]
pub struct BenchRow {
    pub name: &'static str,
    pub unit: &'static str,
    pub per_sec: f64,
    pub errors: u64,
    pub ceiling_name: &'static str,
    pub ceiling_per_sec: f64,
    /// Process CPU time (client + server) per operation, in microseconds, when measurable: less
    /// sensitive than the rates to other load on the machine.
    pub cpu_us: Option<f64>,
    pub ceiling_cpu_us: Option<f64>,
}

impl BenchRow {
    /// `per_sec` as a share of the ceiling.
    pub fn share(&self) -> f64 {
        if self.ceiling_per_sec > 0.0 {
            self.per_sec / self.ceiling_per_sec
        } else {
            0.0
        }
    }
}

#[derive(Clone, Debug)]
pub struct BenchReport {
    pub duration: Duration,
    pub connections: usize,
    pub cores: usize,
    pub rows: Vec<BenchRow>,
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fake provider capacity on loopback ({} keep-alive connections, {:?} per target, {} cores)",
            self.connections, self.duration, self.cores
        )?;
        writeln!(
            f,
            "{:<6} {:>12} {:>7} {:>9}   {:<16} {:>12} {:>9} {:>6}",
            "fake", "rate", "errors", "cpu/op", "ceiling", "rate", "cpu/op", "share"
        )?;
        let us = |v: Option<f64>| v.map(|v| format!("{v:.1}us")).unwrap_or_else(|| "-".into());
        for r in &self.rows {
            writeln!(
                f,
                "{:<6} {:>8.0} {:<3} {:>7} {:>9}   {:<16} {:>8.0} {:<3} {:>9} {:>5.0}%",
                r.name,
                r.per_sec,
                r.unit,
                r.errors,
                us(r.cpu_us),
                r.ceiling_name,
                r.ceiling_per_sec,
                r.unit,
                us(r.ceiling_cpu_us),
                r.share() * 100.0
            )?;
        }
        Ok(())
    }
}

/// Measures each fake for `duration`, and its ceiling for as long.
pub async fn capacity(duration: Duration) -> anyhow::Result<BenchReport> {
    let loopback = Ipv4Addr::LOCALHOST.into();
    let mut cfg = ProvidersConfig::default();
    cfg.sms.callbacks.enabled = false;
    let echo = spawn_echo().await?;
    let null_smtp = spawn_null_smtp().await?;
    let mut rows = Vec::new();

    let p = crate::start(1, cfg.clone(), loopback, Ledger::new()).await?;
    let line = measured(http_load(p.line_addr, duration, line_request(&cfg))).await?;
    p.shutdown().await;
    let line_ceiling = measured(http_load(echo, duration, line_request(&cfg))).await?;
    rows.push(row(
        "line",
        "r/s",
        line,
        "hyper echo",
        line_ceiling,
        duration,
    ));

    let p = crate::start(1, cfg.clone(), loopback, Ledger::new()).await?;
    let sms = measured(http_load(p.sms_addr, duration, sms_request(&cfg))).await?;
    p.shutdown().await;
    let sms_ceiling = measured(http_load(echo, duration, sms_request(&cfg))).await?;
    rows.push(row("sms", "r/s", sms, "hyper echo", sms_ceiling, duration));

    let p = crate::start(1, cfg.clone(), loopback, Ledger::new()).await?;
    let smtp = measured(smtp_load(p.smtp_addr, duration)).await?;
    p.shutdown().await;
    let smtp_ceiling = measured(smtp_load(null_smtp, duration)).await?;
    rows.push(row(
        "smtp",
        "m/s",
        smtp,
        "null tokio smtp",
        smtp_ceiling,
        duration,
    ));

    Ok(BenchReport {
        duration,
        connections: CONNECTIONS,
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        rows,
    })
}

fn row(
    name: &'static str,
    unit: &'static str,
    got: Measured,
    ceiling_name: &'static str,
    ceiling: Measured,
    d: Duration,
) -> BenchRow {
    let cpu_us = |m: &Measured| {
        m.cpu
            .filter(|_| m.ok > 0)
            .map(|c| c.as_secs_f64() * 1e6 / m.ok as f64)
    };
    BenchRow {
        name,
        unit,
        per_sec: got.ok as f64 / d.as_secs_f64(),
        errors: got.bad,
        ceiling_name,
        ceiling_per_sec: ceiling.ok as f64 / d.as_secs_f64(),
        cpu_us: cpu_us(&got),
        ceiling_cpu_us: cpu_us(&ceiling),
    }
}

/// One measurement: successes, failures, and the process CPU time it took.
struct Measured {
    ok: u64,
    bad: u64,
    cpu: Option<Duration>,
}

/// User + system CPU time of this process so far, from `/proc/self/stat` (Linux; assumes the
/// usual 100 clock ticks per second).
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// Runs `load`, timing the process CPU it uses.
async fn measured(
    load: impl std::future::Future<Output = anyhow::Result<(u64, u64)>>,
) -> anyhow::Result<Measured> {
    let before = process_cpu();
    let (ok, bad) = load.await?;
    let cpu = before.zip(process_cpu()).map(|(a, b)| b.saturating_sub(a));
    Ok(Measured { ok, bad, cpu })
}

/// Builds the `i`-th request of one connection.
type MakeRequest = Arc<dyn Fn(usize, u64) -> Request<Full<Bytes>> + Send + Sync>;

fn line_request(cfg: &ProvidersConfig) -> MakeRequest {
    let auth = format!("Bearer {}", cfg.line.channel_token);
    Arc::new(move |conn, i| {
        let to = format!("U{:032x}", (conn as u128) << 64 | u128::from(i % 1000));
        let body = format!(
            r#"{{"to":"{to}","messages":[{{"type":"text","text":"Order A-{i} received"}}]}}"#
        );
        Request::post("/v2/bot/message/push")
            .header("host", "localhost")
            .header("authorization", &auth)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("static request is valid")
    })
}

fn sms_request(cfg: &ProvidersConfig) -> MakeRequest {
    let c = &cfg.sms;
    let auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", c.account_sid, c.auth_token))
    );
    let path = format!("/2010-04-01/Accounts/{}/Messages.json", c.account_sid);
    Arc::new(move |conn, i| {
        let body = format!(
            "To=%2B1555{conn:02}{:05}&From=%2B15550009999&Body=Order+A-{i}+received",
            i % 1000
        );
        Request::post(path.as_str())
            .header("host", "localhost")
            .header("authorization", &auth)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Full::new(Bytes::from(body)))
            .expect("static request is valid")
    })
}

/// Drives `CONNECTIONS` keep-alive HTTP/1.1 connections for `d`; returns (2xx answers, others).
async fn http_load(addr: SocketAddr, d: Duration, make: MakeRequest) -> anyhow::Result<(u64, u64)> {
    let ok = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + d;
    let mut tasks = Vec::new();
    for conn in 0..CONNECTIONS {
        let stream = TcpStream::connect(addr)
            .await
            .context("connecting the bench client")?;
        stream.set_nodelay(true)?;
        let (mut send, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let (ok, bad, make) = (ok.clone(), bad.clone(), make.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let resp = match send.send_request(make(conn, i)).await {
                    Ok(r) => r,
                    Err(_) => {
                        bad.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                };
                let success = resp.status().is_success();
                let _ = resp.into_body().collect().await;
                if success { &ok } else { &bad }.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    Ok((ok.load(Ordering::Relaxed), bad.load(Ordering::Relaxed)))
}

/// A plain hyper server that answers every request with its own body.
async fn spawn_echo() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                        let body = req.into_body().collect().await?.to_bytes();
                        Ok::<_, hyper::Error>(Response::new(Full::new(body)))
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// A tokio server that speaks just enough SMTP to accept anything: the SMTP ceiling.
async fn spawn_null_smtp() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                let mut r = BufReader::new(r);
                let mut line = String::new();
                let mut in_data = false;
                if w.write_all(b"220 null ESMTP\r\n").await.is_err() {
                    return;
                }
                loop {
                    line.clear();
                    if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let reply: &[u8] = if in_data {
                        if line != ".\r\n" {
                            continue;
                        }
                        in_data = false;
                        b"250 2.0.0 queued\r\n"
                    } else {
                        match line.get(..4).map(|v| v.to_ascii_uppercase()).as_deref() {
                            Some("DATA") => {
                                in_data = true;
                                b"354 go ahead\r\n"
                            }
                            Some("QUIT") => b"221 bye\r\n",
                            _ => b"250 ok\r\n",
                        }
                    };
                    if w.write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// Sends messages with lettre from `CONNECTIONS` keep-alive connections for `d`; returns
/// (accepted, failed). Each connection is lettre's own SMTP client on a socket opened here with
/// TCP_NODELAY: lettre's pooled transport writes the body and the final dot separately without
/// it, so Nagle and delayed ACKs cap it near 25 messages/s per connection whatever the server.
async fn smtp_load(addr: SocketAddr, d: Duration) -> anyhow::Result<(u64, u64)> {
    use lettre::transport::smtp::client::AsyncSmtpConnection;
    use lettre::transport::smtp::extension::ClientId;
    use lettre::Message;
    let ok = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + d;
    let mut tasks = Vec::new();
    for conn in 0..CONNECTIONS {
        let stream = TcpStream::connect(addr)
            .await
            .context("connecting the smtp bench client")?;
        stream.set_nodelay(true)?;
        let mut client = AsyncSmtpConnection::connect_with_transport(
            Box::new(stream),
            &ClientId::Domain("bench.test".into()),
        )
        .await
        .context("smtp greeting and EHLO")?;
        let (ok, bad) = (ok.clone(), bad.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let msg = Message::builder()
                    .from("bench@example.test".parse().expect("static address"))
                    .to(format!("r{conn}-{}@example.test", i % 1000)
                        .parse()
                        .expect("valid address"))
                    .message_id(Some(format!("<b{conn}-{i}@bench.test>")))
                    .subject("Order received")
                    .body(format!("Order A-{i} received"))
                    .expect("static message builds");
                match client.send(msg.envelope(), &msg.formatted()).await {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(_) => {
                        bad.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                };
            }
            let _ = client.quit().await;
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    Ok((ok.load(Ordering::Relaxed), bad.load(Ordering::Relaxed)))
}
