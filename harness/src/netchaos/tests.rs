//! The proxy against an echo server: bytes pass, a partition holds them until the heal (none
//! lost), a reset is an RST to the client, latency and the bandwidth cap delay what they should.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

const WITHIN: Duration = Duration::from_secs(20);

/// An echo server on port 0; its address.
async fn echo() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

async fn proxied() -> (Links, TcpStream, Arc<Link>) {
    let up = echo().await;
    let links = Links::new(&format!("postgres://u@{up}/db?sslmode=disable"), 7).unwrap();
    let url = links.url_for(LinkOwner::Worker(2)).await.unwrap();
    let parsed = reqwest::Url::parse(&url).unwrap();
    assert_eq!(parsed.path(), "/db");
    assert_eq!(parsed.query(), Some("sslmode=disable"));
    assert_ne!(parsed.port(), Some(up.port()), "{url} names the proxy");
    let again = links.url_for(LinkOwner::Worker(2)).await.unwrap();
    assert_eq!(url, again, "a slot keeps its proxy");
    let addr = format!("{}:{}", parsed.host_str().unwrap(), parsed.port().unwrap());
    let c = TcpStream::connect(addr).await.unwrap();
    let link = links.link(LinkOwner::Worker(2)).unwrap();
    wait_until(|| link.counters().open == 1).await;
    (links, c, link)
}

async fn wait_until(cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WITHIN;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "condition not met within {WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn round_trip(c: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
    c.write_all(msg).await.unwrap();
    let mut got = vec![0; msg.len()];
    tokio::time::timeout(WITHIN, c.read_exact(&mut got))
        .await
        .expect("echo within the deadline")
        .unwrap();
    got
}

#[tokio::test]
async fn bytes_pass_when_no_fault_is_on() {
    let (_links, mut c, link) = proxied().await;
    assert_eq!(round_trip(&mut c, b"SELECT 1").await, b"SELECT 1");
    let n = link.counters();
    assert_eq!((n.accepted, n.held, n.delayed, n.reset), (1, 0, 0, 0));
}

#[tokio::test]
async fn a_partition_holds_bytes_until_the_heal_and_loses_none() {
    let (_links, mut c, link) = proxied().await;
    link.set(|f| f.partitioned = true);
    c.write_all(b"held back").await.unwrap();
    wait_until(|| link.counters().held == 9).await;
    let mut buf = [0u8; 9];
    let early = tokio::time::timeout(Duration::from_millis(200), c.read_exact(&mut buf)).await;
    assert!(early.is_err(), "nothing passes a partition");
    assert_eq!(link.counters().open, 1, "the connection stays open");
    link.set(|f| f.partitioned = false);
    tokio::time::timeout(WITHIN, c.read_exact(&mut buf))
        .await
        .expect("the held bytes flow after the heal")
        .unwrap();
    assert_eq!(&buf, b"held back");
}

#[tokio::test]
async fn a_reset_is_an_rst_to_every_open_connection() {
    let (links, mut c, link) = proxied().await;
    assert_eq!(link.reset_all(), 1);
    let mut buf = [0u8; 1];
    let r = tokio::time::timeout(WITHIN, c.read(&mut buf))
        .await
        .unwrap();
    let e = r.expect_err("a reset connection errors, it does not end cleanly");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    wait_until(|| link.counters().open == 0).await;
    assert_eq!(link.counters().reset, 1);
    assert_eq!(link.reset_all(), 0, "nothing left to reset");
    // The link still takes new connections.
    let url = reqwest::Url::parse(&links.url_for(LinkOwner::Worker(2)).await.unwrap()).unwrap();
    let mut c = TcpStream::connect(("127.0.0.1", url.port().unwrap()))
        .await
        .unwrap();
    assert_eq!(round_trip(&mut c, b"again").await, b"again");
}

#[tokio::test]
async fn latency_delays_each_way() {
    let (_links, mut c, link) = proxied().await;
    let base = Duration::from_millis(60);
    link.set(|f| {
        f.latency = Some(Latency {
            base,
            jitter: Duration::from_millis(10),
        })
    });
    let t = Instant::now();
    round_trip(&mut c, b"slow").await;
    assert!(t.elapsed() >= base * 2, "{:?}", t.elapsed());
    assert_eq!(link.counters().delayed, 8, "4 bytes up, 4 down");
}

#[tokio::test]
async fn the_bandwidth_cap_paces_bytes() {
    let (_links, mut c, link) = proxied().await;
    link.set(|f| f.bandwidth = Some(10_000));
    let t = Instant::now();
    round_trip(&mut c, &[7u8; 5_000]).await;
    // 5 000 bytes at 10 000 B/s: at least 0.5 s up, however the chunks fall.
    assert!(
        t.elapsed() >= Duration::from_millis(450),
        "{:?}",
        t.elapsed()
    );
    assert!(link.counters().delayed > 0);
}

#[test]
fn a_unix_socket_url_is_refused_clearly() {
    let e = Links::new("postgres:///db?host=/var/run/postgresql", 1)
        .err()
        .unwrap();
    assert!(e.to_string().contains("TCP database URL"), "{e}");
    assert!(Links::new("postgres://u@localhost/db", 1).is_ok());
}
