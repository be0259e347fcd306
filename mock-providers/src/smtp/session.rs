//! The SMTP session state machine: (state, command) → (reply, next state).
//!
//! Pure and synchronous: no sockets, no clock. Whether a sender, recipient or DATA is faulted is
//! asked of a [`Policy`] (the live one records to the ledger; tests plug in a table), and the
//! answer comes back as an [`Action`] the connection driver carries out (sleep, write, close,
//! read DATA). It must never do I/O, so every sequence rule can be tested as a table.
//!
//! ```text
//!  greeting 220 ──► Fresh ──HELO/EHLO──► Ready ──MAIL──► Mail ──RCPT──► Rcpt ──DATA 354──► Data
//!  greeting 554 ──► Refused (503 to all but QUIT)           ▲  RSET / EHLO / end of DATA  │
//!  greeting 421 ──► closed                                  └────────────────────────────┘
//! ```

use std::time::Duration;

use crate::ledger::Draft;

use super::command::Command;
use super::plan::Rcpt;
use super::reply::Reply;

/// What the policy decided for one stage, how long to wait before saying it, and the ledger
/// entries to record once the wait is over (just before the reply is written).
#[derive(Clone, Debug)]
pub struct Verdict<T> {
    pub delay: Duration,
    pub result: Result<T, Reply>,
    pub records: Vec<Draft>,
    /// Never answer the command (a provider in a `hang` outage): the driver holds the connection
    /// until the client hangs up and records `records` then. `result` is not sent.
    pub hold: bool,
}

impl<T> Verdict<T> {
    pub fn now(result: Result<T, Reply>) -> Verdict<T> {
        Verdict {
            delay: Duration::ZERO,
            result,
            records: Vec::new(),
            hold: false,
        }
    }
}

/// How the DATA that follows a 354 is to be handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataMode {
    Receive,
    /// Read the first line of data, then drop the connection without replying.
    DropMidway,
}

/// The seeded, configurable decisions a session asks for. Implementations record their own
/// rejections; the session never touches the ledger.
pub trait Policy {
    /// Connection opened: 220, or a 421/554 fault.
    fn greeting(&mut self) -> Verdict<()>;
    /// Largest message accepted (advertised as SIZE).
    fn max_size(&self) -> usize;
    /// A new transaction from `from` (`""` for the null sender).
    fn mail(&mut self, from: &str) -> Verdict<()>;
    /// Reserves the attempt and decides the recipient's fate at every stage.
    fn rcpt(&mut self, from: &str, to: &str) -> Verdict<Rcpt>;
    /// DATA with at least one accepted recipient.
    fn data(&mut self, from: &str, rcpts: &[Rcpt]) -> Verdict<DataMode>;
    /// A rejection the session decided itself that is not a protocol error (MAIL SIZE too big).
    fn rejected(&mut self, reply: &Reply, command: &str);
    /// A syntax or sequence error the session answered.
    fn protocol_error(&mut self, reply: &Reply, command: &str);
}

/// The state of a session, for tests and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Greeting refused with 554: only QUIT is served.
    Refused,
    /// Greeted, no HELO/EHLO yet.
    Fresh,
    Ready,
    /// MAIL accepted, no recipient accepted yet.
    Mail,
    /// At least one recipient accepted.
    Rcpt,
    /// 354 sent; the driver is reading the message.
    Data,
    Closed,
}

/// What the connection driver does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    Continue,
    /// Write the reply (if any), then close.
    Close,
    /// Write the 354, then read the message and call [`Session::finish_data`].
    ReadData(DataMode),
    /// Write nothing: hold the connection until the client hangs up, record the action's
    /// entries then (as not answered), and close.
    Hold,
}

/// Wait `delay`, record `records` to the ledger, write `reply`, then do `then`.
#[derive(Clone, Debug)]
pub struct Action {
    pub delay: Duration,
    pub records: Vec<Draft>,
    pub reply: Reply,
    pub then: Then,
}

impl Action {
    fn reply(reply: Reply) -> Action {
        Action::after(Duration::ZERO, Vec::new(), reply, Then::Continue)
    }

    fn close(reply: Reply) -> Action {
        Action::after(Duration::ZERO, Vec::new(), reply, Then::Close)
    }

    fn after(delay: Duration, records: Vec<Draft>, reply: Reply, then: Then) -> Action {
        Action {
            delay,
            records,
            reply,
            then,
        }
    }
}

/// The sender and accepted recipients of a transaction whose DATA was received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub from: String,
    pub rcpts: Vec<Rcpt>,
}

/// Session limits that are not part of the fault profile.
#[derive(Clone, Debug)]
pub struct SessionLimits {
    pub hostname: String,
    pub max_recipients: usize,
    /// Protocol errors tolerated before answering 421 and closing.
    pub max_errors: u32,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            hostname: "mock-smtp.ting-chaos.test".into(),
            max_recipients: 100,
            max_errors: 20,
        }
    }
}

struct Transaction {
    from: String,
    rcpts: Vec<Rcpt>,
    /// RCPT commands seen, accepted or not (to tell 554 "no valid recipients" from 503).
    rcpt_commands: usize,
}

pub struct Session {
    limits: SessionLimits,
    greeted: bool,
    refused: bool,
    closed: bool,
    in_data: bool,
    errors: u32,
    tx: Option<Transaction>,
}

impl Session {
    pub fn new(limits: SessionLimits) -> Session {
        Session {
            limits,
            greeted: false,
            refused: false,
            closed: false,
            in_data: false,
            errors: 0,
            tx: None,
        }
    }

    pub fn state(&self) -> State {
        match (&self.tx, self.in_data) {
            _ if self.closed => State::Closed,
            _ if self.refused => State::Refused,
            (_, true) => State::Data,
            (Some(tx), _) if !tx.rcpts.is_empty() => State::Rcpt,
            (Some(_), _) => State::Mail,
            (None, _) if self.greeted => State::Ready,
            (None, _) => State::Fresh,
        }
    }

    /// The opening reply of the connection.
    pub fn greeting(&mut self, policy: &mut impl Policy) -> Action {
        let Verdict {
            delay,
            result,
            records,
            ..
        } = policy.greeting();
        let (reply, then) = match result {
            Ok(()) => {
                let text = format!("{} ESMTP ting-chaos mock", self.limits.hostname);
                (Reply::plain(220, text), Then::Continue)
            }
            // RFC 5321 §3.1: after a 554 greeting the server waits for QUIT.
            Err(r) if r.code == 554 => {
                self.refused = true;
                (r, Then::Continue)
            }
            Err(r) => {
                self.closed = true;
                (r, Then::Close)
            }
        };
        Action::after(delay, records, reply, then)
    }

    /// A line that was over the length limit and was discarded.
    pub fn line_too_long(&mut self, policy: &mut impl Policy) -> Action {
        self.error(
            policy,
            Reply::syntax("line too long"),
            "<line over 1000 octets>",
        )
    }

    /// Parses and handles one command line.
    pub fn handle_line(&mut self, line: &[u8], policy: &mut impl Policy) -> Action {
        match Command::parse(line) {
            Ok(cmd) => self.handle(cmd, line, policy),
            Err(reply) => self.error(policy, reply, &printable(line)),
        }
    }

    fn handle(&mut self, cmd: Command, line: &[u8], policy: &mut impl Policy) -> Action {
        debug_assert!(
            !self.in_data && !self.closed,
            "command while in DATA or closed"
        );
        if self.refused {
            return match cmd {
                Command::Quit => self.quit(),
                _ => Action::reply(Reply::bad_sequence("no SMTP service here, only QUIT")),
            };
        }
        match cmd {
            Command::Ehlo(client) => {
                self.greeted = true;
                self.tx = None;
                let lines = vec![
                    format!("{} greets {client}", self.limits.hostname),
                    "PIPELINING".into(),
                    "8BITMIME".into(),
                    format!("SIZE {}", policy.max_size()),
                    "ENHANCEDSTATUSCODES".into(),
                    "SMTPUTF8".into(),
                ];
                Action::reply(Reply::multi(250, lines))
            }
            Command::Helo(_) => {
                self.greeted = true;
                self.tx = None;
                Action::reply(Reply::plain(250, self.limits.hostname.clone()))
            }
            Command::Mail { from, size } => self.mail(from, size, line, policy),
            Command::Rcpt { to } => self.rcpt(to, line, policy),
            Command::Data => self.data(line, policy),
            Command::Rset => {
                self.tx = None;
                Action::reply(Reply::ok("OK"))
            }
            Command::Noop => Action::reply(Reply::ok("OK")),
            Command::Vrfy(_) => Action::reply(Reply::new(
                252,
                "2.5.0",
                "cannot VRFY user, but will accept message and attempt delivery",
            )),
            Command::Help => Action::reply(Reply::new(
                214,
                "2.0.0",
                "EHLO HELO MAIL RCPT DATA RSET NOOP VRFY QUIT",
            )),
            Command::NotImplemented(verb) => self.error(
                policy,
                Reply::new(502, "5.5.1", format!("{verb} not implemented")),
                &printable(line),
            ),
            Command::Quit => self.quit(),
        }
    }

    fn mail(
        &mut self,
        from: String,
        size: Option<u64>,
        line: &[u8],
        policy: &mut impl Policy,
    ) -> Action {
        if !self.greeted {
            return self.error(
                policy,
                Reply::bad_sequence("send HELO/EHLO first"),
                &printable(line),
            );
        }
        if self.tx.is_some() {
            return self.error(
                policy,
                Reply::bad_sequence("nested MAIL command"),
                &printable(line),
            );
        }
        if size.is_some_and(|s| s > policy.max_size() as u64) {
            let reply = Reply::new(
                552,
                "5.3.4",
                "message size exceeds fixed maximum message size",
            );
            policy.rejected(&reply, &printable(line));
            return Action::reply(reply);
        }
        let v = policy.mail(&from);
        let reply = match v.result {
            Ok(()) => {
                self.tx = Some(Transaction {
                    from,
                    rcpts: Vec::new(),
                    rcpt_commands: 0,
                });
                Reply::new(250, "2.1.0", "sender OK")
            }
            Err(r) => r,
        };
        Action::after(v.delay, v.records, reply, Then::Continue)
    }

    fn rcpt(&mut self, to: String, line: &[u8], policy: &mut impl Policy) -> Action {
        let max = self.limits.max_recipients;
        let Some(tx) = self.tx.as_mut() else {
            return self.error(
                policy,
                Reply::bad_sequence("need MAIL before RCPT"),
                &printable(line),
            );
        };
        if tx.rcpts.len() >= max {
            return Action::reply(Reply::new(452, "4.5.3", "too many recipients"));
        }
        tx.rcpt_commands += 1;
        let v = policy.rcpt(&tx.from, &to);
        if v.hold {
            self.closed = true;
            let reply = v.result.err().unwrap_or_else(|| Reply::plain(421, ""));
            return Action::after(v.delay, v.records, reply, Then::Hold);
        }
        let (reply, then) = match v.result {
            Ok(rcpt) => {
                tx.rcpts.push(rcpt);
                (Reply::new(250, "2.1.5", "recipient OK"), Then::Continue)
            }
            // RFC 5321 §3.8: a 421 means the server is closing the channel.
            Err(r) if r.code == 421 => {
                self.closed = true;
                (r, Then::Close)
            }
            Err(r) => (r, Then::Continue),
        };
        Action::after(v.delay, v.records, reply, then)
    }

    fn data(&mut self, line: &[u8], policy: &mut impl Policy) -> Action {
        let Some(tx) = self.tx.as_ref() else {
            return self.error(
                policy,
                Reply::bad_sequence("need MAIL before DATA"),
                &printable(line),
            );
        };
        if tx.rcpts.is_empty() {
            if tx.rcpt_commands == 0 {
                return self.error(
                    policy,
                    Reply::bad_sequence("need RCPT before DATA"),
                    &printable(line),
                );
            }
            // RFC 2920 §3.1: every pipelined RCPT failed; not the client's mistake.
            return Action::reply(Reply::new(554, "5.5.1", "no valid recipients"));
        }
        let v = policy.data(&tx.from, &tx.rcpts);
        match v.result {
            Ok(mode) => {
                self.in_data = true;
                let reply = Reply::plain(354, "end data with <CR><LF>.<CR><LF>");
                Action::after(v.delay, v.records, reply, Then::ReadData(mode))
            }
            Err(reply) => {
                self.tx = None;
                Action::after(v.delay, v.records, reply, Then::Continue)
            }
        }
    }

    /// The message was read (or abandoned): returns the transaction and goes back to Ready.
    pub fn finish_data(&mut self) -> Option<Envelope> {
        self.in_data = false;
        self.tx.take().map(|tx| Envelope {
            from: tx.from,
            rcpts: tx.rcpts,
        })
    }

    fn quit(&mut self) -> Action {
        self.closed = true;
        Action::close(Reply::new(221, "2.0.0", "bye"))
    }

    fn error(&mut self, policy: &mut impl Policy, reply: Reply, command: &str) -> Action {
        policy.protocol_error(&reply, command);
        self.errors += 1;
        if self.errors > self.limits.max_errors {
            self.closed = true;
            let reply = Reply::new(421, "4.7.0", "too many errors, closing connection");
            return Action::close(reply);
        }
        Action::reply(reply)
    }
}

/// A command line as it may be logged: lossy UTF-8, controls escaped, at most 100 characters.
pub fn printable(line: &[u8]) -> String {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    String::from_utf8_lossy(line)
        .chars()
        .flat_map(|c| c.escape_debug())
        .take(100)
        .collect()
}

#[cfg(test)]
mod tests;
