//! The ground-truth ledger: every request and callback a fake provider saw, in arrival order.
//!
//! Entries are appended before the provider writes its response, so a sender killed between the
//! provider's commit and its own still shows up here. The ledger is in memory, bounded by the run,
//! queryable while the servers keep serving, and exported as JSON Lines.
//!
//! Entries are stored behind [`Arc`]s: a reader ([`Ledger::snapshot_shared`], the control API)
//! copies the pointers under the lock and serialises outside it, so a big ledger never stalls the
//! fakes appending to it. `seq` is strictly increasing for the life of the ledger, across
//! [`Ledger::clear`] too: a reader polling with `since` never sees a number twice.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::link::LinkFate;

/// How long a server waits, per accepted connection, for the [`Hook::on_connect`] hooks before it
/// serves the connection anyway: a slow hook delays one connection's first byte by at most this,
/// and never wedges a fake. The default of every new ledger; see
/// [`Ledger::set_connect_hook_timeout`] to change it per ledger.
pub const CONNECT_HOOK_TIMEOUT: Duration = Duration::from_millis(250);

/// Which fake provider wrote an entry.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    Line,
    Smtp,
    Sms,
}

impl Provider {
    /// Every provider, in [`Provider::index`] order.
    pub const ALL: [Provider; 3] = [Provider::Line, Provider::Smtp, Provider::Sms];

    /// Its position in [`Provider::ALL`]: for tables with one slot per provider.
    pub const fn index(self) -> usize {
        match self {
            Provider::Line => 0,
            Provider::Smtp => 1,
            Provider::Sms => 2,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Line => "line",
            Provider::Smtp => "smtp",
            Provider::Sms => "sms",
        }
    }
}

/// What kind of exchange an entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A send attempt (LINE push, one SMTP recipient of a transaction, Twilio create).
    Send,
    /// A status read by the sender (Twilio GET one / list).
    Poll,
    /// A delivery report the provider sent to the stack (SMS status callback, e-mail event).
    Callback,
}

/// The outcome of a send attempt as the provider decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A new delivery: the customer receives this.
    Accepted,
    /// A repeat of an accepted idempotency key: not a new delivery.
    IdempotentRepeat,
    /// Rejected, worth retrying (5xx, 429 rate limit, SMTP 4yz, dropped connection).
    Transient,
    /// Rejected for good (bad address, 4xx, SMTP 5yz, monthly quota).
    Permanent,
    /// The request itself was malformed (bad JSON, auth, SMTP syntax / sequence).
    ProtocolError,
    /// Not a send: polls and callbacks.
    Info,
}

/// What happened to a callback the provider sent to the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallbackVariant {
    /// The true status, correctly signed.
    Genuine,
    /// A second copy of a genuine callback (same idempotency token / event id).
    Duplicate,
    /// An intermediate status sent after the final one.
    Stale,
    /// A wrong signature claiming a different status.
    ForgedSignature,
    /// No signature at all, claiming a different status: what anyone who does not know the key
    /// can send. A stack that checks a signature only when one is there believes it.
    Unsigned,
    /// A correctly signed callback about a message id the provider never issued.
    UnknownId,
}

impl CallbackVariant {
    /// A report the provider did not sign — a wrong signature or none — which a stack must
    /// refuse (403) and never apply.
    pub fn is_forged(self) -> bool {
        matches!(
            self,
            CallbackVariant::ForgedSignature | CallbackVariant::Unsigned
        )
    }
}

/// One header field of an accepted e-mail, as sent: the name as written, the value unfolded
/// (the CRLF of each folded line removed) and without the whitespace after the colon; not
/// RFC 2047-decoded (the decoded subject is in [`LedgerEntry::subject`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderField {
    pub name: String,
    pub value: String,
}

/// What the SMTP fake keeps of an accepted message besides the decoded content: the envelope,
/// every header in order, and the size and hash of the message as received.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmailDetail {
    /// The envelope sender (`MAIL FROM`), `""` for the null sender `<>`.
    pub mail_from: String,
    /// The envelope recipients the message was accepted for (every accepted `RCPT TO`, in
    /// order); rejected ones have ledger entries of their own.
    pub rcpt_to: Vec<String>,
    /// The header section, every field in order.
    pub headers: Vec<HeaderField>,
    /// Octets of the message as received (after dot-unstuffing, CRLF line endings).
    pub size: u64,
    /// SHA-256 (hex) of those octets: the whole message, headers and body.
    pub sha256: String,
    /// SHA-256 (hex) of the body alone: the octets after the blank line that ends the headers.
    pub body_sha256: String,
}

/// One line of the ledger.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// Position in the ledger, from 0, strictly increasing across all providers and across
    /// resets (a reset forgets entries but never reuses their numbers).
    pub seq: u64,
    /// Nanoseconds since the ledger was created (monotonic clock), when the entry was recorded:
    /// for a send, after the injected latency, just before the response is written.
    pub mono_ns: u64,
    /// When the request arrived (same clock), before any injected latency. Providers set it with
    /// [`Ledger::now_ns`] at arrival; `record` fills it with `mono_ns` when left at 0.
    #[serde(default)]
    pub received_ns: u64,
    /// SMTP sends only: when their transaction began (`MAIL FROM` arrived), same clock; the
    /// final dot's arrival is `received_ns`. A sender has started a send from this moment on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ns: Option<u64>,
    /// Wall-clock time, RFC 3339 with milliseconds.
    pub wall: String,
    pub provider: Provider,
    pub kind: EntryKind,
    /// Recipient address: LINE user id, e-mail address, or E.164 phone number.
    pub recipient: String,
    /// 1-based index of this send attempt among all send attempts to `recipient` on `provider`.
    pub attempt: u32,
    pub outcome: Outcome,
    /// What the provider answered: HTTP status ("503") or SMTP reply ("451 4.3.0").
    pub status: String,
    /// Provider error code/text where one applies ("21610", "550 5.1.1 mailbox unknown").
    pub error: Option<String>,
    /// The fault the provider injected on purpose, if any (e.g. "http 503", "rcpt 451",
    /// "accept_then_drop", "bad_address", "rate_limit").
    pub fault: Option<String>,
    /// `X-Line-Retry-Key`, `Idempotency-Key`, or the SMTP Message-ID.
    pub idempotency_key: Option<String>,
    /// Provider message id issued for an accepted send (LINE sentMessages id, Twilio SID,
    /// SMTP queue id) or the id a callback / poll is about.
    pub message_id: Option<String>,
    /// SHA-256 (hex) of the normalised content (see [`crate::ledger`] docs per provider).
    pub payload_hash: Option<String>,
    /// The content: LINE message texts joined by "\n", SMS Body, e-mail text part.
    pub body: Option<String>,
    /// E-mail only.
    pub subject: Option<String>,
    /// E-mail only: the HTML part, decoded.
    pub html: Option<String>,
    /// `Retry-After` as the provider sent it, in milliseconds: LINE and Twilio send whole seconds,
    /// so a configured 200 ms is recorded as the 1000 the sender was told.
    pub retry_after_ms: Option<u64>,
    /// TCP peer of the request (the sender's socket), for attributing it to a process.
    pub peer: Option<SocketAddr>,
    /// Callbacks only: the status reported, the variant, where it went and what the stack answered.
    /// `callback_status` is also a poll's: the message status the read told the stack (a list
    /// read: a failure status one of its messages showed, else the newest one's).
    pub callback_status: Option<String>,
    pub callback_variant: Option<CallbackVariant>,
    pub callback_url: Option<String>,
    /// HTTP status the stack answered the callback with (None: no answer / connection error).
    pub callback_response: Option<u16>,
    /// Callbacks only: 1 for the first try of this callback, 2.. for retries after a 5xx/timeout.
    #[serde(default)]
    pub callback_try: Option<u32>,
    /// Callbacks only: how late this try began, in milliseconds, against when it was due (its
    /// planned delay for the first try, the retry gap after the previous answer for the others).
    /// The dispatcher's own lateness, not the stack's: a try that timed out after starting late
    /// says nothing against the stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_late_ms: Option<u64>,
    /// Callbacks only: how long this try waited, once due and awake, for one of the provider's
    /// connection slots ([`crate::callbacks::MAX_IN_FLIGHT`] per provider): the stack was still
    /// answering earlier reports. A real provider's webhook sender has a bounded concurrency
    /// too; this wait is the stack's pace, not the dispatcher's lateness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_queued_ms: Option<u64>,
    /// Callbacks only: milliseconds from writing the request to reading the whole answer (or
    /// giving up at the timeout, or the connection error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_took_ms: Option<u64>,
    /// Sends only: the sender hung up before the provider answered (HTTP: the connection closed
    /// while the request was being served). The provider still decided and committed the send;
    /// the sender cannot know how it ended. A worker abandoning in-flight sends shows up here.
    #[serde(default)]
    pub client_hung_up: bool,
    /// SMTP accepted sends only: envelope, headers, size and hashes of the message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<Box<EmailDetail>>,
}

/// An entry before the ledger stamps it: everything but `seq`, `mono_ns` and `wall`.
pub type Draft = LedgerEntry;

impl LedgerEntry {
    /// A blank draft for `provider`/`kind`/`recipient`; fill in the rest and pass to
    /// [`Ledger::record`], which stamps `seq`, `mono_ns` and `wall`.
    pub fn draft(provider: Provider, kind: EntryKind, recipient: impl Into<String>) -> Draft {
        LedgerEntry {
            seq: 0,
            mono_ns: 0,
            received_ns: 0,
            started_ns: None,
            wall: String::new(),
            provider,
            kind,
            recipient: recipient.into(),
            attempt: 0,
            outcome: Outcome::Info,
            status: String::new(),
            error: None,
            fault: None,
            idempotency_key: None,
            message_id: None,
            payload_hash: None,
            body: None,
            subject: None,
            html: None,
            retry_after_ms: None,
            peer: None,
            callback_status: None,
            callback_variant: None,
            callback_url: None,
            callback_response: None,
            callback_try: None,
            callback_late_ms: None,
            callback_queued_ms: None,
            callback_took_ms: None,
            client_hung_up: false,
            email: None,
        }
    }
}

/// Something the harness plugs into the ledger to watch the run as it happens.
pub trait Hook: Send + Sync {
    /// Called for every TCP connection a fake accepts (LINE, SMS, SMTP, control API), on that
    /// connection's own task, before the first byte of it is served: the client is still holding
    /// its socket, waiting for the greeting or the response. The server waits for the returned
    /// future, at most [`Ledger::connect_hook_timeout`] (by default [`CONNECT_HOOK_TIMEOUT`]) for
    /// all hooks together. `peer` is the client's
    /// address, as later ledger entries of this connection carry it in [`LedgerEntry::peer`].
    fn on_connect<'a>(&'a self, _peer: SocketAddr) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// Called when a send request has fully arrived (an HTTP send's body, an e-mail's final dot)
    /// and before the fake decides, waits its latency or records anything: the sender is now
    /// waiting for an answer, its send in flight. The fake waits for the returned future, then
    /// carries out the [`LinkFate`] it resolves to (a fault on this sender's link,
    /// [`crate::link`]). The harness uses this to signal a worker while it has a send in flight,
    /// and to cut, slow or reset one process's link to a provider.
    fn on_request<'a>(
        &'a self,
        _provider: Provider,
        _peer: SocketAddr,
    ) -> futures::future::BoxFuture<'a, LinkFate> {
        Box::pin(async { LinkFate::Pass })
    }

    /// Called by the SMTP fake for each command a sender sends outside a message, before the
    /// fake acts on it: whether the sender's link to the provider is down (the harness's
    /// `provider_refuse`). The fake then closes the connection without answering the command:
    /// the sender has sent none of a message, so it knows nothing was sent. Runs on the connection's task under the
    /// ledger's hook lock: answer at once.
    fn refuses(&self, _provider: Provider, _peer: SocketAddr) -> bool {
        false
    }

    /// Called for every entry right after it is appended, before the provider answers. Runs on
    /// the provider's task: keep it short and never block on the network.
    fn on_entry(&self, _entry: &LedgerEntry) {}

    /// Called for every accepted send after it is committed to the ledger and before the provider
    /// writes its response: the provider waits for the returned future. The harness uses this to
    /// kill the sender inside the window between the provider's commit and the sender's own.
    fn before_response<'a>(
        &'a self,
        _entry: &'a LedgerEntry,
    ) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// Where a ledger's entries go instead of its memory, while set ([`Ledger::spool`]): a run
/// writes each entry to disk as it is recorded and keeps only what its checkers read.
pub trait Spool: Send {
    /// Takes one stamped entry. Called in `seq` order under the ledger's lock: keep it short
    /// (a buffered write, a push), never block on the network.
    fn take(&mut self, entry: &LedgerEntry);
}

/// The retained entries and the `seq` of the first of them (entries before it were reset or
/// spooled).
#[derive(Default)]
struct Entries {
    base: u64,
    list: Vec<Arc<LedgerEntry>>,
    /// Per (provider, answer) of protocol errors about no recipient: how many were seen.
    protocol_errors: std::collections::BTreeMap<(Provider, String), u64>,
    /// While set, entries go here and are not retained; `spooled` counts them.
    spool: Option<Box<dyn Spool>>,
    spooled: u64,
}

/// Protocol errors about no recipient (an SMTP command out of sequence or unknown, a malformed
/// HTTP request naming nobody) kept per (provider, answer): the rest are only counted
/// ([`Ledger::protocol_errors`]), so a client spewing bad commands cannot grow the ledger
/// without bound. No checker reads such entries one by one (they belong to no delivery); a
/// protocol error about a recipient is always kept, since retry and loss rules count it.
pub const PROTOCOL_ERRORS_KEPT: u64 = 100;

/// Protocol errors of one kind about no recipient: how many were seen and how many kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtocolErrorCount {
    pub provider: Provider,
    /// The answer (HTTP status or SMTP reply code).
    pub status: String,
    pub seen: u64,
    /// Ledger entries kept (the first [`PROTOCOL_ERRORS_KEPT`]).
    pub kept: u64,
}

impl Entries {
    fn next_seq(&self) -> u64 {
        self.base + self.spooled + self.list.len() as u64
    }

    /// Forgets the retained entries (and the spooled count): the next one keeps its number ([`Entries::next_seq`]).
    fn rebase(&mut self) {
        self.base = self.next_seq();
        self.spooled = 0;
        self.list = Vec::new();
    }
}

struct Inner {
    entries: std::sync::Mutex<Entries>,
    attempts: std::sync::Mutex<Attempts>,
    start: std::time::Instant,
    hooks: std::sync::RwLock<Vec<std::sync::Arc<dyn Hook>>>,
    /// The budget of [`Ledger::on_connect`], in nanoseconds.
    connect_hook_timeout_ns: std::sync::atomic::AtomicU64,
    /// Send requests a hanging outage holds unanswered right now, by a number of their own,
    /// with when the hold began ([`Ledger::holding`]).
    held: std::sync::Mutex<Held>,
}

/// The attempt numbers given so far, per provider and recipient ([`Ledger::next_attempt`]).
///
/// A run asks for one per send, to a hundred thousand recipients per channel, so the keys are
/// small and still exact: a recipient of its provider's fixed shape (a LINE user id on LINE, an
/// E.164 number on SMS) is keyed by its packed bytes ([`crate::packed`]), any other (e-mail
/// addresses, SMTP's stage keys, a malformed recipient) by its text. A text packs from its one
/// spelling only and never goes to both maps, so each recipient has a counter of its own.
#[derive(Default)]
struct Attempts {
    /// By [`Provider::index`].
    by_provider: [Counters; 3],
}

/// One provider's attempt counters.
#[derive(Default)]
struct Counters {
    packed: std::collections::HashMap<[u8; 16], u32>,
    text: std::collections::HashMap<Box<str>, u32>,
}

impl Attempts {
    fn next(&mut self, provider: Provider, recipient: &str) -> u32 {
        fn bump<K: std::hash::Hash + Eq>(m: &mut std::collections::HashMap<K, u32>, k: K) -> u32 {
            let n = m.entry(k).or_insert(0);
            *n += 1;
            *n
        }
        let counters = &mut self.by_provider[provider.index()];
        match Self::packed(provider, recipient) {
            Some(key) => bump(&mut counters.packed, key),
            None => bump(&mut counters.text, Box::from(recipient)),
        }
    }

    /// `recipient` packed, when it has `provider`'s fixed shape.
    fn packed(provider: Provider, recipient: &str) -> Option<[u8; 16]> {
        match provider {
            Provider::Line => crate::packed::LineUserId::parse(recipient).map(|id| id.0),
            Provider::Sms => {
                crate::packed::Phone::parse(recipient).map(|p| u128::from(p.value()).to_le_bytes())
            }
            Provider::Smtp => None,
        }
    }

    /// Forgets every number and keeps the maps' room (a reset, where sends go on).
    fn clear(&mut self) {
        for c in &mut self.by_provider {
            c.packed.clear();
            c.text.clear();
        }
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.by_provider
            .iter()
            .all(|c| c.packed.is_empty() && c.text.is_empty())
    }
}

/// The held requests: the last number given, and when each still held began.
type Held = (u64, std::collections::HashMap<u64, std::time::Instant>);

/// One held request, counted until dropped ([`Ledger::holding`]).
pub(crate) struct Holding(std::sync::Arc<Inner>, u64);

impl Drop for Holding {
    fn drop(&mut self) {
        let mut held = self.0.held.lock().unwrap_or_else(|p| p.into_inner());
        held.1.remove(&self.1);
    }
}

/// The shared, append-only ledger of all three providers. Cheap to clone.
#[derive(Clone)]
pub struct Ledger {
    inner: std::sync::Arc<Inner>,
}

impl Default for Ledger {
    fn default() -> Self {
        Self::new()
    }
}

impl Ledger {
    pub fn new() -> Ledger {
        Ledger {
            inner: std::sync::Arc::new(Inner {
                entries: std::sync::Mutex::new(Entries::default()),
                attempts: std::sync::Mutex::new(Attempts::default()),
                start: std::time::Instant::now(),
                hooks: std::sync::RwLock::new(Vec::new()),
                connect_hook_timeout_ns: std::sync::atomic::AtomicU64::new(
                    CONNECT_HOOK_TIMEOUT.as_nanos() as u64,
                ),
                held: std::sync::Mutex::new((0, std::collections::HashMap::new())),
            }),
        }
    }

    /// This ledger with the [`Ledger::on_connect`] budget set to `timeout` (see
    /// [`Ledger::set_connect_hook_timeout`]).
    pub fn with_connect_hook_timeout(self, timeout: Duration) -> Ledger {
        self.set_connect_hook_timeout(timeout);
        self
    }

    /// Sets how long the servers wait, per accepted connection, for the `on_connect` hooks
    /// (default [`CONNECT_HOOK_TIMEOUT`]). Shared by every clone of this ledger and applied to
    /// connections accepted from now on. Durations beyond ~584 years are clamped.
    pub fn set_connect_hook_timeout(&self, timeout: Duration) {
        let ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        self.inner
            .connect_hook_timeout_ns
            .store(ns, std::sync::atomic::Ordering::Relaxed);
    }

    /// How long the servers wait, per accepted connection, for the `on_connect` hooks.
    pub fn connect_hook_timeout(&self) -> Duration {
        Duration::from_nanos(
            self.inner
                .connect_hook_timeout_ns
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Subscribes a hook; it sees every entry appended from now on.
    pub fn add_hook(&self, hook: std::sync::Arc<dyn Hook>) {
        self.inner
            .hooks
            .write()
            .expect("ledger hooks poisoned")
            .push(hook);
    }

    /// The hooks registered now (a snapshot, so none is called under the lock).
    fn hooks(&self) -> Vec<std::sync::Arc<dyn Hook>> {
        self.inner
            .hooks
            .read()
            .expect("ledger hooks poisoned")
            .clone()
    }

    /// Counts one send request held unanswered (a `hang` outage) until the guard is dropped.
    /// Such a request outlives its outage: only its sender ends it, by its own timeout.
    pub(crate) fn holding(&self) -> Holding {
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        held.0 += 1;
        let id = held.0;
        held.1.insert(id, std::time::Instant::now());
        Holding(self.inner.clone(), id)
    }

    /// Send requests held unanswered right now that have been held for less than `within`: while
    /// any is, the stack is waiting on a provider for its own timeout, not stalled (one held for
    /// longer is a client without a timeout).
    pub fn held_requests(&self, within: Duration) -> usize {
        let held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        held.1.values().filter(|t| t.elapsed() < within).count()
    }

    /// Monotonic nanoseconds since the ledger was created.
    pub fn now_ns(&self) -> u64 {
        self.inner.start.elapsed().as_nanos() as u64
    }

    /// Stamps and appends `draft`, runs the `on_entry` hooks, and returns the stored entry
    /// (shared with the ledger, not copied).
    pub fn record(&self, mut draft: Draft) -> Arc<LedgerEntry> {
        let stored = {
            let mut entries = self.inner.entries.lock().expect("ledger poisoned");
            if draft.outcome == Outcome::ProtocolError && draft.recipient.is_empty() {
                let key = (draft.provider, draft.status.clone());
                let seen = entries.protocol_errors.entry(key).or_default();
                *seen += 1;
                if *seen > PROTOCOL_ERRORS_KEPT {
                    // Counted, not kept: returned unstamped (no seq is used, so none repeats).
                    draft.mono_ns = self.now_ns();
                    return Arc::new(draft);
                }
            }
            draft.seq = entries.next_seq();
            draft.mono_ns = self.now_ns();
            if draft.received_ns == 0 {
                draft.received_ns = draft.mono_ns;
            }
            draft.wall = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            let stored = Arc::new(draft);
            match &mut entries.spool {
                Some(spool) => {
                    spool.take(&stored);
                    entries.spooled += 1;
                }
                None => entries.list.push(stored.clone()),
            }
            stored
        };
        let hooks = self.hooks();
        for h in &hooks {
            h.on_entry(&stored);
        }
        stored
    }

    /// Awaits every hook's `on_connect` for a connection just accepted from `peer`, for at most
    /// [`Ledger::connect_hook_timeout`] in all. Servers call it on the connection's own task
    /// (never in their accept loop) before serving the connection's first byte.
    pub async fn on_connect(&self, peer: SocketAddr) {
        let hooks = self.hooks();
        if hooks.is_empty() {
            return;
        }
        let all = async {
            for h in &hooks {
                h.on_connect(peer).await;
            }
        };
        let timeout = self.connect_hook_timeout();
        if tokio::time::timeout(timeout, all).await.is_err() {
            tracing::warn!(
                %peer,
                timeout_ms = timeout.as_millis() as u64,
                "connection hooks did not finish in time; serving the connection anyway"
            );
        }
    }

    /// Awaits every hook's `on_request` for a send request from `peer` that has just arrived, and
    /// returns the first fate that is not [`LinkFate::Pass`].
    pub async fn on_request(&self, provider: Provider, peer: SocketAddr) -> LinkFate {
        let hooks = self.hooks();
        let mut fate = LinkFate::Pass;
        for h in &hooks {
            let f = h.on_request(provider, peer).await;
            if fate.is_pass() {
                fate = f;
            }
        }
        fate
    }

    /// Whether any hook's [`Hook::refuses`] the command `peer` just sent to `provider`.
    pub fn refuses(&self, provider: Provider, peer: SocketAddr) -> bool {
        self.inner
            .hooks
            .read()
            .expect("ledger hooks poisoned")
            .iter()
            .any(|h| h.refuses(provider, peer))
    }

    /// Awaits every hook's `before_response` for an accepted send.
    pub async fn before_response(&self, entry: &LedgerEntry) {
        let hooks = self.hooks();
        for h in &hooks {
            h.before_response(entry).await;
        }
    }

    /// Reserves the next 1-based attempt number for a send to `recipient` on `provider`. Call it
    /// once per send attempt, before deciding faults: the number is what the fault decision keys on.
    pub fn next_attempt(&self, provider: Provider, recipient: &str) -> u32 {
        let mut attempts = self.inner.attempts.lock().expect("ledger poisoned");
        attempts.next(provider, recipient)
    }

    /// Sends every entry to `spool` from now on, in `seq` order, instead of retaining it: first
    /// the entries retained so far (which the ledger then forgets), then each one as it is
    /// recorded. Readers of the ledger ([`Ledger::snapshot_shared`], the control API) see no
    /// spooled entry; the spool's owner keeps what it needs.
    pub fn spool(&self, mut spool: Box<dyn Spool>) {
        let mut entries = self.inner.entries.lock().expect("ledger poisoned");
        for e in &entries.list {
            spool.take(e);
        }
        entries.rebase();
        entries.spool = Some(spool);
    }

    /// Stops spooling and gives the spool back; entries are retained again from the next one on.
    pub fn unspool(&self) -> Option<Box<dyn Spool>> {
        let mut entries = self.inner.entries.lock().expect("ledger poisoned");
        let spool = entries.spool.take();
        entries.rebase();
        spool
    }

    /// The retained entries, in order, shared: only the pointers are copied under the lock.
    pub fn snapshot_shared(&self) -> Vec<Arc<LedgerEntry>> {
        self.inner
            .entries
            .lock()
            .expect("ledger poisoned")
            .list
            .clone()
    }

    /// Retained entries with `seq >= from`, shared (pointers copied under the lock).
    pub fn since_shared(&self, from: u64) -> Vec<Arc<LedgerEntry>> {
        let entries = self.inner.entries.lock().expect("ledger poisoned");
        let skip = from.saturating_sub(entries.base) as usize;
        entries
            .list
            .get(skip..)
            .map(<[_]>::to_vec)
            .unwrap_or_default()
    }

    /// A copy of every retained entry, in order (cloned outside the lock).
    pub fn snapshot(&self) -> Vec<LedgerEntry> {
        self.snapshot_shared()
            .iter()
            .map(|e| LedgerEntry::clone(e))
            .collect()
    }

    /// Retained entries with `seq >= from`, for incremental readers. After a [`Ledger::clear`] a
    /// reader's `from` may point into the forgotten range: it gets every entry recorded since.
    pub fn since(&self, from: u64) -> Vec<LedgerEntry> {
        self.since_shared(from)
            .iter()
            .map(|e| LedgerEntry::clone(e))
            .collect()
    }

    /// The `seq` the next entry will get.
    pub fn next_seq(&self) -> u64 {
        self.inner
            .entries
            .lock()
            .expect("ledger poisoned")
            .next_seq()
    }

    /// Entries retained (recorded since the last [`Ledger::clear`]).
    pub fn len(&self) -> usize {
        self.inner
            .entries
            .lock()
            .expect("ledger poisoned")
            .list
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Protocol errors about no recipient, per kind: how many were seen and how many kept.
    pub fn protocol_errors(&self) -> Vec<ProtocolErrorCount> {
        let entries = self.inner.entries.lock().expect("ledger poisoned");
        entries
            .protocol_errors
            .iter()
            .map(|((provider, status), &seen)| ProtocolErrorCount {
                provider: *provider,
                status: status.clone(),
                seen,
                kept: seen.min(PROTOCOL_ERRORS_KEPT),
            })
            .collect()
    }

    /// Forgets the attempt numbers and keeps everything else: for a ledger whose providers have
    /// stopped for good (a run's, before it judges), where no send will ask for one again and a
    /// hundred thousand recipients' counters are only memory.
    pub fn forget_attempts(&self) {
        *self.inner.attempts.lock().expect("ledger poisoned") = Attempts::default();
    }

    /// Forgets every entry and attempt number (control API `POST /_mock/reset`). Entry numbers
    /// are not reused: the next entry's `seq` follows the last one recorded before the reset.
    pub fn clear(&self) {
        {
            let mut entries = self.inner.entries.lock().expect("ledger poisoned");
            entries.rebase();
            entries.protocol_errors = Default::default();
        }
        self.inner.attempts.lock().expect("ledger poisoned").clear();
    }

    /// Writes every retained entry as JSON Lines.
    pub fn write_jsonl(&self, mut w: impl std::io::Write) -> std::io::Result<()> {
        for e in self.snapshot_shared() {
            serde_json::to_writer(&mut w, &*e)?;
            w.write_all(b"\n")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(to: &str) -> Draft {
        LedgerEntry::draft(Provider::Line, EntryKind::Send, to)
    }

    #[test]
    fn each_provider_has_its_own_slot() {
        for (i, p) in Provider::ALL.into_iter().enumerate() {
            assert_eq!(p.index(), i, "{}", p.as_str());
        }
    }

    #[test]
    fn forgetting_attempts_keeps_the_entries() {
        let ledger = Ledger::new();
        assert_eq!(ledger.next_attempt(Provider::Line, "U1"), 1);
        assert_eq!(ledger.next_attempt(Provider::Line, "U1"), 2);
        ledger.record(entry("U1"));
        ledger.forget_attempts();
        assert_eq!(ledger.len(), 1, "entries stay");
        assert_eq!(ledger.next_seq(), 1);
        assert!(ledger.inner.attempts.lock().unwrap().is_empty());
    }

    #[test]
    fn each_recipient_counts_its_own_attempts_per_provider() {
        let l = Ledger::new();
        let user = "U0123456789abcdef0123456789abcdef";
        let phone = "+15550000001";
        let sends = [
            (Provider::Line, user, 1),
            (Provider::Line, user, 2),
            // Not a user id (uppercase): a recipient of its own, counted by its text.
            (Provider::Line, "U0123456789ABCDEF0123456789abcdef", 1),
            (Provider::Line, phone, 1),
            (Provider::Sms, phone, 1),
            (Provider::Sms, phone, 2),
            // Not E.164: its own counter, never the number's.
            (Provider::Sms, "+015550000001", 1),
            (Provider::Sms, "15550000001", 1),
            (Provider::Sms, user, 1),
            (Provider::Smtp, "a@x.test", 1),
            (Provider::Smtp, "A@x.test", 1),
            (Provider::Smtp, phone, 1),
            (Provider::Line, user, 3),
            (Provider::Sms, phone, 3),
            (Provider::Smtp, "a@x.test", 2),
            (Provider::Sms, "", 1),
            (Provider::Sms, "", 2),
        ];
        for (provider, to, want) in sends {
            assert_eq!(l.next_attempt(provider, to), want, "{provider:?} {to:?}");
        }
        l.clear();
        assert!(l.inner.attempts.lock().unwrap().is_empty());
        assert_eq!(l.next_attempt(Provider::Sms, phone), 1);
    }

    #[test]
    fn seq_stays_monotonic_across_clear_and_since_follows_it() {
        let l = Ledger::new();
        for i in 0..3 {
            assert_eq!(l.record(entry(&format!("a{i}"))).seq, i);
        }
        let reader_next = 2; // a reader that has seen seq 0 and 1
        l.clear();
        assert!(l.is_empty());
        assert_eq!(l.next_seq(), 3);
        let e = l.record(entry("b"));
        assert_eq!(e.seq, 3, "numbers are never reused after a reset");
        // The reader's next poll gets what was recorded since the reset, nothing twice.
        let got: Vec<_> = l.since(reader_next).into_iter().map(|e| e.seq).collect();
        assert_eq!(got, [3]);
        assert!(l.since(4).is_empty());
        assert_eq!(l.snapshot().len(), 1);
        // Attempt numbers restart.
        assert_eq!(l.next_attempt(Provider::Line, "b"), 1);
    }

    #[test]
    fn connect_hook_timeout_defaults_to_the_constant_and_is_shared_by_clones() {
        let l = Ledger::new();
        assert_eq!(l.connect_hook_timeout(), CONNECT_HOOK_TIMEOUT);
        let clone = l.clone();
        l.set_connect_hook_timeout(Duration::from_secs(30));
        assert_eq!(clone.connect_hook_timeout(), Duration::from_secs(30));
        let built = Ledger::new().with_connect_hook_timeout(Duration::from_millis(7));
        assert_eq!(built.connect_hook_timeout(), Duration::from_millis(7));
        l.set_connect_hook_timeout(Duration::MAX);
        assert_eq!(l.connect_hook_timeout(), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn shared_snapshot_is_taken_without_copying_entries() {
        let l = Ledger::new();
        let mut d = entry("a");
        d.body = Some("x".repeat(10_000));
        l.record(d);
        let a = l.snapshot_shared();
        let b = l.snapshot_shared();
        assert!(Arc::ptr_eq(&a[0], &b[0]));
        let mut out = Vec::new();
        l.write_jsonl(&mut out).unwrap();
        let back: LedgerEntry = serde_json::from_slice(out.strip_suffix(b"\n").unwrap()).unwrap();
        assert_eq!(back.body, a[0].body);
        assert!(back.email.is_none());
    }

    #[test]
    fn a_spool_takes_every_entry_in_order_and_the_ledger_retains_none() {
        struct Collect(Arc<std::sync::Mutex<Vec<u64>>>);
        impl Spool for Collect {
            fn take(&mut self, entry: &LedgerEntry) {
                self.0.lock().unwrap().push(entry.seq);
            }
        }
        let l = Ledger::new();
        l.record(entry("a"));
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        l.spool(Box::new(Collect(seen.clone())));
        assert!(
            l.is_empty(),
            "the entries retained so far went to the spool"
        );
        assert_eq!(l.record(entry("b")).seq, 1);
        assert_eq!(l.record(entry("c")).seq, 2);
        assert!(l.snapshot_shared().is_empty());
        assert_eq!(l.next_seq(), 3);
        assert!(l.unspool().is_some());
        assert_eq!(*seen.lock().unwrap(), [0, 1, 2]);
        let e = l.record(entry("d"));
        assert_eq!(e.seq, 3, "numbers go on after the spool");
        assert_eq!(l.since(3).len(), 1);
        assert_eq!(l.since(0).len(), 1);
    }

    #[test]
    fn protocol_errors_about_no_recipient_are_kept_up_to_a_bound_and_counted() {
        let l = Ledger::new();
        let bad = |status: &str, recipient: &str| {
            let mut d = entry(recipient);
            d.outcome = Outcome::ProtocolError;
            d.status = status.into();
            d
        };
        for _ in 0..(PROTOCOL_ERRORS_KEPT + 50) {
            l.record(bad("500 5.5.1", ""));
            l.record(bad("503 5.5.1", ""));
        }
        // About a recipient: always kept (retry and loss rules count it).
        for _ in 0..(PROTOCOL_ERRORS_KEPT + 50) {
            l.record(bad("501 5.5.4", "a@x.test"));
        }
        let seen: Vec<(String, u64, u64)> = l
            .protocol_errors()
            .into_iter()
            .map(|c| (c.status, c.seen, c.kept))
            .collect();
        let (n, k) = (PROTOCOL_ERRORS_KEPT + 50, PROTOCOL_ERRORS_KEPT);
        assert_eq!(
            seen,
            [("500 5.5.1".into(), n, k), ("503 5.5.1".into(), n, k)]
        );
        assert_eq!(l.len() as u64, 2 * k + n);
        // Seqs stay dense: `since` still finds every kept entry by position.
        assert_eq!(l.since(0).len(), l.len());
        l.clear();
        assert!(l.protocol_errors().is_empty());
    }
}
