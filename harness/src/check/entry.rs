//! The checkers' view of one ledger entry: what some rule reads, and nothing more.
//!
//! The fakes' [`LedgerEntry`] carries everything a provider saw — e-mail bodies and HTML, every
//! header, callback URLs and idempotency tokens — and `ledger.jsonl` keeps all of it on disk as
//! it is recorded. In memory a run of 100,000 recipients holds two thirds of a million entries,
//! so each is an [`Entry`]: times, ids and outcomes, strings interned ([`Name`], one copy of
//! each address, status or fault however many entries repeat it), the length of an SMS body
//! instead of the body, and for an e-mail only the headers a `headers` rule can flag and, for
//! the few recipients whose name the escaping rule judges, the HTML part. Must never drop a
//! field a checker reads: a checker judges an [`Entry`] exactly as it judged the whole entry.

use std::collections::HashSet;
use std::fmt;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};

use arcstr::ArcStr;

use mock_providers::ledger::{CallbackVariant, EntryKind, LedgerEntry, Outcome, Provider};

use super::PayloadHash;

/// An interned string: one shared copy per distinct text ([`Interner`]). Reads as a `&str`.
/// One word (a thin pointer to the count, length and text in one allocation), and so is an
/// `Option<Name>`: an [`Entry`] holds four inline.
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

/// What few entries have, kept apart so that the rest do not pay for it: an SMTP message's
/// Subject and envelope and its start, a send's error, fault and `Retry-After`; and behind one
/// more pointer ([`Rare`]) what fewer still have. An accepted e-mail (a third of a run's sends)
/// has an `Extra` and no `Rare`: 88 bytes.
#[derive(Clone, Debug, Default, PartialEq)]
struct Extra {
    error: Option<Name>,
    fault: Option<Name>,
    started_ns: Packed<u64>,
    retry_after_ms: Packed<u64>,
    subject: Option<Box<str>>,
    email: Option<EmailHeaders>,
    rare: Option<Box<Rare>>,
}

impl Extra {
    fn is_empty(&self) -> bool {
        *self == Extra::default()
    }
}

/// What almost no entry has: a peer that is not IPv4, an HTML part (kept for the few recipients
/// whose names the escaping rule judges), and the other kind's fields on an entry that has both
/// (no fake writes such an entry; a ledger read back could).
#[derive(Clone, Debug, Default, PartialEq)]
struct Rare {
    peer: Option<SocketAddr>,
    /// Kept only for the recipients [`Keep::html`] names (the escaping rule's).
    html: Option<Box<str>>,
    send: Option<SendPart>,
    report: Option<ReportPart>,
}

/// Of an accepted e-mail: the envelope recipients and the header fields a `headers` rule can
/// flag ([`super::headers::judged_fields`]); every other header is left out. Names and values
/// are interned: the field names repeat and `To` is the recipient's address, so a hundred
/// thousand e-mails share most of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EmailHeaders {
    pub rcpt_to: Box<[Name]>,
    pub headers: Box<[Field]>,
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
/// [`LedgerEntry`]'s. What every entry has is inline; a send's fields and a report's share one
/// slot ([`Part`], by the entry's kind), optional numbers are kept in their own width with one
/// value for none, an IPv4 peer in one word, and what few entries have behind one pointer
/// ([`Extra`]); all read through methods of the fields' names. 104 bytes an entry, where plain
/// fields took 216.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub seq: u64,
    pub mono_ns: u64,
    pub received_ns: u64,
    /// [`LedgerEntry::wall`] as milliseconds since the Unix epoch (it is written to the
    /// millisecond); none when it is not RFC 3339.
    wall_ms: Packed<i64>,
    pub recipient: Name,
    pub status: Name,
    pub message_id: Option<Name>,
    pub callback_status: Option<Name>,
    peer: PeerV4,
    part: Part,
    pub attempt: u32,
    pub provider: Provider,
    pub kind: EntryKind,
    pub outcome: Outcome,
    pub client_hung_up: bool,
    extra: Option<Box<Extra>>,
}

/// The fields only one kind of entry has: a send's, or a delivery report's and a poll's.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Part {
    Send(SendPart),
    Report(ReportPart),
}

/// A send's payload hash and body length, in 32-bit words: aligned to 4, it and a
/// [`ReportPart`] fit one 16-byte slot with the tag.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct SendPart {
    /// [`PayloadHash::bits`], high word first; 0 for none.
    hash: [u32; 2],
    /// Characters of [`LedgerEntry::body`] (0 without one): `headers`' SMS length rule.
    body_chars: u32,
}

impl SendPart {
    fn payload_hash(self) -> Option<PayloadHash> {
        let [hi, lo] = self.hash;
        PayloadHash::from_bits(u64::from(hi) << 32 | u64::from(lo))
    }
}

/// A callback try's times (milliseconds, saturating at 49 days), answer and variant.
#[derive(Clone, Copy, Debug, PartialEq)]
struct ReportPart {
    late_ms: Packed<u32>,
    queued_ms: Packed<u32>,
    took_ms: Packed<u32>,
    response: Packed<u16>,
    variant: Option<CallbackVariant>,
}

impl Default for ReportPart {
    fn default() -> ReportPart {
        ReportPart {
            late_ms: None.into(),
            queued_ms: None.into(),
            took_ms: None.into(),
            response: None.into(),
            variant: None,
        }
    }
}

/// A number type with a value no entry records, which stands for "none" ([`Packed`]).
trait Unset: Copy + PartialEq {
    /// The value that means none.
    const UNSET: Self;
    /// What a recorded [`Unset::UNSET`] is kept as: the nearest value, one unit off (a time
    /// 584 years out, a wait of 49 days or of 584 million years).
    const NEAREST: Self;
}

impl Unset for i64 {
    const UNSET: i64 = i64::MIN;
    const NEAREST: i64 = i64::MIN + 1;
}

impl Unset for u64 {
    const UNSET: u64 = u64::MAX;
    const NEAREST: u64 = u64::MAX - 1;
}

impl Unset for u32 {
    const UNSET: u32 = u32::MAX;
    const NEAREST: u32 = u32::MAX - 1;
}

impl Unset for u16 {
    const UNSET: u16 = u16::MAX;
    const NEAREST: u16 = u16::MAX - 1;
}

/// An optional number in the width of the number: half an `Option`'s size for the wide ones.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Packed<T: Unset>(T);

impl<T: Unset> Packed<T> {
    fn get(self) -> Option<T> {
        (self.0 != T::UNSET).then_some(self.0)
    }
}

impl<T: Unset> Default for Packed<T> {
    fn default() -> Packed<T> {
        Packed(T::UNSET)
    }
}

impl<T: Unset> From<Option<T>> for Packed<T> {
    fn from(v: Option<T>) -> Packed<T> {
        match v {
            None => Packed(T::UNSET),
            Some(x) if x == T::UNSET => Packed(T::NEAREST),
            Some(x) => Packed(x),
        }
    }
}

impl<T: Unset + fmt::Debug> fmt::Debug for Packed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.get(), f)
    }
}

/// A send's or poll's TCP peer when it is IPv4 (the fakes listen on IPv4 loopback), in one
/// word: bit 48 set, the address above the port. 0 is none (or a peer kept in [`Extra`]).
#[derive(Clone, Copy, PartialEq, Eq)]
struct PeerV4(u64);

impl PeerV4 {
    const SOME: u64 = 1 << 48;

    fn of(a: Option<SocketAddr>) -> PeerV4 {
        match a {
            Some(SocketAddr::V4(v4)) => {
                PeerV4(PeerV4::SOME | u64::from(u32::from(*v4.ip())) << 16 | u64::from(v4.port()))
            }
            _ => PeerV4(0),
        }
    }

    fn get(self) -> Option<SocketAddr> {
        (self.0 & PeerV4::SOME != 0).then(|| {
            let ip = std::net::Ipv4Addr::from((self.0 >> 16) as u32);
            SocketAddr::V4(SocketAddrV4::new(ip, self.0 as u16))
        })
    }
}

impl fmt::Debug for PeerV4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.get(), f)
    }
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
        let hash = e
            .payload_hash
            .as_deref()
            .map_or(0, |h| PayloadHash::of(h).bits());
        let send = SendPart {
            hash: [(hash >> 32) as u32, hash as u32],
            body_chars: e
                .body
                .as_deref()
                .map_or(0, |b| u32::try_from(b.chars().count()).unwrap_or(u32::MAX)),
        };
        let report = ReportPart {
            late_ms: e.callback_late_ms.map(saturate).into(),
            queued_ms: e.callback_queued_ms.map(saturate).into(),
            took_ms: e.callback_took_ms.map(saturate).into(),
            response: e.callback_response.into(),
            variant: e.callback_variant,
        };
        // The kind's part inline; the other kind's, when an entry has it, in `extra`.
        let (part, send_extra, report_extra) = if e.kind == EntryKind::Send {
            let other = (report != ReportPart::default()).then_some(report);
            (Part::Send(send), None, other)
        } else {
            let other = (send != SendPart::default()).then_some(send);
            (Part::Report(report), other, None)
        };
        let peer = PeerV4::of(e.peer);
        let rare = Rare {
            peer: e.peer.filter(|_| peer.get().is_none()),
            html: e
                .html
                .as_deref()
                .filter(|_| keep.html(&e.recipient))
                .map(Box::from),
            send: send_extra,
            report: report_extra,
        };
        let extra = Extra {
            error: names.opt(e.error.as_deref()),
            fault: names.opt(e.fault.as_deref()),
            started_ns: e.started_ns.into(),
            retry_after_ms: e.retry_after_ms.into(),
            subject: e.subject.as_deref().map(Box::from),
            email: e.email.as_deref().map(|d| EmailHeaders {
                rcpt_to: d.rcpt_to.iter().map(|a| names.name(a)).collect(),
                headers: super::headers::judged_fields(&d.headers)
                    .map(|h| Field {
                        name: names.name(&h.name),
                        value: names.name(&h.value),
                    })
                    .collect(),
            }),
            rare: (rare != Rare::default()).then(|| Box::new(rare)),
        };
        Entry {
            seq: e.seq,
            mono_ns: e.mono_ns,
            received_ns: e.received_ns,
            wall_ms: wall_ms.into(),
            recipient: names.name(&e.recipient),
            status: names.name(&e.status),
            message_id: names.opt(e.message_id.as_deref()),
            callback_status: names.opt(e.callback_status.as_deref()),
            peer,
            part,
            attempt: e.attempt,
            provider: e.provider,
            kind: e.kind,
            outcome: e.outcome,
            client_hung_up: e.client_hung_up,
            extra: (!extra.is_empty()).then(|| Box::new(extra)),
        }
    }

    /// [`Entry::of`] with nothing shared and every HTML part kept: for tests.
    #[cfg(test)]
    pub fn alone(e: &LedgerEntry) -> Entry {
        Entry::of(e, &Interner::default(), &Keep::AllHtml)
    }

    fn extra(&self) -> Option<&Extra> {
        self.extra.as_deref()
    }

    fn rare(&self) -> Option<&Rare> {
        self.extra()?.rare.as_deref()
    }

    fn send_part(&self) -> SendPart {
        match self.part {
            Part::Send(s) => s,
            Part::Report(_) => self.rare().and_then(|x| x.send).unwrap_or_default(),
        }
    }

    fn report_part(&self) -> ReportPart {
        match self.part {
            Part::Report(r) => r,
            Part::Send(_) => self.rare().and_then(|x| x.report).unwrap_or_default(),
        }
    }

    /// The provider's error text for a rejected send.
    pub fn error(&self) -> Option<&str> {
        self.extra()?.error.as_deref()
    }

    /// The fault the fakes injected into this request, when they did.
    pub fn fault(&self) -> Option<&str> {
        self.extra()?.fault.as_deref()
    }

    /// SMTP sends only: when their transaction began (`MAIL FROM` arrived), on the ledger clock.
    pub fn started_ns(&self) -> Option<u64> {
        self.extra()?.started_ns.get()
    }

    /// [`LedgerEntry::wall`] in milliseconds since the Unix epoch, when it is RFC 3339.
    pub fn wall_ms(&self) -> Option<i64> {
        self.wall_ms.get()
    }

    /// The sender's TCP address.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer.get().or_else(|| self.rare()?.peer)
    }

    /// The wait the provider asked for (`Retry-After`), in milliseconds.
    pub fn retry_after_ms(&self) -> Option<u64> {
        self.extra()?.retry_after_ms.get()
    }

    /// The first 64 bits of the send's payload hash ([`PayloadHash`]).
    pub fn payload_hash(&self) -> Option<PayloadHash> {
        self.send_part().payload_hash()
    }

    /// Characters of [`LedgerEntry::body`] (0 without one): `headers`' SMS length rule.
    pub fn body_chars(&self) -> u32 {
        self.send_part().body_chars
    }

    /// What happened to this callback try (genuine, duplicate, forged, ...).
    pub fn callback_variant(&self) -> Option<CallbackVariant> {
        self.report_part().variant
    }

    /// How late the fakes began this callback try against when it was due: their lateness.
    pub fn callback_late_ms(&self) -> Option<u32> {
        self.report_part().late_ms.get()
    }

    /// How long this callback try waited, once due, for one of the provider's connection slots.
    pub fn callback_queued_ms(&self) -> Option<u32> {
        self.report_part().queued_ms.get()
    }

    /// From writing this callback try's request to reading the whole answer (or giving up).
    pub fn callback_took_ms(&self) -> Option<u32> {
        self.report_part().took_ms.get()
    }

    /// The HTTP status the stack answered this callback with (none: no answer).
    pub fn callback_response(&self) -> Option<u16> {
        self.report_part().response.get()
    }

    /// The decoded Subject of an SMTP message.
    pub fn subject(&self) -> Option<&str> {
        self.extra()?.subject.as_deref()
    }

    /// The HTML part of an e-mail, when kept.
    pub fn html(&self) -> Option<&str> {
        self.rare()?.html.as_deref()
    }

    /// The envelope and flaggable headers of an accepted e-mail.
    pub fn email(&self) -> Option<&EmailHeaders> {
        self.extra()?.email.as_ref()
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
            std::mem::size_of::<Entry>() <= 104,
            "Entry grew to {} bytes",
            std::mem::size_of::<Entry>()
        );
        let extra = std::mem::size_of::<Extra>();
        assert!(extra <= 88, "Extra grew to {extra} bytes");
        let e = accepted_email("r1@example.test");
        let names = Interner::default();
        let none = Keep::HtmlOf(Arc::new(HashSet::new()));
        let kept = Entry::of(&e, &names, &none);
        assert_eq!(kept.body_chars(), 2_000);
        assert_eq!(kept.html(), None, "HTML of a recipient no rule reads");
        assert!(
            kept.rare().is_none(),
            "an accepted e-mail needs no rare part"
        );
        assert_eq!(kept.subject(), Some("Welcome"));
        let email = kept.email().expect("an accepted e-mail keeps its envelope");
        assert_eq!(*email.rcpt_to, ["r1@example.test"]);
        let names_kept: Vec<&str> = email.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names_kept, ["To", "X-Trace"]);
        // A field allowed once is kept, every copy, when the message repeats it.
        let mut twice = e.clone();
        let detail = twice.email.as_mut().unwrap();
        detail.headers.push(HeaderField {
            name: "SUBJECT".into(),
            value: "Welcome again".into(),
        });
        let kept_twice = Entry::of(&twice, &names, &none);
        let names_kept: Vec<&str> = kept_twice
            .email()
            .unwrap()
            .headers
            .iter()
            .map(|h| h.name.as_str())
            .collect();
        assert_eq!(names_kept, ["To", "Subject", "X-Trace", "SUBJECT"]);
        assert_eq!(kept.wall_ms(), Some(1_796_205_600_123));
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

    /// Packing loses nothing a checker could read: none stays none, the one value that means
    /// none in the packed width is kept one unit off, and a peer that is not IPv4 is kept whole.
    #[test]
    fn packed_numbers_and_peers_read_back() {
        let mut e = LedgerEntry::draft(Provider::Sms, EntryKind::Callback, "+15550100");
        let kept = Entry::alone(&e);
        assert_eq!(kept.started_ns(), None);
        assert_eq!(kept.retry_after_ms(), None);
        assert_eq!(kept.callback_response(), None);
        assert_eq!(kept.peer(), None);
        e.started_ns = Some(u64::MAX);
        e.retry_after_ms = Some(u64::MAX);
        e.callback_late_ms = Some(0);
        e.callback_response = Some(u16::MAX);
        let v6: SocketAddr = "[::1]:4242".parse().unwrap();
        e.peer = Some(v6);
        let kept = Entry::alone(&e);
        assert_eq!(kept.started_ns(), Some(u64::MAX - 1));
        assert_eq!(kept.retry_after_ms(), Some(u64::MAX - 1));
        assert_eq!(kept.callback_late_ms(), Some(0));
        assert_eq!(kept.callback_response(), Some(u16::MAX - 1));
        assert_eq!(kept.peer(), Some(v6));
        // A report's fields on a send, and a send's on a report, are kept too (no fake writes
        // such an entry; a ledger read back could).
        let mut send = LedgerEntry::draft(Provider::Sms, EntryKind::Send, "+15550100");
        send.payload_hash = Some("ab".repeat(32));
        send.body = Some("héllo".into());
        send.callback_response = Some(204);
        send.callback_variant = Some(CallbackVariant::Duplicate);
        let mut report = send.clone();
        report.kind = EntryKind::Callback;
        for both in [&send, &report] {
            let kept = Entry::alone(both);
            let hash = kept.payload_hash().map(|h| h.bits());
            assert_eq!(hash, Some(0xabab_abab_abab_abab), "{:?}", both.kind);
            assert_eq!(kept.body_chars(), 5);
            assert_eq!(kept.callback_response(), Some(204));
            assert_eq!(kept.callback_variant(), Some(CallbackVariant::Duplicate));
        }
        let kept = Entry::alone(&report);
        assert!(
            kept.rare().is_some(),
            "the send's fields beside the report's"
        );
        send.callback_response = None;
        send.callback_variant = None;
        assert!(
            Entry::alone(&send).extra.is_none(),
            "a plain send needs no extra"
        );

        e.peer = Some("127.0.0.1:40001".parse().unwrap());
        e.retry_after_ms = Some(1_000);
        let kept = Entry::alone(&e);
        assert_eq!(kept.peer(), e.peer);
        assert_eq!(kept.retry_after_ms(), Some(1_000));
    }
}
