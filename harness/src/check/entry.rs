//! The checkers' view of one ledger entry: what some rule reads, and nothing more.
//!
//! The fakes' [`LedgerEntry`] carries everything a provider saw — e-mail bodies and HTML, every
//! header, callback URLs and idempotency tokens — and `ledger.jsonl` keeps all of it on disk as
//! it is recorded. In memory a run of 100,000 recipients holds half a million entries, so each
//! is an [`Entry`]: times, ids and outcomes, strings interned ([`Name`], one copy of each
//! address, status or fault however many entries repeat it), the length of an SMS body instead
//! of the body, and for an e-mail only the headers a `headers` rule can flag and, for the few
//! recipients whose name the escaping rule judges, the HTML part. Must never drop a field a
//! checker reads: a checker judges an [`Entry`] exactly as it judged the whole entry.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use arcstr::ArcStr;

use mock_providers::ledger::{CallbackVariant, EntryKind, LedgerEntry, Outcome, Provider};

/// An interned string: one shared copy per distinct text ([`Interner`]). Reads as a `&str`.
/// One word (a thin pointer to the count, length and text in one allocation), and so is an
/// `Option<Name>`: an [`Entry`] holds seven.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(ArcStr);

impl Name {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl From<&str> for Name {
    /// A copy of its own, shared by its clones only (not interned).
    fn from(s: &str) -> Name {
        Name(ArcStr::from(s))
    }
}

impl From<String> for Name {
    fn from(s: String) -> Name {
        Name(ArcStr::from(s))
    }
}

impl serde::Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Name, D::Error> {
        String::deserialize(d).map(Name::from)
    }
}

impl schemars::JsonSchema for Name {
    fn schema_name() -> String {
        "Name".into()
    }
    fn is_referenceable() -> bool {
        false
    }
    fn json_schema(g: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        String::json_schema(g)
    }
}

/// The one copy of each string the entries of a run share. Clones are handles on one table: the
/// ledger's entries and the status view intern through the same one, so a message id or an
/// address a provider recorded and the stack reported is held once.
#[derive(Clone, Default)]
pub struct Interner {
    names: Arc<Mutex<HashSet<ArcStr>>>,
}

impl Interner {
    pub fn name(&self, s: &str) -> Name {
        let mut names = self.names.lock().expect("interner poisoned");
        if let Some(n) = names.get(s) {
            return Name(n.clone());
        }
        let n = ArcStr::from(s);
        names.insert(n.clone());
        Name(n)
    }

    /// The shared copy of `s` when the table has one; never adds one (for strings a stack
    /// under test reports, which it could make unique every time it is asked).
    pub fn shared(&self, s: &str) -> Option<Name> {
        let names = self.names.lock().expect("interner poisoned");
        names.get(s).map(|n| Name(n.clone()))
    }

    /// Makes `n` the copy of its text that later entries share (the expected deliveries'
    /// addresses, so that the ledger's entries and `expected` hold one copy between them).
    pub fn adopt(&self, n: &Name) {
        let mut names = self.names.lock().expect("interner poisoned");
        if !names.contains(n.as_str()) {
            names.insert(n.0.clone());
        }
    }

    fn opt(&self, s: Option<&str>) -> Option<Name> {
        s.map(|s| self.name(s))
    }
}

/// What the checkers read of an SMTP message: the decoded Subject, the HTML part when kept, and
/// the envelope and headers when the message was accepted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Content {
    pub subject: Option<Box<str>>,
    /// Kept only for the recipients [`Keep::html`] names (the escaping rule's).
    pub html: Option<Box<str>>,
    pub email: Option<EmailHeaders>,
}

/// Of an accepted e-mail: the envelope recipients and the header fields a `headers` rule can
/// flag ([`super::headers::judged_field`]); every other header is left out. Names and values
/// are interned: `From`, the field names and most dates repeat, `To` is the recipient's address
/// and `Message-ID` the entry's message id, so a hundred thousand e-mails share most of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EmailHeaders {
    pub rcpt_to: Vec<Name>,
    pub headers: Vec<Field>,
}

/// One header field of an e-mail, as written.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    pub name: Name,
    pub value: Name,
}

/// Which e-mails' HTML part an [`Entry`] keeps.
#[derive(Clone, Debug)]
pub enum Keep {
    /// Every one (tests, small ledgers).
    AllHtml,
    /// Those to these addresses (lowercase): the recipients whose names the escaping rule judges.
    HtmlOf(Arc<HashSet<String>>),
    /// None (`report DIR` renders no checker).
    NoHtml,
}

impl Keep {
    fn html(&self, recipient: &str) -> bool {
        match self {
            Keep::AllHtml => true,
            Keep::HtmlOf(set) => set.contains(&recipient.to_ascii_lowercase()),
            Keep::NoHtml => false,
        }
    }
}

/// One ledger entry as the checkers read it (see the module doc). Field names and meanings are
/// [`LedgerEntry`]'s.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub seq: u64,
    pub mono_ns: u64,
    pub received_ns: u64,
    pub started_ns: Option<u64>,
    /// [`LedgerEntry::wall`] as milliseconds since the Unix epoch (it is written to the
    /// millisecond); `None` when it is not RFC 3339.
    pub wall_ms: Option<i64>,
    pub recipient: Name,
    pub status: Name,
    pub error: Option<Name>,
    pub fault: Option<Name>,
    pub message_id: Option<Name>,
    pub payload_hash: Option<Name>,
    pub callback_status: Option<Name>,
    pub retry_after_ms: Option<u64>,
    pub peer: Option<SocketAddr>,
    /// The callback times, in milliseconds (saturating at 49 days).
    pub callback_late_ms: Option<u32>,
    pub callback_queued_ms: Option<u32>,
    pub callback_took_ms: Option<u32>,
    pub attempt: u32,
    /// Characters of [`LedgerEntry::body`] (0 without one): `headers`' SMS length rule.
    pub body_chars: u32,
    pub callback_response: Option<u16>,
    pub provider: Provider,
    pub kind: EntryKind,
    pub outcome: Outcome,
    pub callback_variant: Option<CallbackVariant>,
    pub client_hung_up: bool,
    /// SMTP entries with a subject, HTML or envelope.
    pub content: Option<Box<Content>>,
}

fn saturate(ms: u64) -> u32 {
    u32::try_from(ms).unwrap_or(u32::MAX)
}

impl Entry {
    /// What the checkers need of `e`; strings through `names`, the HTML part as `keep` says.
    pub fn of(e: &LedgerEntry, names: &Interner, keep: &Keep) -> Entry {
        let wall_ms = chrono::DateTime::parse_from_rfc3339(&e.wall)
            .ok()
            .map(|w| w.timestamp_millis());
        let html = e
            .html
            .as_deref()
            .filter(|_| keep.html(&e.recipient))
            .map(Box::from);
        let email = e.email.as_deref().map(|d| EmailHeaders {
            rcpt_to: d.rcpt_to.iter().map(|a| names.name(a)).collect(),
            headers: d
                .headers
                .iter()
                .filter(|h| super::headers::judged_field(h))
                .map(|h| Field {
                    name: names.name(&h.name),
                    value: names.name(&h.value),
                })
                .collect(),
        });
        let content = (e.subject.is_some() || html.is_some() || email.is_some()).then(|| {
            Box::new(Content {
                subject: e.subject.as_deref().map(Box::from),
                html,
                email,
            })
        });
        Entry {
            seq: e.seq,
            mono_ns: e.mono_ns,
            received_ns: e.received_ns,
            started_ns: e.started_ns,
            wall_ms,
            recipient: names.name(&e.recipient),
            status: names.name(&e.status),
            error: names.opt(e.error.as_deref()),
            fault: names.opt(e.fault.as_deref()),
            message_id: names.opt(e.message_id.as_deref()),
            payload_hash: names.opt(e.payload_hash.as_deref()),
            callback_status: names.opt(e.callback_status.as_deref()),
            retry_after_ms: e.retry_after_ms,
            peer: e.peer,
            callback_late_ms: e.callback_late_ms.map(saturate),
            callback_queued_ms: e.callback_queued_ms.map(saturate),
            callback_took_ms: e.callback_took_ms.map(saturate),
            attempt: e.attempt,
            body_chars: e
                .body
                .as_deref()
                .map_or(0, |b| u32::try_from(b.chars().count()).unwrap_or(u32::MAX)),
            callback_response: e.callback_response,
            provider: e.provider,
            kind: e.kind,
            outcome: e.outcome,
            callback_variant: e.callback_variant,
            client_hung_up: e.client_hung_up,
            content,
        }
    }

    /// [`Entry::of`] with nothing shared and every HTML part kept: for tests.
    #[cfg(test)]
    pub fn alone(e: &LedgerEntry) -> Entry {
        Entry::of(e, &Interner::default(), &Keep::AllHtml)
    }

    /// The decoded Subject of an SMTP message.
    pub fn subject(&self) -> Option<&str> {
        self.content.as_ref()?.subject.as_deref()
    }

    /// The HTML part of an e-mail, when kept.
    pub fn html(&self) -> Option<&str> {
        self.content.as_ref()?.html.as_deref()
    }

    /// The envelope and flaggable headers of an accepted e-mail.
    pub fn email(&self) -> Option<&EmailHeaders> {
        self.content.as_ref()?.email.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use mock_providers::ledger::{EmailDetail, HeaderField};

    use super::*;

    fn accepted_email(to: &str) -> LedgerEntry {
        let mut e = LedgerEntry::draft(Provider::Smtp, EntryKind::Send, to);
        e.outcome = Outcome::Accepted;
        e.wall = "2026-12-02T10:00:00.123Z".into();
        e.body = Some("text part ".repeat(200));
        e.html = Some("<p>html part</p>".repeat(200));
        e.subject = Some("Welcome".into());
        e.callback_url = Some("http://127.0.0.1:1/v1/events".into());
        e.idempotency_key = Some("<id@example.test>".into());
        let field = |name: &str, value: &str| HeaderField {
            name: name.into(),
            value: value.into(),
        };
        e.email = Some(Box::new(EmailDetail {
            mail_from: "ting@example.test".into(),
            rcpt_to: vec![to.into()],
            headers: vec![
                field("From", "ting@example.test"),
                field("To", to),
                field("Subject", "Welcome"),
                field("Content-Type", "multipart/alternative; boundary=\"b\""),
                field("X-Mailer", "stack 1.0"),
                field("X-Trace", "a\0b"),
            ],
            size: 9_000,
            sha256: "0".repeat(64),
            body_sha256: "1".repeat(64),
        }));
        e
    }

    /// What a run keeps in memory per entry is bounded whatever the provider sent: the entry's
    /// own size, and for an e-mail neither its body nor (unless the escaping rule judges its
    /// recipient) its HTML, nor a header no rule can flag.
    #[test]
    fn an_email_entry_keeps_no_body_and_only_the_judged_headers() {
        assert!(
            std::mem::size_of::<Entry>() <= 216,
            "Entry grew to {} bytes",
            std::mem::size_of::<Entry>()
        );
        let e = accepted_email("r1@example.test");
        let names = Interner::default();
        let none = Keep::HtmlOf(Arc::new(HashSet::new()));
        let kept = Entry::of(&e, &names, &none);
        assert_eq!(kept.body_chars, 2_000);
        assert_eq!(kept.html(), None, "HTML of a recipient no rule reads");
        assert_eq!(kept.subject(), Some("Welcome"));
        let email = kept.email().expect("an accepted e-mail keeps its envelope");
        assert_eq!(email.rcpt_to, ["r1@example.test"]);
        let names_kept: Vec<&str> = email.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names_kept, ["From", "To", "Subject", "X-Trace"]);
        assert_eq!(kept.wall_ms, Some(1_796_205_600_123));
        // The strings of one recipient are one copy, however many entries repeat them.
        let again = Entry::of(&e, &names, &none);
        assert!(ArcStr::ptr_eq(&kept.recipient.0, &again.recipient.0));

        let judged = Keep::HtmlOf(Arc::new(["r1@example.test".to_string()].into()));
        let kept = Entry::of(&e, &names, &judged);
        assert_eq!(
            kept.html(),
            e.html.as_deref(),
            "the escaping rule's recipient"
        );
    }
}
