//! One SMTP connection: reads lines, feeds the session, carries out its actions on the socket.
//!
//! The only place that touches the socket. Commands are read from a buffered reader and answered
//! in order, and replies are flushed when no pipelined command is waiting, which is all
//! PIPELINING asks of a server. Every read is bounded by the idle timeout and every line by
//! [`MAX_LINE`], so garbage, bare LF or a silent client can neither crash nor hang it.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::data::{DataAssembler, MAX_LINE};
use super::policy::LivePolicy;
use super::reply::Reply;
use super::session::{DataMode, Session, Then};
use super::{Limits, SmtpContext};
use crate::ledger::Provider;
use crate::link::{LinkFate, LinkFault};

type Writer = BufWriter<OwnedWriteHalf>;

/// Result of reading one line.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// `buf` holds the line with its LF.
    Complete,
    /// Longer than the limit: discarded up to and including its LF.
    TooLong,
    /// The peer closed (a partial last line is dropped).
    Eof,
}

/// Reads up to and including the next LF into `buf`, keeping at most `max` bytes.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<Line> {
    buf.clear();
    let mut too_long = false;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            buf.clear();
            return Ok(Line::Eof);
        }
        let (chunk, found) = match avail.iter().position(|b| *b == b'\n') {
            Some(i) => (&avail[..=i], true),
            None => (avail, false),
        };
        let n = chunk.len();
        if !too_long && buf.len() + n > max {
            too_long = true;
            buf.clear();
        }
        if !too_long {
            buf.extend_from_slice(chunk);
        }
        r.consume(n);
        if found {
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Complete
            });
        }
    }
}

pub(super) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: Arc<SmtpContext>,
    limits: Limits,
    shutdown: watch::Receiver<bool>,
) {
    if let Err(e) = drive(stream, peer, &ctx, &limits, shutdown).await {
        tracing::debug!(%peer, error = %e, "smtp connection ended with an i/o error");
    }
}

async fn drive(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: &SmtpContext,
    limits: &Limits,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let (r, w) = stream.into_split();
    let mut reader = BufReader::new(r);
    let mut writer = BufWriter::new(w);
    let mut policy = LivePolicy::new(ctx, peer);
    let mut session = Session::new(limits.session.clone());
    let mut line = Vec::with_capacity(1024);

    let mut action = session.greeting(&mut policy);
    loop {
        pause(&mut writer, action.delay).await?;
        if action.then == Then::Hold {
            writer.flush().await?;
            return hold(reader, writer, action, ctx, &mut shutdown).await;
        }
        for d in action.records.drain(..) {
            ctx.ledger.record(d);
        }
        writer.write_all(&action.reply.to_wire()).await?;
        match action.then {
            // Hold the reply back only while a whole pipelined command is already waiting: a
            // client never waits for us with half a line sent.
            Then::Continue => {
                if !reader.buffer().contains(&b'\n') {
                    writer.flush().await?;
                }
            }
            // A hold never gets here: it is served above, before anything is written.
            Then::Close | Then::Hold => return close(writer).await,
            Then::ReadData(mode) => {
                writer.flush().await?;
                let after = receive_data(
                    &mut reader,
                    &mut writer,
                    &mut line,
                    mode,
                    &mut session,
                    &policy,
                    ctx,
                    limits,
                )
                .await?;
                match after {
                    AfterData::Keep => {}
                    AfterData::Close => return close(writer).await,
                    AfterData::Reset => return reset(reader, writer),
                }
            }
        }
        let read = tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => None,
            r = tokio::time::timeout(limits.idle_timeout, read_line(&mut reader, &mut line, MAX_LINE)) => Some(r),
        };
        action = match read {
            None => {
                return goodbye(writer, Reply::new(421, "4.3.2", "service shutting down")).await
            }
            Some(Err(_)) => return goodbye(writer, idle_reply()).await,
            Some(Ok(r)) => match r? {
                Line::Eof => return Ok(()),
                // The sender's link is down: the connection ends before the command is acted
                // on. Closed (FIN), not reset: a reply still unread by a pipelining client (the
                // 250 of its last message) must reach it, or an accepted message turns
                // ambiguous; this command's own reply never comes.
                _ if ctx.ledger.refuses(Provider::Smtp, peer) => return close(writer).await,
                Line::TooLong => session.line_too_long(&mut policy),
                Line::Complete => session.handle_line(&line, &mut policy),
            },
        };
    }
}

/// Never answers (an outage's `hang`): reads and discards until the client hangs up, then
/// records the action's entries with `client_hung_up`. A fake shutting down or a hold past
/// [`crate::outage::MAX_HOLD`] answers the action's reply after all and closes.
async fn hold(
    mut reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: Writer,
    action: super::session::Action,
    ctx: &SmtpContext,
    shutdown: &mut watch::Receiver<bool>,
) -> io::Result<()> {
    let drain = async {
        let mut sink = [0u8; 4096];
        loop {
            match tokio::io::AsyncReadExt::read(&mut reader, &mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    let held = ctx.ledger.holding();
    let hung_up = tokio::select! {
        _ = drain => true,
        _ = shutdown.wait_for(|stop| *stop) => false,
        _ = tokio::time::sleep(crate::outage::MAX_HOLD) => false,
    };
    drop(held);
    for mut d in action.records {
        d.client_hung_up = hung_up;
        if !hung_up {
            d.status = action.reply.status();
            d.error = Some(action.reply.first_line());
        }
        ctx.ledger.record(d);
    }
    if hung_up {
        return Ok(());
    }
    goodbye(writer, action.reply).await
}

/// What becomes of the connection after a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterData {
    /// The session goes on.
    Keep,
    /// Closed cleanly (FIN).
    Close,
    /// Reset (RST), no reply: a link fault ([`crate::link`]).
    Reset,
}

/// Reads the message after a 354 and answers its end (or resets the connection instead, when the
/// sender's link says so). Returns what becomes of the connection.
#[allow(clippy::too_many_arguments)]
async fn receive_data(
    reader: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: &mut Writer,
    line: &mut Vec<u8>,
    mode: DataMode,
    session: &mut Session,
    policy: &LivePolicy,
    ctx: &SmtpContext,
    limits: &Limits,
) -> io::Result<AfterData> {
    let mut data = DataAssembler::new(policy.cfg.max_size);
    while !data.is_done() {
        if !reader.buffer().contains(&b'\n') {
            quick_ack(reader.get_ref().as_ref());
        }
        let read =
            tokio::time::timeout(limits.idle_timeout, read_line(reader, line, MAX_LINE)).await;
        match read {
            Err(_) => {
                session.finish_data();
                writer.write_all(&idle_reply().to_wire()).await?;
                return Ok(AfterData::Close);
            }
            Ok(r) => match r? {
                Line::Eof => {
                    tracing::debug!("smtp client closed the connection inside DATA");
                    session.finish_data();
                    return Ok(AfterData::Close);
                }
                _ if mode == DataMode::DropMidway => {
                    if let Some(env) = session.finish_data() {
                        policy.record_drop_mid_data(&env);
                    }
                    return Ok(AfterData::Close);
                }
                Line::TooLong => data.push_discarded_long_line(),
                Line::Complete => {
                    data.push_line(line);
                }
            },
        }
    }
    let received_ns = ctx.ledger.now_ns();
    let Some(env) = session.finish_data() else {
        return Ok(AfterData::Keep);
    };
    let fate = ctx.ledger.on_request(Provider::Smtp, policy.peer).await;
    let (reset, link_delay) = match fate {
        LinkFate::Pass => (false, Duration::ZERO),
        LinkFate::Delay(d) => (false, d),
        LinkFate::Reset => (true, Duration::ZERO),
        // The harness refuses SMTP at each command (`Hook::refuses`), before any of a message
        // is sent; a fate that says so at the dot is carried out all the same.
        LinkFate::Refuse => {
            policy.record_not_served(&env, received_ns, LinkFault::Refuse);
            return Ok(AfterData::Reset);
        }
        LinkFate::Hold(heal) => {
            if !hold_watching(reader, heal).await {
                policy.record_not_served(&env, received_ns, LinkFault::Partition);
                return Ok(AfterData::Close);
            }
            (false, Duration::ZERO)
        }
    };
    let end = policy.end_of_data(&env, data.finish(), received_ns);
    let hung_up = pause_watching(reader, writer, end.delay + link_delay).await?;
    let entries: Vec<_> = end
        .records
        .into_iter()
        .map(|mut d| {
            d.client_hung_up = hung_up;
            if reset {
                crate::link::mark_reset(&mut d);
            }
            ctx.ledger.record(d)
        })
        .collect();
    let after_reply = |written: bool| match (reset, written) {
        (true, _) => AfterData::Reset,
        (false, true) => AfterData::Keep,
        (false, false) => AfterData::Close,
    };
    if !end.accepted {
        if !reset {
            writer.write_all(&end.reply.to_wire()).await?;
            writer.flush().await?;
        }
        return Ok(after_reply(true));
    }
    for e in &entries {
        ctx.ledger.before_response(e).await;
    }
    let written = if end.drop || reset {
        Ok(false)
    } else {
        match writer.write_all(&end.reply.to_wire()).await {
            Ok(()) => writer.flush().await.map(|()| true),
            Err(e) => Err(e),
        }
    };
    // Committed whatever became of the reply: delivery happens.
    for e in &entries {
        (ctx.on_commit)(e);
    }
    written.map(after_reply)
}

/// Holds a transaction a partition caught at its final dot until the link heals (`true`: serve
/// it) or the client hangs up (`false`), or [`crate::outage::MAX_HOLD`] passes (`true`). Bytes
/// the client sends meanwhile stay buffered for the next command, and end the watch for a
/// hang-up.
async fn hold_watching(
    reader: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    heal: crate::link::Heal,
) -> bool {
    let healed = heal.clone().healed();
    tokio::select! {
        () = healed => true,
        r = reader.fill_buf() => match r {
            Ok([]) | Err(_) => false,
            Ok(_) => {
                let _ = tokio::time::timeout(crate::outage::MAX_HOLD, heal.healed()).await;
                true
            }
        },
        () = tokio::time::sleep(crate::outage::MAX_HOLD) => true,
    }
}

/// Resets the connection (RST, nothing more sent): the sender's link went down under it.
fn reset(reader: BufReader<tokio::net::tcp::OwnedReadHalf>, writer: Writer) -> io::Result<()> {
    // Linger 0: closing the socket sends RST at once and drops whatever was unsent.
    let _ = socket2::SockRef::from(reader.get_ref().as_ref()).set_linger(Some(Duration::ZERO));
    drop((reader, writer));
    Ok(())
}

/// Asks the kernel to acknowledge the next segment at once instead of delaying the ACK.
///
/// Clients that write the message and its final `.` separately without TCP_NODELAY (lettre
/// does) otherwise wait for Nagle's algorithm to meet our delayed ACK: about 40 ms per message,
/// which would make the fake the bottleneck of every load test. Linux only; elsewhere a no-op.
fn quick_ack(stream: &TcpStream) {
    #[cfg(target_os = "linux")]
    {
        let _ = socket2::SockRef::from(stream).set_tcp_quickack(true);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = stream;
}

fn idle_reply() -> Reply {
    Reply::new(421, "4.4.2", "idle timeout, closing connection")
}

/// Flushes what is pending, then waits (stage latency).
async fn pause(writer: &mut Writer, delay: Duration) -> io::Result<()> {
    if !delay.is_zero() {
        writer.flush().await?;
        tokio::time::sleep(delay).await;
    }
    Ok(())
}

/// [`pause`] after the final `.`, watching the client meanwhile: true when it closed the
/// connection before the reply (it gave up waiting, as an HTTP sender hanging up does; the ledger
/// marks the entries `client_hung_up`). Bytes it sends early stay buffered for the next command.
async fn pause_watching(
    reader: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: &mut Writer,
    delay: Duration,
) -> io::Result<bool> {
    if delay.is_zero() {
        return Ok(false);
    }
    writer.flush().await?;
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    tokio::select! {
        _ = &mut sleep => Ok(false),
        r = reader.fill_buf() => match r {
            // End of stream (or a reset): the client is gone.
            Ok([]) | Err(_) => {
                sleep.await;
                Ok(true)
            }
            Ok(_) => {
                sleep.await;
                Ok(false)
            }
        },
    }
}

async fn goodbye(mut writer: Writer, reply: Reply) -> io::Result<()> {
    writer.write_all(&reply.to_wire()).await?;
    close(writer).await
}

/// Flushes and sends FIN, so a waiting client sees a clean end of stream.
async fn close(mut writer: Writer) -> io::Result<()> {
    writer.flush().await?;
    writer.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn read_line_table() {
        let long = format!("{}\r\nNOOP\r\n", "x".repeat(1200));
        type Case<'a> = (&'a [u8], usize, Vec<(Line, &'a [u8])>);
        let cases: Vec<Case> = vec![
            (
                b"EHLO a\r\nNOOP\n",
                1000,
                vec![
                    (Line::Complete, b"EHLO a\r\n"),
                    (Line::Complete, b"NOOP\n"),
                    (Line::Eof, b""),
                ],
            ),
            (b"partial", 1000, vec![(Line::Eof, b"")]),
            (
                long.as_bytes(),
                1000,
                vec![(Line::TooLong, b""), (Line::Complete, b"NOOP\r\n")],
            ),
            (b"12345\n", 6, vec![(Line::Complete, b"12345\n")]),
            (b"123456\n", 6, vec![(Line::TooLong, b"")]),
        ];
        for (input, max, want) in cases {
            // A tiny buffer so lines straddle several fill_buf calls.
            let mut r = BufReader::with_capacity(3, input);
            let mut buf = Vec::new();
            for (i, (line, bytes)) in want.into_iter().enumerate() {
                let got = read_line(&mut r, &mut buf, max).await.unwrap();
                assert_eq!(
                    (got, buf.as_slice()),
                    (line, bytes),
                    "step {i} of {:?}",
                    String::from_utf8_lossy(input)
                );
            }
        }
    }
}
