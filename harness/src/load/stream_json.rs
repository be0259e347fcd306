//! Parsing a JSON answer while it arrives: the body's chunks are handed to `serde_json` on a
//! blocking thread as they come, so an answer of tens of megabytes (a status answer for a batch
//! of 10,000 deliveries with their histories) is never held whole, only the value it parses to.
//! Must give the answers of reading the whole body and parsing it: the same value, the same
//! parse errors, a body longer than the cap or cut off by the connection told apart (a body
//! that is not JSON is named so as soon as the parser sees it, even if it would go on past the
//! cap).

use std::io::Read;

use serde::de::DeserializeSeed;
use tokio::sync::mpsc;

/// Chunks of the body in flight between the reader and the parser at most.
const IN_FLIGHT: usize = 4;

/// How reading a body ended, when it did not end in a value.
#[derive(Debug)]
pub enum Failed {
    /// More than the cap arrived; `head` is the first bytes of the body.
    TooLong { head: Vec<u8> },
    /// Not JSON, or not the shape asked for; `head` is the first bytes of the body.
    Parse {
        error: serde_json::Error,
        head: Vec<u8>,
    },
    /// The connection failed before the body ended: there is no answer to judge.
    Transport(String),
}

/// Why reading a body stopped before its end.
enum Cut {
    OverCap,
    Transport(String),
}

/// Parses `resp`'s body with `seed` while it arrives (`PhantomData::<T>` for a plain `T`),
/// reading at most `cap` bytes, and keeping the first `head` bytes to show when it is not what
/// the seed reads.
pub async fn parse<S, T>(
    mut resp: reqwest::Response,
    cap: usize,
    head: usize,
    seed: S,
) -> Result<T, Failed>
where
    S: for<'de> DeserializeSeed<'de, Value = T> + Send + 'static,
    T: Send + 'static,
{
    let (tx, rx) = mpsc::channel::<bytes::Bytes>(IN_FLIGHT);
    let parser = tokio::task::spawn_blocking(move || {
        let reader = std::io::BufReader::new(Chunks {
            rx,
            current: bytes::Bytes::new(),
        });
        let mut de = serde_json::Deserializer::from_reader(reader);
        let value = seed.deserialize(&mut de)?;
        de.end().map(|()| value)
    });
    let mut first: Vec<u8> = Vec::new();
    let mut read = 0usize;
    let mut cut: Option<Cut> = None;
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                read = read.saturating_add(chunk.len());
                if first.len() < head {
                    let take = (head - first.len()).min(chunk.len());
                    first.extend_from_slice(&chunk[..take]);
                }
                if read > cap {
                    cut = Some(Cut::OverCap);
                    break;
                }
                if tx.send(chunk).await.is_err() {
                    break; // The parser has stopped: it has its answer or its error.
                }
            }
            Ok(None) => break,
            Err(e) => {
                cut = Some(Cut::Transport(format!("{e:#}")));
                break;
            }
        }
    }
    drop(tx);
    let parsed = parser.await;
    match (cut, parsed) {
        (Some(Cut::OverCap), _) => Err(Failed::TooLong { head: first }),
        (Some(Cut::Transport(e)), _) => Err(Failed::Transport(e)),
        (None, Ok(Ok(value))) => Ok(value),
        (None, Ok(Err(error))) => Err(Failed::Parse { error, head: first }),
        (None, Err(join)) => Err(Failed::Transport(format!("the parser stopped: {join}"))),
    }
}

/// The body's chunks as a `Read`, for the parser's blocking thread.
struct Chunks {
    rx: mpsc::Receiver<bytes::Bytes>,
    current: bytes::Bytes,
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        bytes::Buf::advance(&mut self.current, n);
        Ok(n)
    }
}
