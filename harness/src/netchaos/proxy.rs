//! The TCP proxy on one process's database link: a listener on 127.0.0.1:0 whose every
//! connection is forwarded to the run's PostgreSQL through a [`Link`]'s faults. A `reset` ends
//! each open connection with SO_LINGER 0 then close, so both peers see RST, not a clean FIN.
//!
//! It never parses the PostgreSQL protocol (TLS passes through) and never decides a fault
//! itself: chaos steps set them on the link.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};

use super::link::{pump, Direction, Link};

/// One listener, its link and its accept task (aborted on drop).
pub struct Proxy {
    pub addr: SocketAddr,
    pub link: Arc<Link>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// Binds 127.0.0.1:0 and forwards every connection to `upstream` (`host:port`, resolved per
    /// connection, so a restarted server on the same port is found again).
    pub async fn start(upstream: String, link: Arc<Link>) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind a database link proxy on 127.0.0.1")?;
        let addr = listener.local_addr()?;
        let l = link.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let (link, upstream) = (l.clone(), upstream.clone());
                tokio::spawn(async move {
                    if let Err(e) = serve(client, &upstream, &link).await {
                        tracing::debug!(link = %link.name, error = %e, "database link connection ended");
                    }
                });
            }
        });
        Ok(Proxy { addr, link, task })
    }
}

/// Forwards one connection until either side ends it or the link resets it.
async fn serve(client: TcpStream, upstream: &str, link: &Link) -> std::io::Result<()> {
    // A client that cannot reach the server sees its connection closed, as without a proxy.
    let server = TcpStream::connect(upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (_open, mut resets) = link.opened();
    let (mut client, mut server) = (client, server);
    let reset = {
        let (cr, cw) = client.split();
        let (sr, sw) = server.split();
        let both = async {
            tokio::try_join!(
                pump(link, Direction::Up, cr, sw),
                pump(link, Direction::Down, sr, cw)
            )
        };
        tokio::select! {
            r = both => { r?; false }
            _ = resets.changed() => true,
        }
    };
    if reset {
        link.count_reset();
        zero_linger(&client);
        zero_linger(&server);
    }
    Ok(())
}

/// SO_LINGER with a zero timeout: the close that follows sends RST and drops unsent data (a
/// zero linger never blocks the thread on drop, unlike a non-zero one).
fn zero_linger(s: &TcpStream) {
    if let Err(e) = s.set_zero_linger() {
        tracing::debug!(error = %e, "SO_LINGER 0 on a reset connection");
    }
}
