//! Parsing one SMTP command line into a [`Command`], or the error [`Reply`] it deserves.
//!
//! Pure and total: any byte string (garbage, non-UTF-8, bare verbs, absurd parameters) yields
//! either a command or a 5yz reply, never a panic. This module must never look at session state:
//! "is this command allowed now?" is [`super::session`]'s question.

use super::reply::Reply;

/// One SMTP command (RFC 5321 §4.1), arguments already validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Helo(String),
    Ehlo(String),
    /// `from` is the reverse-path without angle brackets; `""` is the null sender `<>`.
    Mail {
        from: String,
        size: Option<u64>,
    },
    /// `to` is the forward-path without angle brackets.
    Rcpt {
        to: String,
    },
    Data,
    Rset,
    Noop,
    Quit,
    Vrfy(String),
    Help,
    /// A command we know but do not offer (EXPN, STARTTLS, AUTH, BDAT, TURN): 502.
    NotImplemented(String),
}

impl Command {
    /// Parses one line, with or without its CRLF / LF terminator.
    pub fn parse(line: &[u8]) -> Result<Command, Reply> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let line = std::str::from_utf8(line)
            .map_err(|_| Reply::syntax("syntax error: command is not valid UTF-8"))?;
        if line.chars().any(|c| c.is_control() && c != '\t') {
            return Err(Reply::syntax("syntax error: control characters in command"));
        }
        let line = line.trim_end();
        let (verb, rest) = match line.find(' ') {
            Some(i) => (&line[..i], line[i + 1..].trim_start()),
            None => (line, ""),
        };
        if verb.is_empty() {
            return Err(Reply::syntax("syntax error: empty command"));
        }
        match verb.to_ascii_uppercase().as_str() {
            "HELO" => domain(rest, "HELO").map(Command::Helo),
            "EHLO" => domain(rest, "EHLO").map(Command::Ehlo),
            "MAIL" => parse_mail(rest),
            "RCPT" => parse_rcpt(rest),
            "DATA" => no_args(rest, "DATA", Command::Data),
            "RSET" => no_args(rest, "RSET", Command::Rset),
            "QUIT" => no_args(rest, "QUIT", Command::Quit),
            // NOOP and HELP may carry a string that is ignored.
            "NOOP" => Ok(Command::Noop),
            "HELP" => Ok(Command::Help),
            "VRFY" if rest.is_empty() => Err(Reply::bad_args("syntax: VRFY <string>")),
            "VRFY" => Ok(Command::Vrfy(rest.to_string())),
            v @ ("EXPN" | "STARTTLS" | "AUTH" | "BDAT" | "TURN" | "ETRN") => {
                Ok(Command::NotImplemented(v.to_string()))
            }
            _ => Err(Reply::new(500, "5.5.1", "command unrecognized")),
        }
    }
}

fn no_args(rest: &str, verb: &str, cmd: Command) -> Result<Command, Reply> {
    if rest.is_empty() {
        Ok(cmd)
    } else {
        Err(Reply::bad_args(format!(
            "syntax: {verb} takes no arguments"
        )))
    }
}

fn domain(rest: &str, verb: &str) -> Result<String, Reply> {
    match rest.split_whitespace().next() {
        Some(d) => Ok(d.to_string()),
        None => Err(Reply::bad_args(format!("syntax: {verb} <domain>"))),
    }
}

fn parse_mail(rest: &str) -> Result<Command, Reply> {
    let path = strip_prefix_ci(rest, "FROM:")
        .ok_or_else(|| Reply::bad_args("syntax: MAIL FROM:<address> [parameters]"))?;
    let (from, params) = split_path(path).ok_or_else(bad_sender)?;
    if !from.is_empty() && !is_mailbox(&from) {
        return Err(bad_sender());
    }
    let mut size = None;
    for p in params.split_whitespace() {
        let (key, value) = p.split_once('=').unwrap_or((p, ""));
        match key.to_ascii_uppercase().as_str() {
            "SIZE" => {
                let n = value
                    .parse::<u64>()
                    .map_err(|_| Reply::bad_args("syntax: SIZE=<number of octets>"))?;
                size = Some(n);
            }
            "BODY" if ["7BIT", "8BITMIME"].contains(&value.to_ascii_uppercase().as_str()) => {}
            "SMTPUTF8" if value.is_empty() => {}
            _ => return Err(unknown_param(p)),
        }
    }
    Ok(Command::Mail { from, size })
}

fn parse_rcpt(rest: &str) -> Result<Command, Reply> {
    let path =
        strip_prefix_ci(rest, "TO:").ok_or_else(|| Reply::bad_args("syntax: RCPT TO:<address>"))?;
    let (to, params) = split_path(path).ok_or_else(bad_recipient)?;
    if !(is_mailbox(&to) || to.eq_ignore_ascii_case("postmaster")) {
        return Err(bad_recipient());
    }
    if let Some(p) = params.split_whitespace().next() {
        return Err(unknown_param(p));
    }
    Ok(Command::Rcpt { to })
}

fn bad_sender() -> Reply {
    Reply::new(501, "5.1.7", "bad sender address syntax")
}

fn bad_recipient() -> Reply {
    Reply::new(501, "5.1.3", "bad recipient address syntax")
}

fn unknown_param(p: &str) -> Reply {
    let p: String = p.chars().take(40).collect();
    Reply::new(555, "5.5.4", format!("parameter {p} not recognized"))
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    // Some clients write `MAIL FROM: <a@b>`; accept the space after the colon.
    head.eq_ignore_ascii_case(prefix)
        .then(|| s[prefix.len()..].trim_start())
}

/// Splits `<path> params` into the address (source route dropped) and the parameter string.
fn split_path(s: &str) -> Option<(String, &str)> {
    let inner = s.strip_prefix('<')?;
    let end = inner.find('>')?;
    let (path, params) = (&inner[..end], &inner[end + 1..]);
    if !(params.is_empty() || params.starts_with(' ')) {
        return None;
    }
    // RFC 5321 §4.1.2 source route `@a,@b:user@host`: obsolete, ignored.
    let path = match path.strip_prefix('@') {
        Some(_) => path.split_once(':')?.1,
        None => path,
    };
    Some((path.to_string(), params.trim()))
}

/// `local@domain` with no whitespace or brackets; deliberately looser than RFC 5321 (quoted
/// local parts, UTF-8 under SMTPUTF8) but never empty on either side.
fn is_mailbox(addr: &str) -> bool {
    let Some((local, domain)) = addr.rsplit_once('@') else {
        return false;
    };
    let ok = |s: &str| !s.is_empty() && !s.chars().any(|c| c.is_whitespace() || "<>".contains(c));
    ok(local) && ok(domain) && !domain.contains('@')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mail(from: &str, size: Option<u64>) -> Command {
        Command::Mail {
            from: from.into(),
            size,
        }
    }

    fn rcpt(to: &str) -> Command {
        Command::Rcpt { to: to.into() }
    }

    /// (input, Ok(command) or Err(basic code, enhanced code)).
    #[test]
    fn parse_table() {
        type Want = Result<Command, (u16, &'static str)>;
        let cases: Vec<(&[u8], Want)> = vec![
            (
                b"EHLO client.example\r\n",
                Ok(Command::Ehlo("client.example".into())),
            ),
            (
                b"ehlo client.example\n",
                Ok(Command::Ehlo("client.example".into())),
            ),
            (b"HELO [127.0.0.1]", Ok(Command::Helo("[127.0.0.1]".into()))),
            (b"EHLO", Err((501, "5.5.4"))),
            (b"MAIL FROM:<a@b.test>", Ok(mail("a@b.test", None))),
            (b"mail from: <a@b.test>", Ok(mail("a@b.test", None))),
            (b"MAIL FROM:<>", Ok(mail("", None))),
            (
                b"MAIL FROM:<a@b.test> SIZE=1234",
                Ok(mail("a@b.test", Some(1234))),
            ),
            (
                b"MAIL FROM:<a@b.test> BODY=8BITMIME SMTPUTF8",
                Ok(mail("a@b.test", None)),
            ),
            (b"MAIL FROM:<a@b.test> SIZE=big", Err((501, "5.5.4"))),
            (b"MAIL FROM:<a@b.test> SIZE=-1", Err((501, "5.5.4"))),
            (b"MAIL FROM:<a@b.test> FOO=bar", Err((555, "5.5.4"))),
            (b"MAIL FROM:a@b.test", Err((501, "5.1.7"))),
            (b"MAIL FROM:<a@>", Err((501, "5.1.7"))),
            (b"MAIL FROM:<a b@c>", Err((501, "5.1.7"))),
            (b"MAIL TO:<a@b.test>", Err((501, "5.5.4"))),
            (b"MAIL", Err((501, "5.5.4"))),
            (b"RCPT TO:<r1@x.test>", Ok(rcpt("r1@x.test"))),
            (b"RCPT TO:<@relay.test:r1@x.test>", Ok(rcpt("r1@x.test"))),
            (b"RCPT TO:<Postmaster>", Ok(rcpt("Postmaster"))),
            (b"RCPT TO:<>", Err((501, "5.1.3"))),
            (b"RCPT TO:<nobody>", Err((501, "5.1.3"))),
            (b"RCPT TO:<r1@x.test>x", Err((501, "5.1.3"))),
            (b"RCPT TO:<r1@x.test> NOTIFY=NEVER", Err((555, "5.5.4"))),
            (b"RCPT FROM:<r1@x.test>", Err((501, "5.5.4"))),
            (b"DATA", Ok(Command::Data)),
            (b"DATA now", Err((501, "5.5.4"))),
            (b"RSET", Ok(Command::Rset)),
            (b"NOOP", Ok(Command::Noop)),
            (b"NOOP anything", Ok(Command::Noop)),
            (b"QUIT\r\n", Ok(Command::Quit)),
            (b"VRFY someone", Ok(Command::Vrfy("someone".into()))),
            (b"VRFY", Err((501, "5.5.4"))),
            (b"HELP", Ok(Command::Help)),
            (b"STARTTLS", Ok(Command::NotImplemented("STARTTLS".into()))),
            (
                b"AUTH PLAIN AAAA",
                Ok(Command::NotImplemented("AUTH".into())),
            ),
            (b"", Err((500, "5.5.2"))),
            (b"\r\n", Err((500, "5.5.2"))),
            (b"   ", Err((500, "5.5.2"))),
            (b"XYZZY", Err((500, "5.5.1"))),
            (b"GET / HTTP/1.1", Err((500, "5.5.1"))),
            (b"\xff\xfe\x00garbage", Err((500, "5.5.2"))),
            (b"NOOP \x00", Err((500, "5.5.2"))),
            (
                b"MAIL FROM:<\xc3\xa9@b.test>",
                Ok(mail("\u{e9}@b.test", None)),
            ),
        ];
        for (input, want) in cases {
            let got = Command::parse(input).map_err(|r| (r.code, r.enhanced.clone()));
            let want = want.map_err(|(c, e)| (c, Some(e.to_string())));
            assert_eq!(got, want, "input {:?}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let alphabet = b"MAILFROM:RCPTO<>@ =SIZE\r\n\xff\x00.";
        for _ in 0..20_000 {
            let len = rng.gen_range(0..40);
            let line: Vec<u8> = (0..len)
                .map(|_| alphabet[rng.gen_range(0..alphabet.len())])
                .collect();
            let _ = Command::parse(&line);
        }
    }
}
