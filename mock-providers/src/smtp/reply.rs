//! SMTP replies: a basic code, an optional enhanced status code (RFC 3463) and text lines.
//!
//! Every reply the fake server writes is built here, so the wire format (`250-…` continuation
//! lines, `CRLF`) and the default enhanced code for each basic code live in one place. This module
//! must never decide *whether* to reply with something: that is the session's and the policy's job.

use std::fmt;

use crate::config::SmtpStage;

/// One SMTP reply, possibly multi-line (EHLO).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub code: u16,
    /// RFC 3463 enhanced status code such as `"4.3.0"`; `None` on the greeting and EHLO replies.
    pub enhanced: Option<String>,
    /// At least one line of text.
    pub lines: Vec<String>,
}

impl Reply {
    /// A single-line reply with an enhanced status code.
    pub fn new(code: u16, enhanced: &str, text: impl Into<String>) -> Reply {
        Reply {
            code,
            enhanced: Some(enhanced.to_string()),
            lines: vec![text.into()],
        }
    }

    /// A single-line reply without an enhanced status code (greeting, HELO).
    pub fn plain(code: u16, text: impl Into<String>) -> Reply {
        Reply {
            code,
            enhanced: None,
            lines: vec![text.into()],
        }
    }

    /// A multi-line reply without enhanced status codes (EHLO).
    pub fn multi(code: u16, lines: Vec<String>) -> Reply {
        debug_assert!(!lines.is_empty());
        Reply {
            code,
            enhanced: None,
            lines,
        }
    }

    /// `"451 4.3.0"` or `"220"`: what the ledger stores as `status`.
    pub fn status(&self) -> String {
        match &self.enhanced {
            Some(e) => format!("{} {e}", self.code),
            None => self.code.to_string(),
        }
    }

    /// The first line as written on the wire, without CRLF: what the ledger stores as `error`.
    pub fn first_line(&self) -> String {
        let text = self.lines.first().map(String::as_str).unwrap_or("");
        format!("{} {text}", self.status())
    }

    /// 2yz and 3yz.
    pub fn is_positive(&self) -> bool {
        self.code < 400
    }

    /// 4yz: the sender may retry.
    pub fn is_transient(&self) -> bool {
        (400..500).contains(&self.code)
    }

    /// The wire form, every line ending in CRLF.
    pub fn to_wire(&self) -> Vec<u8> {
        self.to_string().into_bytes()
    }

    pub fn syntax(text: impl Into<String>) -> Reply {
        Reply::new(500, "5.5.2", text)
    }

    pub fn bad_args(text: impl Into<String>) -> Reply {
        Reply::new(501, "5.5.4", text)
    }

    pub fn bad_sequence(text: impl Into<String>) -> Reply {
        Reply::new(503, "5.5.1", text)
    }

    pub fn ok(text: impl Into<String>) -> Reply {
        Reply::new(250, "2.0.0", text)
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let last = self.lines.len().saturating_sub(1);
        for (i, line) in self.lines.iter().enumerate() {
            let sep = if i == last { ' ' } else { '-' };
            match &self.enhanced {
                Some(e) => write!(f, "{}{sep}{e} {line}\r\n", self.code)?,
                None => write!(f, "{}{sep}{line}\r\n", self.code)?,
            }
        }
        Ok(())
    }
}

/// The enhanced status code used for an injected fault whose profile does not name one.
pub fn default_enhanced(stage: SmtpStage, code: u16) -> String {
    let s = match (stage, code) {
        (_, 421) => "4.3.2",
        (_, 450) => "4.2.1",
        (_, 451) => "4.3.0",
        (_, 452) => "4.3.1",
        (SmtpStage::Rcpt, 550) => "5.1.1",
        (_, 550) => "5.7.1",
        (_, 551) => "5.1.6",
        (SmtpStage::DataEnd, 552) => "5.3.4",
        (_, 552) => "5.2.2",
        (SmtpStage::Mail, 553) => "5.1.7",
        (_, 553) => "5.1.3",
        (_, 554) => "5.7.1",
        (_, c) if (400..500).contains(&c) => "4.0.0",
        _ => "5.0.0",
    };
    s.to_string()
}

/// Human text for an injected fault reply; says it was injected so logs are not misread.
pub fn fault_text(code: u16) -> &'static str {
    match code {
        421 => "service not available, closing transmission channel (injected)",
        450 => "mailbox unavailable, try again later (injected)",
        451 => "local error in processing, try again later (injected)",
        452 => "insufficient system storage (injected)",
        550 => "mailbox unavailable (injected)",
        551 => "user not local (injected)",
        552 => "exceeded storage allocation (injected)",
        553 => "mailbox name not allowed (injected)",
        554 => "transaction failed (injected)",
        _ => "rejected (injected)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format() {
        let cases: &[(Reply, &str)] = &[
            (Reply::ok("OK"), "250 2.0.0 OK\r\n"),
            (Reply::plain(220, "hi ESMTP"), "220 hi ESMTP\r\n"),
            (
                Reply::multi(
                    250,
                    vec!["host".into(), "PIPELINING".into(), "SIZE 10".into()],
                ),
                "250-host\r\n250-PIPELINING\r\n250 SIZE 10\r\n",
            ),
        ];
        for (reply, wire) in cases {
            assert_eq!(&reply.to_string(), wire);
        }
    }

    #[test]
    fn default_enhanced_codes() {
        use SmtpStage::*;
        let cases = [
            (Greeting, 421, "4.3.2"),
            (Mail, 451, "4.3.0"),
            (Rcpt, 452, "4.3.1"),
            (Rcpt, 550, "5.1.1"),
            (Mail, 550, "5.7.1"),
            (Data, 554, "5.7.1"),
            (DataEnd, 552, "5.3.4"),
            (Rcpt, 552, "5.2.2"),
            (Rcpt, 450, "4.2.1"),
            (Rcpt, 551, "5.1.6"),
            (Mail, 553, "5.1.7"),
            (Rcpt, 553, "5.1.3"),
            (Greeting, 554, "5.7.1"),
        ];
        for (stage, code, want) in cases {
            assert_eq!(default_enhanced(stage, code), want, "{stage:?} {code}");
        }
    }
}
