//! The scenario language: one TOML file describes one experiment.
//!
//! [`load`] is the boundary: it reads a file, deserializes it into the raw structs of [`raw`]
//! (unknown keys and out-of-range values rejected with `file:line:col`), and [`validate`] builds the
//! [`Scenario`] that everything downstream receives. Nothing downstream re-validates, and nothing
//! downstream sees a raw struct.

pub mod error;
mod keys;
mod overrides;
pub mod raw;
mod template;
mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mock_providers::config::ProvidersConfig;
use serde::Serialize;

pub use error::ScenarioError;
pub use overrides::Overrides;
pub use raw::{Channel, ChaosAction, RawTemplate, StackKind};
pub use template::TEMPLATE_VARS;

/// The flaws the reference stack knows (`docs/flaws.md`); `[stack].flaws` is checked against it.
pub const KNOWN_FLAWS: &[&str] = &[
    "inline-send",
    "drop-on-failure",
    "retry-storm",
    "retry-permanent",
    "restart-from-first",
    "no-rescue",
    "racy-claim",
    "whole-batch-replay",
    "rerender-on-retry",
    "naive-callbacks",
    "trust-forged-callbacks",
    "abort-on-sigterm",
    "zombie-send",
    "resend-uncertain",
    "unescaped-template",
    "status-without-message-id",
    "no-heartbeat",
    "email-event-regression",
    "subject-header-injection",
    "no-backoff-cap",
    "attempts-off-by-one",
    "fifo-by-batch",
    "non-idempotent-batch",
    "no-lease-deadline",
    "no-provider-timeout",
    "api-loses-batch",
    "unknown-before-body",
];

/// A validated experiment.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub seed: u64,
    /// The file it came from; relative paths inside it (`[stack].cwd`) resolve against its folder.
    pub source: PathBuf,
    pub database: DatabaseSpec,
    pub stack: StackSpec,
    pub load: Load,
    pub providers: ProvidersConfig,
    pub chaos: Vec<ChaosStep>,
    pub expect: Expect,
}

#[derive(Debug, Clone, Serialize)]
pub struct DatabaseSpec {
    pub url: Option<String>,
    pub keep: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct StackSpec {
    pub kind: StackKind,
    /// External stacks only.
    pub external: Option<ExternalStack>,
    pub workers: u32,
    #[serde(with = "ms")]
    pub shutdown_grace: Duration,
    #[serde(with = "ms")]
    pub lease: Duration,
    #[serde(with = "ms")]
    pub heartbeat: Duration,
    pub claim_batch: u32,
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub flaws: Vec<String>,
    pub email_unknown_policy: UnknownPolicy,
}

/// What the stack is told to do with an e-mail whose outcome it cannot know
/// (`TING_EMAIL_UNKNOWN_POLICY`): hold it for review, or send it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownPolicy {
    Hold,
    Resend,
}

impl UnknownPolicy {
    pub const ALL: [(&'static str, UnknownPolicy); 2] = [
        ("hold", UnknownPolicy::Hold),
        ("resend", UnknownPolicy::Resend),
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            UnknownPolicy::Hold => "hold",
            UnknownPolicy::Resend => "resend",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ExternalStack {
    pub api: Vec<String>,
    pub worker: Vec<String>,
    pub migrate: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct Backoff {
    #[serde(with = "ms")]
    pub base: Duration,
    pub factor: f64,
    #[serde(with = "ms")]
    pub max: Duration,
    pub jitter: f64,
}

impl Backoff {
    /// The nominal gap after failed attempt `n` (1-based), before jitter.
    pub fn nominal_gap(&self, n: u32) -> Duration {
        let secs = self.base.as_secs_f64() * self.factor.powi(n.saturating_sub(1) as i32);
        Duration::from_secs_f64(secs.min(self.max.as_secs_f64()))
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Load {
    pub recipients: u32,
    pub channels: Vec<Channel>,
    pub pacing: Pacing,
    pub template: RawTemplate,
    pub tricky_names: f64,
    /// Small orders enqueued at a steady rate beside the batches.
    pub trickle: Option<Trickle>,
    /// Batches POSTed again, as clients do after a timeout or a lost answer.
    pub repeat: Option<Repeat>,
    /// The template is edited from this batch on (`[load] template_edit`).
    pub template_edit: Option<TemplateEdit>,
}

/// `[load] template_edit`, validated: batches from `from_batch` (counting from 1) on are POSTed
/// with [`TemplateEdit::apply`] of the template.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TemplateEdit {
    pub from_batch: u32,
}

impl TemplateEdit {
    /// What the edit appends to every part of the template.
    pub const MARK: &'static str = " (edited)";

    /// The edited template: the same `id`, the next `version`, [`TemplateEdit::MARK`] at the end
    /// of every part (plain text: it adds no tag, so the edit renders wherever the original does).
    pub fn apply(t: &RawTemplate) -> RawTemplate {
        let mark = |s: &str| format!("{s}{}", Self::MARK);
        RawTemplate {
            id: t.id.clone(),
            version: t.version + 1,
            subject: mark(&t.subject),
            text: mark(&t.text),
            html: mark(&t.html),
            line: mark(&t.line),
            sms: mark(&t.sms),
        }
    }
}

impl Load {
    /// Whether the batch with 0-based index `k` (of the batches, not the trickle's orders) is
    /// POSTed with the edited template.
    pub fn template_edited(&self, k: usize) -> bool {
        self.template_edit
            .is_some_and(|e| k + 1 >= e.from_batch as usize)
    }

    /// The template a batch is POSTed with: `[load.template]`, or its edit.
    pub fn template_of(&self, edited: bool) -> std::borrow::Cow<'_, RawTemplate> {
        if edited {
            std::borrow::Cow::Owned(TemplateEdit::apply(&self.template))
        } else {
            std::borrow::Cow::Borrowed(&self.template)
        }
    }
}

/// `[load] trickle`: `per_second` orders of `recipients` each, from the start of the load until
/// the batches' deliveries are done and at least [`Trickle::MIN_ORDERS`] were sent, for
/// [`Trickle::WINDOW`] at most.
#[derive(Debug, Clone, Serialize)]
pub struct Trickle {
    pub per_second: f64,
    pub recipients: u32,
}

impl Trickle {
    /// Orders the trickle sends at least, whatever the batches do: a p99 over fewer samples than
    /// 100 is the largest sample, not a percentile.
    pub const MIN_ORDERS: u32 = 100;

    /// How long the trickle runs at most (unless [`Trickle::MIN_ORDERS`] takes longer): long
    /// enough to span a campaign's drain, short enough that a stack slowed down by a loaded
    /// machine is not fed orders until the run's deadline.
    pub const WINDOW: Duration = Duration::from_secs(30);

    /// The most orders a run sends: its rate over [`Trickle::WINDOW`] (or the quiescence
    /// deadline, if shorter), at least [`Trickle::MIN_ORDERS`].
    pub fn max_orders(&self, quiescence: Duration) -> u32 {
        let window = quiescence.min(Self::WINDOW);
        let n = (self.per_second * window.as_secs_f64()).ceil() as u32;
        n.max(Self::MIN_ORDERS)
    }
}

/// `[load] repeat`: `share` of the batches is POSTed again between `after_min` and `after_max`
/// after the original request was sent.
#[derive(Debug, Clone, Serialize)]
pub struct Repeat {
    pub share: f64,
    #[serde(with = "ms")]
    pub after_min: Duration,
    #[serde(with = "ms")]
    pub after_max: Duration,
}

/// How the recipients are enqueued.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pacing {
    /// This many batches, back to back.
    Batches(u32),
    /// `per_second` batches per second for `duration`.
    Rate {
        per_second: f64,
        #[serde(with = "ms")]
        duration: Duration,
    },
}

impl Pacing {
    pub fn batch_count(&self) -> u32 {
        match self {
            Pacing::Batches(n) => *n,
            Pacing::Rate {
                per_second,
                duration,
            } => ((per_second * duration.as_secs_f64()).round() as u32).max(1),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ChaosStep {
    pub trigger: Trigger,
    pub action: ChaosAction,
    pub target: Target,
    #[serde(with = "ms_opt")]
    pub duration: Option<Duration>,
    #[serde(with = "ms_opt")]
    pub restart_after: Option<Duration>,
    /// The run may pass when this step did not take effect.
    pub optional: bool,
    /// What a database-link action does to the link (`db_partition`, `db_reset`, `db_latency`,
    /// `db_bandwidth`); `None` for every other action.
    pub db_link: Option<DbLinkFault>,
    /// What a provider action (`provider_outage`) does to which provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_fault: Option<ProviderFault>,
    /// What a provider-link action (`provider_partition`, `provider_refuse`, `provider_reset`,
    /// `provider_latency`) does to its targets' links to which provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_link: Option<ProviderLinkFault>,
}

impl ChaosStep {
    /// The provider a provider action acts on (`provider_outage` and the provider-link actions);
    /// `None` for every other action.
    pub fn provider(&self) -> Option<mock_providers::ledger::Provider> {
        self.provider_fault
            .map(|f| f.provider)
            .or(self.provider_link.map(|l| l.provider))
    }
}

/// A fault on a stack process's database link (`harness/src/netchaos`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DbLinkFault {
    Partition,
    Reset,
    Latency {
        #[serde(with = "ms")]
        delay: Duration,
        #[serde(with = "ms")]
        jitter: Duration,
    },
    Bandwidth {
        bytes_per_s: u64,
    },
}

/// A provider action's provider and how it fails (`provider_outage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProviderFault {
    pub provider: mock_providers::ledger::Provider,
    pub mode: mock_providers::outage::OutageMode,
}

/// A fault on the target processes' links to one provider (`harness/src/run/chaos/provider_link.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProviderLinkFault {
    pub provider: mock_providers::ledger::Provider,
    pub kind: ProviderLinkKind,
}

/// What a provider-link fault does to each send request it meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderLinkKind {
    /// Held unanswered until the heal (then served), or until the sender hangs up.
    Partition,
    /// The connection reset before the provider reads the request.
    Refuse,
    /// Served, then the connection reset before the answer.
    Reset,
    /// Served after `delay` plus up to `jitter` (seeded).
    Latency {
        #[serde(with = "ms")]
        delay: Duration,
        #[serde(with = "ms")]
        jitter: Duration,
    },
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    At(#[serde(with = "ms")] Duration),
    Progress(f64),
    OnAccept { channel: Channel, nth: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// 1-based worker slot.
    Worker(u32),
    Random,
    Busiest,
    All,
    /// The process that sent the triggering request (`on_accept` only).
    Sender,
    /// The API process (signals and restart only); it comes back on the same address.
    Api,
}

#[derive(Debug, Clone, Serialize)]
pub struct Expect {
    pub exactly_once: bool,
    pub no_loss: bool,
    pub retry_discipline: bool,
    pub immutable_payload: bool,
    pub callbacks: bool,
    pub agreement: bool,
    pub graceful_shutdown: bool,
    pub recovery: bool,
    pub max_attempts: u32,
    #[serde(with = "ms")]
    pub min_retry_gap: Duration,
    pub retry_growth: bool,
    #[serde(with = "ms_opt")]
    pub enqueue_p99: Option<Duration>,
    #[serde(with = "ms_opt")]
    pub order_e2e_p99: Option<Duration>,
    #[serde(with = "ms")]
    pub quiescence: Duration,
    pub max_unknown: u32,
    #[serde(with = "ms")]
    pub recovery_slack: Duration,
    #[serde(with = "ms")]
    pub retry_cap_slack: Duration,
    #[serde(with = "ms")]
    pub in_flight_allowance: Duration,
    pub thresholds: Vec<crate::report::gate::Threshold>,
    /// Checker name (one of [`crate::check::NAMES`]) → fewest items it must judge.
    pub min_judged: std::collections::BTreeMap<String, u64>,
}

/// Reads and validates a scenario file.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    load_with(path, &Overrides::default())
}

/// Reads and validates a scenario file with command-line `overrides` applied.
pub fn load_with(path: &Path, overrides: &Overrides) -> Result<Scenario, ScenarioError> {
    let file = path.display().to_string();
    let bytes = crate::files::read_bounded(path, crate::files::CONFIG_LIMIT).map_err(|e| {
        ScenarioError {
            file: file.clone(),
            line: 0,
            col: 0,
            message: format!("cannot read scenario: {e}"),
            key: None,
            suggestion: None,
        }
    })?;
    let text =
        String::from_utf8(bytes).map_err(|e| not_utf8(&file, e.as_bytes(), e.utf8_error()))?;
    parse_with(path, &text, overrides)
}

/// A file that is not UTF-8, placed at its first bad byte (the text before it is valid).
pub(crate) fn not_utf8(file: &str, bytes: &[u8], e: std::str::Utf8Error) -> ScenarioError {
    let at = e.valid_up_to();
    let before = std::str::from_utf8(&bytes[..at]).unwrap_or_default();
    let (line, col) = error::line_col(before, at);
    ScenarioError {
        file: file.into(),
        line,
        col,
        message: format!(
            "byte {at} (0x{:02x}) is not UTF-8: scenario files are UTF-8 TOML; re-save the file as UTF-8",
            bytes[at]
        ),
        key: None,
        suggestion: None,
    }
}

/// Validates scenario `text` as if read from `path`.
pub fn parse(path: &Path, text: &str) -> Result<Scenario, ScenarioError> {
    parse_with(path, text, &Overrides::default())
}

/// Validates scenario `text` as if read from `path`, with command-line `overrides` applied.
/// Errors name the file as `path` was given (`scenarios/x.toml`, not just `x.toml`), so two files
/// of the same name in different folders can be told apart.
pub fn parse_with(
    path: &Path,
    text: &str,
    overrides: &Overrides,
) -> Result<Scenario, ScenarioError> {
    let file = path.display().to_string();
    let applied = overrides::apply(&file, text, overrides)?;
    let text = applied.as_ref().map_or(text, |a| a.text.as_str());
    let validated = toml::from_str::<raw::RawScenario>(text)
        .map_err(|e| error::from_toml(&file, text, &e))
        .and_then(|raw| validate::validate(raw, path, &file, text, overrides));
    // An error in the applied text is placed where its key came from: the file, `--stack` or
    // the `--set` flag.
    validated.map_err(|e| match &applied {
        Some(a) => a.place(e),
        None => e,
    })
}

/// Checks provider profiles read from a providers-only TOML `text` (`ting-chaos mocks --config`,
/// `[line]`/`[smtp]`/`[sms]` tables) with the rules a scenario's `[providers]` obey, placing an
/// error at its key like scenario errors.
pub fn check_providers(
    path: &Path,
    text: &str,
    cfg: &mock_providers::config::ProvidersConfig,
) -> Result<(), ScenarioError> {
    mock_providers::validate::providers(cfg).map_err(|e| {
        let paths: Vec<&str> = e.paths.iter().map(String::as_str).collect();
        validate::placed(&path.display().to_string(), text, &paths, e.message)
    })
}

/// The JSON Schema of scenario files, generated from the raw types.
pub fn json_schema() -> serde_json::Value {
    let schema = schemars::schema_for!(raw::RawScenario);
    serde_json::to_value(schema).expect("schema serializes")
}

mod ms {
    use std::time::Duration;
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
}

mod ms_opt {
    use std::time::Duration;
    pub fn serialize<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&(d.as_millis() as u64)),
            None => s.serialize_none(),
        }
    }
}

#[cfg(test)]
#[path = "fuzz_tests.rs"]
mod fuzz_tests;
