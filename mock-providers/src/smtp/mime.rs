//! Decoding an accepted message (RFC 5322 + MIME) into what the ledger keeps.
//!
//! Decoding uses `mail-parser`, not hand-written code: the payload hash must be the same whatever
//! boundaries, transfer encodings (quoted-printable, base64, 8bit) or header folding the sender
//! picked, so it is computed over the *decoded* subject, text part and HTML part. This module must
//! never fail: a message it cannot parse is kept with empty fields and still hashed.

use mail_parser::{MessageParser, PartType};
use sha2::{Digest, Sha256};

use crate::ledger::HeaderField;

/// The fields of an accepted message the fake provider remembers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedMessage {
    /// `Message-ID` without angle brackets (mail-parser strips them).
    pub message_id: Option<String>,
    /// Decoded `Subject` (RFC 2047 encoded-words resolved).
    pub subject: Option<String>,
    /// First address of `From`.
    pub from: Option<String>,
    /// Every address of `To`.
    pub to: Vec<String>,
    /// The first inline `text/plain` part, decoded, line endings normalised to `\n`.
    pub text: Option<String>,
    /// The first inline `text/html` part, decoded, line endings normalised to `\n`.
    pub html: Option<String>,
    /// The `X-Events-Url` header: where this message's delivery events go, overriding config.
    pub events_url: Option<String>,
    /// Every header field in order, as sent (see [`headers`]).
    pub headers: Vec<HeaderField>,
}

impl ParsedMessage {
    /// SHA-256 hex of `subject + "\0" + text + "\0" + html`, missing parts as empty strings.
    pub fn payload_hash(&self) -> String {
        payload_hash(
            self.subject.as_deref().unwrap_or(""),
            self.text.as_deref().unwrap_or(""),
            self.html.as_deref().unwrap_or(""),
        )
    }
}

/// The e-mail payload hash over decoded content; the harness computes the same from a template.
pub fn payload_hash(subject: &str, text: &str, html: &str) -> String {
    let mut h = Sha256::new();
    h.update(subject.as_bytes());
    h.update([0]);
    h.update(text.as_bytes());
    h.update([0]);
    h.update(html.as_bytes());
    hex::encode(h.finalize())
}

/// Parses the DATA of a message (dot-unstuffed, CRLF line endings).
pub fn parse(raw: &[u8]) -> ParsedMessage {
    let headers = headers(raw);
    let Some(msg) = MessageParser::default().parse(raw) else {
        return ParsedMessage {
            headers,
            ..ParsedMessage::default()
        };
    };
    // `body_text`/`body_html` convert between the two when a part is missing; the ledger wants
    // only what the sender actually sent, so take the parts themselves.
    let text = msg.text_bodies().find_map(|p| match &p.body {
        PartType::Text(t) => Some(normalise(t)),
        _ => None,
    });
    let html = msg.html_bodies().find_map(|p| match &p.body {
        PartType::Html(t) => Some(normalise(t)),
        _ => None,
    });
    ParsedMessage {
        message_id: msg.message_id().map(str::to_string),
        subject: msg.subject().map(str::to_string),
        from: msg
            .from()
            .and_then(|a| a.first())
            .and_then(|a| a.address())
            .map(str::to_string),
        to: msg
            .to()
            .map(|a| {
                a.iter()
                    .filter_map(|a| a.address())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
        text,
        html,
        events_url: msg
            .header_raw("X-Events-Url")
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty()),
        headers,
    }
}

/// Splits a message (CRLF line endings) into its header section and its body: the body starts
/// after the first empty line. A message without an empty line is all headers.
pub fn split(raw: &[u8]) -> (&[u8], &[u8]) {
    if raw.starts_with(b"\r\n") {
        return (&[], &raw[2..]);
    }
    match raw.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) => (&raw[..i + 2], &raw[i + 4..]),
        None => (raw, &[]),
    }
}

/// Every field of the header section, in order: the name as written, the value unfolded (the
/// CRLF before each continuation line removed, its whitespace kept) and without the whitespace
/// after the colon. Values are not decoded (RFC 2047); bytes that are not UTF-8 are replaced.
/// Lines that are neither a `name:` field nor a continuation are skipped. Written here, not taken
/// from `mail-parser`, because the ledger wants the names as sent and every field, UTF-8 or not.
pub fn headers(raw: &[u8]) -> Vec<HeaderField> {
    let (section, _) = split(raw);
    let mut out: Vec<HeaderField> = Vec::new();
    let mut continuing = false;
    for line in section.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        if matches!(line[0], b' ' | b'\t') {
            if let (true, Some(last)) = (continuing, out.last_mut()) {
                last.value.push_str(&String::from_utf8_lossy(line));
            }
            continue;
        }
        continuing = false;
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let name = &line[..colon];
        // RFC 5322 §3.6.8: printable US-ASCII except ':'.
        if name.is_empty() || !name.iter().all(|b| (33..=126).contains(b)) {
            continue;
        }
        let value = &line[colon + 1..];
        let start = value
            .iter()
            .position(|b| !matches!(b, b' ' | b'\t'))
            .unwrap_or(value.len());
        out.push(HeaderField {
            name: String::from_utf8_lossy(name).into_owned(),
            value: String::from_utf8_lossy(&value[start..]).into_owned(),
        });
        continuing = true;
    }
    out
}

fn normalise(s: &str) -> String {
    s.replace("\r\n", "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const QP: &str = "Message-ID: <abc@x.test>\r\n\
        Subject: =?utf-8?q?Order_A-1_=E5=B1=B1?=\r\n\
        From: Shop <shop@x.test>\r\n\
        To: a@x.test, B <b@x.test>\r\n\
        X-Events-Url: http://127.0.0.1:9/events\r\n\
        MIME-Version: 1.0\r\n\
        Content-Type: multipart/alternative; boundary=\"AAA\"\r\n\
        \r\n\
        --AAA\r\n\
        Content-Type: text/plain; charset=utf-8\r\n\
        Content-Transfer-Encoding: quoted-printable\r\n\
        \r\n\
        Hi Ana & =E5=B1=B1=E7=94=B0\r\n\
        line two\r\n\
        --AAA\r\n\
        Content-Type: text/html; charset=utf-8\r\n\
        Content-Transfer-Encoding: quoted-printable\r\n\
        \r\n\
        <p>Hi Ana &amp; =E5=B1=B1=E7=94=B0</p>\r\n\
        --AAA--\r\n";

    const B64: &str = "Message-ID: <other@x.test>\r\n\
        Subject: Order A-1 \u{5c71}\r\n\
        MIME-Version: 1.0\r\n\
        Content-Type: multipart/alternative; boundary=zzz-different\r\n\
        \r\n\
        --zzz-different\r\n\
        Content-Type: text/plain; charset=utf-8\r\n\
        Content-Transfer-Encoding: base64\r\n\
        \r\n\
        SGkgQW5hICYg5bGx55SwCmxpbmUgdHdv\r\n\
        --zzz-different\r\n\
        Content-Type: text/html; charset=utf-8\r\n\
        Content-Transfer-Encoding: 8bit\r\n\
        \r\n\
        <p>Hi Ana &amp; \u{5c71}\u{7530}</p>\r\n\
        --zzz-different--\r\n";

    #[test]
    fn decodes_headers_and_parts() {
        let p = parse(QP.as_bytes());
        assert_eq!(p.message_id.as_deref(), Some("abc@x.test"));
        assert_eq!(p.subject.as_deref(), Some("Order A-1 \u{5c71}"));
        assert_eq!(p.from.as_deref(), Some("shop@x.test"));
        assert_eq!(p.to, vec!["a@x.test".to_string(), "b@x.test".to_string()]);
        assert_eq!(
            p.text.as_deref(),
            Some("Hi Ana & \u{5c71}\u{7530}\nline two")
        );
        assert_eq!(
            p.html.as_deref(),
            Some("<p>Hi Ana &amp; \u{5c71}\u{7530}</p>")
        );
        assert_eq!(p.events_url.as_deref(), Some("http://127.0.0.1:9/events"));
    }

    #[test]
    fn hash_ignores_encoding_and_boundaries_but_not_content() {
        let a = parse(QP.as_bytes());
        let b = parse(B64.as_bytes());
        assert_eq!(a.payload_hash(), b.payload_hash());
        let changed = B64.replace("</p>", "!</p>");
        assert_ne!(a.payload_hash(), parse(changed.as_bytes()).payload_hash());
    }

    #[test]
    fn headers_keep_order_names_and_unfold_values() {
        let raw = b"From: Shop <shop@x.test>\r\n\
            to: a@x.test,\r\n\
            \t b@x.test\r\n\
            Subject: =?utf-8?q?caf=C3=A9?=\r\n\
            Received: from a\r\n\
            Received: from b\r\n\
            X-Bin: \xff\r\n\
            not a header line\r\n\
            Empty:\r\n\
            \r\n\
            Body-Like: not a header\r\n";
        let got: Vec<(String, String)> = headers(raw)
            .into_iter()
            .map(|h| (h.name, h.value))
            .collect();
        let want = [
            ("From", "Shop <shop@x.test>"),
            ("to", "a@x.test,\t b@x.test"),
            ("Subject", "=?utf-8?q?caf=C3=A9?="),
            ("Received", "from a"),
            ("Received", "from b"),
            ("X-Bin", "\u{fffd}"),
            ("Empty", ""),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(parse(raw).headers.len(), 7);
    }

    #[test]
    fn split_table() {
        // (message, header section, body)
        let cases: [(&[u8], &[u8], &[u8]); 4] = [
            (b"A: 1\r\n\r\nbody\r\n", b"A: 1\r\n", b"body\r\n"),
            (b"A: 1\r\n", b"A: 1\r\n", b""),
            (b"\r\nbody\r\n", b"", b"body\r\n"),
            (b"", b"", b""),
        ];
        for (raw, head, body) in cases {
            assert_eq!(
                split(raw),
                (head, body),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn plain_message_has_no_html_and_garbage_does_not_panic() {
        let p = parse(b"Subject: hi\r\n\r\nbody\r\n");
        assert_eq!(p.subject.as_deref(), Some("hi"));
        assert_eq!(p.text.as_deref(), Some("body\n"));
        assert_eq!(p.html, None);
        let _ = parse(b"\xff\xfe\x00\r\n\r\n--");
        let _ = parse(b"");
    }
}
