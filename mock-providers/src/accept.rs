//! The accept loop every fake shares (HTTP and SMTP): one task per connection, the ledger's
//! connection hooks ([`Ledger::on_connect`], bounded) awaited on that task before the protocol
//! serves its first byte — so a slow hook delays one connection, never the accept loop — and a
//! stop signal plus a drain on shutdown.

use std::future::Future;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::ledger::Ledger;

/// Accepts on `listener` until `shutdown` resolves, running `serve(stream, peer, stop)` for each
/// connection after its hooks. Then closes the listener, sets `stop`, and waits for the
/// connections to end — for at most `grace`, aborting the rest, or without limit when `None`.
pub(crate) async fn accept_until<S, F>(
    listener: TcpListener,
    ledger: Ledger,
    what: &'static str,
    shutdown: impl Future<Output = ()>,
    grace: Option<Duration>,
    serve: S,
) -> std::io::Result<()>
where
    S: Fn(TcpStream, SocketAddr, watch::Receiver<bool>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let (ledger, conn) = (ledger.clone(), serve(stream, peer, stop_rx.clone()));
                    conns.spawn(async move {
                        ledger.on_connect(peer).await;
                        conn.await
                    });
                }
                // The client gave up before we accepted: nothing to serve.
                Err(e) if matches!(
                    e.kind(),
                    ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
                ) => {}
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning; the listener stays up.
                    tracing::warn!(error = %e, "{what} accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drain = async { while conns.join_next().await.is_some() {} };
    match grace {
        None => drain.await,
        Some(grace) => {
            if tokio::time::timeout(grace, drain).await.is_err() {
                conns.abort_all();
            }
        }
    }
    Ok(())
}
