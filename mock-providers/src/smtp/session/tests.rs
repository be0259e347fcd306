//! Table tests of the session state machine against a scripted policy.

use super::*;
use crate::ledger::{EntryKind, LedgerEntry, Provider};
use crate::smtp::plan::Plan;

/// Accepts everything except recipients whose address starts with `bad`, and whatever the test
/// scripts in its fields.
struct Fake {
    greeting: Result<(), Reply>,
    mail: Result<(), Reply>,
    data: Result<DataMode, Reply>,
    attempts: u32,
    protocol_errors: Vec<String>,
    rejections: Vec<String>,
}

impl Default for Fake {
    fn default() -> Self {
        Fake {
            greeting: Ok(()),
            mail: Ok(()),
            data: Ok(DataMode::Receive),
            attempts: 0,
            protocol_errors: Vec::new(),
            rejections: Vec::new(),
        }
    }
}

impl Policy for Fake {
    fn greeting(&mut self) -> Verdict<()> {
        Verdict::now(self.greeting.clone())
    }
    fn max_size(&self) -> usize {
        1000
    }
    fn mail(&mut self, _from: &str) -> Verdict<()> {
        Verdict::now(self.mail.clone())
    }
    fn rcpt(&mut self, _from: &str, to: &str) -> Verdict<Rcpt> {
        self.attempts += 1;
        if to.starts_with("bad") {
            let draft = LedgerEntry::draft(Provider::Smtp, EntryKind::Send, to);
            return Verdict {
                records: vec![draft],
                ..Verdict::now(Err(Reply::new(550, "5.1.1", "mailbox unknown")))
            };
        }
        if to.starts_with("down") || to.starts_with("hang") {
            let draft = LedgerEntry::draft(Provider::Smtp, EntryKind::Send, to);
            return Verdict {
                records: vec![draft],
                hold: to.starts_with("hang"),
                ..Verdict::now(Err(Reply::new(421, "4.3.2", "service not available")))
            };
        }
        Verdict {
            delay: Duration::from_millis(7),
            result: Ok(Rcpt {
                addr: to.into(),
                attempt: self.attempts,
                plan: Plan::default(),
            }),
            records: Vec::new(),
            hold: false,
        }
    }
    fn data(&mut self, _from: &str, _rcpts: &[Rcpt]) -> Verdict<DataMode> {
        Verdict::now(self.data.clone())
    }
    fn rejected(&mut self, reply: &Reply, command: &str) {
        self.rejections
            .push(format!("{} [{command}]", reply.status()));
    }
    fn protocol_error(&mut self, reply: &Reply, command: &str) {
        self.protocol_errors
            .push(format!("{} [{command}]", reply.status()));
    }
}

fn session_after(prefix: &[&str], policy: &mut Fake) -> Session {
    let mut s = Session::new(SessionLimits {
        max_recipients: 2,
        max_errors: 3,
        ..SessionLimits::default()
    });
    assert_eq!(s.greeting(policy).reply.code, 220);
    for line in prefix {
        let a = s.handle_line(line.as_bytes(), policy);
        assert!(
            a.reply.is_positive() || line.contains("<bad"),
            "setup {line:?} got {}",
            a.reply
        );
    }
    policy.protocol_errors.clear();
    s
}

const EHLO: &str = "EHLO client.test";
const MAIL: &str = "MAIL FROM:<shop@x.test>";
const RCPT: &str = "RCPT TO:<r1@x.test>";

#[test]
fn transitions() {
    use State::*;
    let g: &[&str] = &[EHLO];
    let m: &[&str] = &[EHLO, MAIL];
    let r: &[&str] = &[EHLO, MAIL, RCPT];
    let rb: &[&str] = &[EHLO, MAIL, "RCPT TO:<bad@x.test>"];
    let r2: &[&str] = &[EHLO, MAIL, RCPT, "RCPT TO:<r2@x.test>"];
    // (state reached by these lines, command, reply status, next state, recorded as protocol error)
    type Case<'a> = (&'a [&'a str], &'a [u8], &'a str, State, bool);
    let cases: &[Case] = &[
        (&[], b"MAIL FROM:<a@x.test>", "503 5.5.1", Fresh, true),
        (&[], b"RSET", "250 2.0.0", Fresh, false),
        (&[], b"NOOP", "250 2.0.0", Fresh, false),
        (&[], b"EHLO c", "250", Ready, false),
        (&[], b"HELO c", "250", Ready, false),
        (&[], b"QUIT", "221 2.0.0", Closed, false),
        (g, b"RCPT TO:<r1@x.test>", "503 5.5.1", Ready, true),
        (g, b"DATA", "503 5.5.1", Ready, true),
        (g, b"MAIL FROM:<a@x.test>", "250 2.1.0", Mail, false),
        (g, b"MAIL FROM:<>", "250 2.1.0", Mail, false),
        (
            g,
            b"MAIL FROM:<a@x.test> SIZE=1000",
            "250 2.1.0",
            Mail,
            false,
        ),
        (
            g,
            b"MAIL FROM:<a@x.test> SIZE=1001",
            "552 5.3.4",
            Ready,
            false,
        ),
        (g, b"MAIL FROM:<a@x.test> SIZE=x", "501 5.5.4", Ready, true),
        (g, b"garbage here", "500 5.5.1", Ready, true),
        (g, b"\xff\xfe\x00", "500 5.5.2", Ready, true),
        (g, b"STARTTLS", "502 5.5.1", Ready, true),
        (g, b"HELP", "214 2.0.0", Ready, false),
        (g, b"VRFY someone", "252 2.5.0", Ready, false),
        (m, b"MAIL FROM:<a@x.test>", "503 5.5.1", Mail, true),
        (m, b"DATA", "503 5.5.1", Mail, true),
        (m, b"RCPT TO:<r1@x.test>", "250 2.1.5", Rcpt, false),
        (m, b"RCPT TO:<bad@x.test>", "550 5.1.1", Mail, false),
        (m, b"RCPT TO:r1@x.test", "501 5.1.3", Mail, true),
        (rb, b"DATA", "554 5.5.1", Mail, false),
        (rb, b"RCPT TO:<r1@x.test>", "250 2.1.5", Rcpt, false),
        (r, b"DATA", "354", Data, false),
        (r, b"RCPT TO:<bad@x.test>", "550 5.1.1", Rcpt, false),
        (r, b"RSET", "250 2.0.0", Ready, false),
        (r, b"EHLO again", "250", Ready, false),
        (r, b"NOOP", "250 2.0.0", Rcpt, false),
        (r, b"VRFY r1", "252 2.5.0", Rcpt, false),
        (r, b"QUIT", "221 2.0.0", Closed, false),
        (r, b"MAIL FROM:<a@x.test>", "503 5.5.1", Rcpt, true),
        (r2, b"RCPT TO:<r3@x.test>", "452 4.5.3", Rcpt, false),
    ];
    for (prefix, line, status, next, is_error) in cases {
        let mut p = Fake::default();
        let mut s = session_after(prefix, &mut p);
        let a = s.handle_line(line, &mut p);
        let what = format!("{prefix:?} then {:?}", String::from_utf8_lossy(line));
        assert_eq!(a.reply.status(), *status, "{what}");
        assert_eq!(s.state(), *next, "{what}");
        assert_eq!(
            p.protocol_errors.len(),
            usize::from(*is_error),
            "{what}: {:?}",
            p.protocol_errors
        );
        let want_then = match next {
            Closed => Then::Close,
            Data => Then::ReadData(DataMode::Receive),
            _ => Then::Continue,
        };
        assert_eq!(a.then, want_then, "{what}");
    }
}

#[test]
fn ehlo_advertises_extensions_and_size() {
    let mut p = Fake::default();
    let mut s = session_after(&[], &mut p);
    let wire = s.handle_line(b"EHLO c", &mut p).reply.to_string();
    for ext in [
        "250-PIPELINING\r\n",
        "250-8BITMIME\r\n",
        "250-SIZE 1000\r\n",
        "250-ENHANCEDSTATUSCODES\r\n",
    ] {
        assert!(wire.contains(ext), "{ext:?} missing from {wire:?}");
    }
    assert!(wire.ends_with("250 SMTPUTF8\r\n"), "{wire:?}");
}

#[test]
fn greeting_faults() {
    let mut p = Fake {
        greeting: Err(Reply::new(421, "4.3.2", "go away")),
        ..Fake::default()
    };
    let mut s = Session::new(SessionLimits::default());
    let a = s.greeting(&mut p);
    assert_eq!(
        (a.reply.status(), a.then, s.state()),
        ("421 4.3.2".into(), Then::Close, State::Closed)
    );

    p.greeting = Err(Reply::new(554, "5.7.1", "no service"));
    let mut s = Session::new(SessionLimits::default());
    let a = s.greeting(&mut p);
    assert_eq!(
        (a.reply.status(), a.then, s.state()),
        ("554 5.7.1".into(), Then::Continue, State::Refused)
    );
    for line in [EHLO, MAIL, "NOOP"] {
        assert_eq!(
            s.handle_line(line.as_bytes(), &mut p).reply.status(),
            "503 5.5.1"
        );
    }
    let a = s.handle_line(b"QUIT", &mut p);
    assert_eq!((a.reply.code, a.then), (221, Then::Close));
}

#[test]
fn policy_rejections_at_mail_and_data() {
    let mut p = Fake {
        mail: Err(Reply::new(451, "4.3.0", "later")),
        ..Fake::default()
    };
    let mut s = session_after(&[EHLO], &mut p);
    assert_eq!(
        s.handle_line(MAIL.as_bytes(), &mut p).reply.status(),
        "451 4.3.0"
    );
    assert_eq!(s.state(), State::Ready);

    let mut p = Fake {
        data: Err(Reply::new(554, "5.7.1", "no")),
        ..Fake::default()
    };
    let mut s = session_after(&[EHLO, MAIL, RCPT], &mut p);
    let a = s.handle_line(b"DATA", &mut p);
    assert_eq!(
        (a.reply.status(), a.then),
        ("554 5.7.1".into(), Then::Continue)
    );
    assert_eq!(
        s.state(),
        State::Ready,
        "a failed DATA ends the transaction"
    );

    let mut p = Fake {
        data: Ok(DataMode::DropMidway),
        ..Fake::default()
    };
    let mut s = session_after(&[EHLO, MAIL, RCPT], &mut p);
    assert_eq!(
        s.handle_line(b"DATA", &mut p).then,
        Then::ReadData(DataMode::DropMidway)
    );
}

#[test]
fn rcpt_delay_is_passed_on_and_envelope_keeps_order() {
    let mut p = Fake::default();
    let mut s = session_after(&[EHLO, MAIL], &mut p);
    let a = s.handle_line(b"RCPT TO:<r2@x.test>", &mut p);
    assert_eq!((a.delay, a.records.len()), (Duration::from_millis(7), 0));
    let a = s.handle_line(b"RCPT TO:<bad1@x.test>", &mut p);
    let recorded: Vec<_> = a.records.iter().map(|d| d.recipient.as_str()).collect();
    assert_eq!(
        recorded,
        ["bad1@x.test"],
        "the policy's entries ride on the action"
    );
    s.handle_line(b"RCPT TO:<r1@x.test>", &mut p);
    s.handle_line(b"DATA", &mut p);
    let env = s.finish_data().expect("envelope");
    assert_eq!(s.state(), State::Ready);
    let got: Vec<_> = env
        .rcpts
        .iter()
        .map(|r| (r.addr.as_str(), r.attempt))
        .collect();
    assert_eq!(env.from, "shop@x.test");
    assert_eq!(got, [("r2@x.test", 1), ("r1@x.test", 3)]);
}

#[test]
fn too_many_errors_closes_with_421() {
    let mut p = Fake::default();
    let mut s = session_after(&[EHLO], &mut p);
    for _ in 0..3 {
        assert_eq!(s.handle_line(b"BOGUS", &mut p).reply.code, 500);
    }
    let a = s.line_too_long(&mut p);
    assert_eq!(
        (a.reply.status(), a.then),
        ("421 4.7.0".into(), Then::Close)
    );
    assert_eq!(p.protocol_errors.len(), 4);
    assert!(
        p.protocol_errors[3].starts_with("500 5.5.2"),
        "{:?}",
        p.protocol_errors
    );
}

#[test]
fn size_rejection_is_recorded_as_rejection_not_protocol_error() {
    let mut p = Fake::default();
    let mut s = session_after(&[EHLO], &mut p);
    s.handle_line(b"MAIL FROM:<a@x.test> SIZE=5000", &mut p);
    assert_eq!(p.rejections, ["552 5.3.4 [MAIL FROM:<a@x.test> SIZE=5000]"]);
    assert!(p.protocol_errors.is_empty());
}

/// A 421 at RCPT closes the connection (RFC 5321 §3.8); a held RCPT is never answered and the
/// driver records its entry when the client hangs up.
#[test]
fn an_outage_at_rcpt_closes_or_holds() {
    let mut p = Fake::default();
    let mut s = session_after(&[EHLO, MAIL], &mut p);
    let a = s.handle_line(b"RCPT TO:<down@x.test>", &mut p);
    assert_eq!(
        (a.reply.code, a.then, a.records.len()),
        (421, Then::Close, 1)
    );
    assert_eq!(s.state(), State::Closed);

    let mut s = session_after(&[EHLO, MAIL], &mut p);
    let a = s.handle_line(b"RCPT TO:<hang@x.test>", &mut p);
    assert_eq!((a.then, a.records.len()), (Then::Hold, 1));
    assert_eq!(s.state(), State::Closed);
}
