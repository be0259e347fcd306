//! The scenario file as written: raw TOML structs, one per table.
//!
//! Every struct denies unknown fields, and range checks live in the unit types, so the TOML parser
//! reports a typo or a bad value with its exact position. Cross-field rules (exactly one chaos
//! trigger, `batches` or `rate`) are checked in [`super::validate`], which is the only code that
//! turns these into a [`super::Scenario`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use mock_providers::config::{LineConfig, SmsConfig, SmtpConfig};
use mock_providers::units::{HumanDuration, Ratio};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One experiment: a stack, a load, provider faults, a chaos schedule and what to expect.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawScenario {
    /// Short name; used in report directory names.
    pub name: String,
    /// What failure this scenario provokes and what a pass proves.
    #[serde(default)]
    pub description: String,
    /// Every random decision of the run (faults, data, chaos targets) derives from this.
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub database: RawDatabase,
    #[serde(default)]
    pub stack: RawStack,
    pub load: RawLoad,
    #[serde(default)]
    pub providers: RawProviders,
    #[serde(default)]
    pub chaos: Vec<RawChaos>,
    #[serde(default)]
    pub expect: RawExpect,
}

/// `[database]`: where the run's fresh database is created.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawDatabase {
    /// A PostgreSQL server URL; a fresh database is created on it. Default: a throwaway cluster.
    pub url: Option<String>,
    /// Keep the database (and a throwaway cluster's directory) after the run.
    #[serde(default)]
    pub keep: bool,
}

/// Which stack runs: the built-in reference stack, or your own through the stack contract.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StackKind {
    #[default]
    Builtin,
    External,
}

/// `[stack.external]`: your own stack's process roles (see docs/stack-contract.md). Its presence
/// replaces the built-in stack.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawExternal {
    /// argv of the API process, e.g. `["./bin/api"]`.
    pub api: Vec<String>,
    /// argv of one worker process.
    pub worker: Vec<String>,
    /// argv of the schema migration, run once before anything else.
    pub migrate: Vec<String>,
    /// Extra environment for every process, added to the `TING_*` variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory, relative to the scenario file.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
}

/// `[stack]`: the system under test and its tunables (passed as `TING_*` env vars).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawStack {
    /// Run your own stack instead of the built-in one.
    pub external: Option<RawExternal>,
    /// Number of worker processes (1..=64).
    pub workers: u32,
    pub shutdown_grace: HumanDuration,
    pub lease: HumanDuration,
    pub heartbeat: HumanDuration,
    pub claim_batch: u32,
    pub max_attempts: u32,
    pub backoff: RawBackoff,
    /// Built-in stack only: classic mistakes to switch on (see docs/flaws.md).
    pub flaws: Vec<String>,
    /// What the stack does with an e-mail whose outcome cannot be known: `hold` or `resend`.
    pub email_unknown_policy: String,
}

impl Default for RawStack {
    fn default() -> Self {
        RawStack {
            external: None,
            workers: 4,
            shutdown_grace: HumanDuration::from_millis(5_000),
            lease: HumanDuration::from_millis(3_000),
            heartbeat: HumanDuration::from_millis(1_000),
            claim_batch: 10,
            max_attempts: 5,
            backoff: RawBackoff::default(),
            flaws: Vec::new(),
            email_unknown_policy: "hold".into(),
        }
    }
}

/// `[stack.backoff]`: gap before attempt n+1 is `min(max, base × factor^(n-1))` ± jitter.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawBackoff {
    pub base: HumanDuration,
    pub factor: f64,
    pub max: HumanDuration,
    pub jitter: Ratio,
}

impl Default for RawBackoff {
    fn default() -> Self {
        RawBackoff {
            base: HumanDuration::from_millis(200),
            factor: 2.0,
            max: HumanDuration::from_millis(5_000),
            jitter: Ratio(0.2),
        }
    }
}

/// A channel a delivery goes out on.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    Line,
    Email,
    Sms,
}

impl Channel {
    pub const ALL: [Channel; 3] = [Channel::Line, Channel::Email, Channel::Sms];

    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Line => "line",
            Channel::Email => "email",
            Channel::Sms => "sms",
        }
    }

    /// The fake provider that carries this channel.
    pub fn provider(self) -> mock_providers::ledger::Provider {
        use mock_providers::ledger::Provider;
        match self {
            Channel::Line => Provider::Line,
            Channel::Email => Provider::Smtp,
            Channel::Sms => Provider::Sms,
        }
    }
}

/// `[load]`: who gets what, and how fast it is enqueued.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawLoad {
    /// Number of recipients (1..=1,000,000).
    pub recipients: u32,
    /// Subset of `line`, `email`, `sms`.
    pub channels: Vec<Channel>,
    /// Split the recipients into this many batches, enqueued back to back. Exclusive with `rate`.
    pub batches: Option<u32>,
    /// Batches per second, over `duration`. Exclusive with `batches`.
    pub rate: Option<f64>,
    pub duration: Option<HumanDuration>,
    #[serde(default)]
    pub template: RawTemplate,
    /// Share of recipient names that contain HTML and non-ASCII text, to test escaping.
    #[serde(default = "default_tricky")]
    pub tricky_names: Ratio,
    /// Share of recipients whose address on each channel is permanently bad.
    #[serde(default)]
    pub bad_addresses: RawBadAddresses,
    /// A steady stream of small orders enqueued beside the batches, e.g.
    /// `{ rate = "20/s", recipients = 1 }`.
    pub trickle: Option<RawTrickle>,
    /// Re-POST a share of the batches, as a client does after a timeout or a lost answer, e.g.
    /// `{ share = "5%", after = "0ms..2s" }`.
    pub repeat: Option<RawRepeat>,
    /// Edit the template while earlier batches still send, e.g. `{ from_batch = 3 }`.
    pub template_edit: Option<RawTemplateEdit>,
}

/// `[load] template_edit`: from batch `from_batch` (counting from 1) on, every batch is POSTed
/// with the template edited — the same `id`, `version + 1`, and ` (edited)` at the end of every
/// part — as a team edits a template while the earlier batches still send and retry. A stack
/// that keeps templates by `id` and renders at send time sends the edit to the earlier batches.
/// The trickle's orders keep the template as written.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTemplateEdit {
    /// The first batch POSTed with the edited template (2 up to the number of batches).
    pub from_batch: u32,
}

/// `[load] trickle`: small orders (their own batch ids, the same channels and template) enqueued
/// at a steady rate from the start of the load until the batches' deliveries are done.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTrickle {
    /// Orders per second or per minute: `"20/s"`, `"300/min"`.
    pub rate: PerSecond,
    /// Recipients per order (1..=100).
    #[serde(default = "one")]
    pub recipients: u32,
}

fn one() -> u32 {
    1
}

/// `[load] repeat`: a seeded share of the batches (and trickle orders) is POSTed again, `after`
/// the original was sent: concurrently with it, after its answer, or with the first answer dropped.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRepeat {
    /// Share of batches repeated.
    pub share: Ratio,
    /// When the repeat is sent, after the original request: `"0ms..2s"` (uniform, seeded).
    pub after: DurationRange,
}

/// An event rate written `"20/s"` or `"300/min"`, kept as events per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerSecond(pub f64);

impl<'de> Deserialize<'de> for PerSecond {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_per_second(&s).map_err(serde::de::Error::custom)
    }
}

/// `"20/s"`, `"0.5/s"`, `"300/min"` → events per second (finite, greater than 0).
pub fn parse_per_second(s: &str) -> Result<PerSecond, String> {
    let bad =
        || format!("invalid rate `{s}`: write a count per unit such as \"20/s\" or \"300/min\"");
    let (n, unit) = s.split_once('/').ok_or_else(bad)?;
    let n: f64 = n.trim().parse().map_err(|_| bad())?;
    let per = match unit.trim() {
        "s" => 1.0,
        "min" | "m" => 60.0,
        _ => return Err(bad()),
    };
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("rate `{s}` must be greater than 0"));
    }
    Ok(PerSecond(n / per))
}

impl JsonSchema for PerSecond {
    fn schema_name() -> String {
        "PerSecond".into()
    }
    fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        let mut s = schemars::schema::SchemaObject {
            instance_type: Some(schemars::schema::InstanceType::String.into()),
            ..Default::default()
        };
        s.string().pattern = Some(r"^\s*[0-9]+(\.[0-9]+)?\s*/\s*(s|m|min)\s*$".into());
        s.metadata().description = Some("A rate such as \"20/s\" or \"300/min\".".into());
        s.into()
    }
}

/// A range of durations written `"0ms..2s"` (both ends included, `min` at most `max`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DurationRange {
    pub min: std::time::Duration,
    pub max: std::time::Duration,
}

impl<'de> Deserialize<'de> for DurationRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration_range(&s).map_err(serde::de::Error::custom)
    }
}

/// `"0ms..2s"` → its two ends; a single duration `"1s"` is the range `1s..1s`.
pub fn parse_duration_range(s: &str) -> Result<DurationRange, String> {
    use mock_providers::units::parse_duration;
    let (min, max) = match s.split_once("..") {
        Some((a, b)) => (parse_duration(a)?, parse_duration(b)?),
        None => {
            let d = parse_duration(s)?;
            (d, d)
        }
    };
    if min > max {
        return Err(format!(
            "range `{s}` starts after it ends: write the shorter duration first"
        ));
    }
    Ok(DurationRange { min, max })
}

impl JsonSchema for DurationRange {
    fn schema_name() -> String {
        "DurationRange".into()
    }
    fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        let mut s = schemars::schema::SchemaObject {
            instance_type: Some(schemars::schema::InstanceType::String.into()),
            ..Default::default()
        };
        s.metadata().description =
            Some("A range of durations such as \"0ms..2s\", or one duration.".into());
        s.into()
    }
}

fn default_tricky() -> Ratio {
    Ratio(0.1)
}

/// `[load.bad_addresses]`: per channel share of permanently bad addresses.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawBadAddresses {
    pub line: Ratio,
    pub email: Ratio,
    pub sms: Ratio,
}

/// `[load.template]`: Mustache bodies. The variables are those every generated recipient has:
/// `id`, `name`, `order_id`, `item`, `total`; any other, or a syntax error, is rejected.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawTemplate {
    pub id: String,
    pub version: u32,
    pub subject: String,
    pub text: String,
    pub html: String,
    pub line: String,
    pub sms: String,
}

impl Default for RawTemplate {
    fn default() -> Self {
        RawTemplate {
            id: "order-confirmation".into(),
            version: 1,
            subject: "Order {{order_id}} received".into(),
            text: "Hi {{name}}, we received order {{order_id}} ({{item}}). Total {{total}}.".into(),
            html: "<p>Hi {{name}},</p><p>We received order <b>{{order_id}}</b> ({{item}}). Total {{total}}.</p>".into(),
            line: "Hi {{name}}! Order {{order_id}} ({{item}}) received. Total {{total}}.".into(),
            sms: "Order {{order_id}} received. Total {{total}}.".into(),
        }
    }
}

/// `[providers.*]`: fault profiles of the fake providers.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawProviders {
    #[serde(default)]
    pub line: LineConfig,
    #[serde(default)]
    pub smtp: SmtpConfig,
    #[serde(default)]
    pub sms: SmsConfig,
}

/// What a chaos action does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChaosAction {
    Sigkill,
    Sigterm,
    /// SIGSTOP, then SIGCONT after `for`.
    Sigstop,
    /// SIGTERM with the grace period, then start a new worker (a new worker id).
    Restart,
    /// Immediate restart of the throwaway PostgreSQL cluster, data kept.
    DbRestart,
    /// `pg_terminate_backend` of every session of the stack.
    DbTerminate,
    /// Hold an idle-in-transaction session with row locks for `for`.
    DbIdleTx,
    /// Stop the target's database link both ways for `for`, its connections left open; at the
    /// heal the held bytes flow on (delayed, not lost, as TCP retransmits them).
    DbPartition,
    /// Reset every connection on the target's database link now (the peers see RST).
    DbReset,
    /// Add `delay` (plus up to `jitter`, seeded) each way on the target's database link for `for`.
    DbLatency,
    /// Cap the target's database link at `bytes_per_s` each way for `for`.
    DbBandwidth,
    /// A provider-wide outage of `provider` for `for`: every send answered 503 (SMTP: the RCPT
    /// answered 421 and the connection closed; `mode = "unavailable"`, the default) or read and
    /// never answered (`mode = "hang"`), for every process; then the provider recovers.
    ProviderOutage,
    /// Partition the target workers' link to `provider` for `for`: each send they make is held
    /// unanswered, its connection open, until the heal (then served) or until they hang up.
    ProviderPartition,
    /// The target workers' link to `provider` down for `for`: each send's connection is reset
    /// before the provider reads it (nothing sent).
    ProviderRefuse,
    /// For `for`, the provider serves each send of the target workers, then their connection is
    /// reset before the answer (an accepted send they cannot know was accepted).
    ProviderReset,
    /// Add `delay` (plus up to `jitter`, seeded) to each send of the target workers to `provider`
    /// for `for`.
    ProviderLatency,
}

/// A fake provider, as `[providers.*]` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProviderName {
    Line,
    Smtp,
    Sms,
}

impl ProviderName {
    pub fn provider(self) -> mock_providers::ledger::Provider {
        use mock_providers::ledger::Provider;
        match self {
            ProviderName::Line => Provider::Line,
            ProviderName::Smtp => Provider::Smtp,
            ProviderName::Sms => Provider::Sms,
        }
    }
}

/// The Nth accepted send on a channel.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawOnAccept {
    pub channel: Channel,
    pub nth: u32,
}

/// `[[chaos]]`: one action, one trigger (`at`, `progress` or `on_accept`), one target.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawChaos {
    /// Elapsed time since the load started.
    pub at: Option<HumanDuration>,
    /// Share of expected deliveries the providers have accepted; for a provider action
    /// (`provider` set), of that provider's own channel's deliveries, so that the step meets that
    /// provider's sends in whatever order a stack works through its channels.
    pub progress: Option<Ratio>,
    /// The Nth accepted send on a channel; fires before the provider answers.
    pub on_accept: Option<RawOnAccept>,
    pub action: ChaosAction,
    /// `1`-based worker index, `"random"`, `"busiest"` (the live worker that has sent the most; to
    /// the step's provider for a provider action), `"all"`, `"sender"` (the process that
    /// sent the triggering request; `on_accept` only), or `"api"` (the API process: `sigkill`,
    /// `sigterm` or `restart`; it comes back on the same address). Default `"random"`. A signal for one
    /// chosen worker (an index, `random`, `busiest`) lands while it has a send in flight: the
    /// harness waits up to 2 s for its next request and holds that request at the fake until the
    /// signal is sent (a worker that sends nothing in that time is signalled anyway). Two steps
    /// never signal the same process: one whose only match is a worker another step is still
    /// acting on waits for that step (up to 30 s) and takes the replacement.
    #[serde(default)]
    #[schemars(with = "Option<serde_json::Value>")]
    pub target: Option<toml::Value>,
    /// How long SIGSTOP or the idle transaction lasts.
    #[serde(rename = "for")]
    pub duration: Option<HumanDuration>,
    /// Start a replacement worker this long after the action (kill/term/stop actions).
    pub restart_after: Option<HumanDuration>,
    /// `db_latency`: the delay added each way on the database link; `provider_latency`: to each
    /// send.
    pub delay: Option<HumanDuration>,
    /// `db_latency`, `provider_latency`: up to this much more per chunk or send, drawn from the
    /// run's seed. Default 0.
    pub jitter: Option<HumanDuration>,
    /// `db_bandwidth`: bytes per second each way on the database link (at least 1).
    pub bytes_per_s: Option<u64>,
    /// The run may pass when this step did not take effect (found no target, never triggered).
    /// Default `false`: a step that did not take effect makes the run inconclusive.
    #[serde(default)]
    pub optional: bool,
    /// The provider a provider action (`provider_outage`, `provider_partition`, `provider_refuse`,
    /// `provider_reset`, `provider_latency`) acts on: `line`, `smtp` or `sms`.
    pub provider: Option<ProviderName>,
    /// How the provider fails during `provider_outage`: `unavailable` (503 / SMTP 421, the default) or
    /// `hang` (no answer: the sender's own timeout must give up).
    pub mode: Option<mock_providers::outage::OutageMode>,
}

/// `[expect]`: which invariants to check and their thresholds.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawExpect {
    pub exactly_once: bool,
    pub no_loss: bool,
    pub retry_discipline: bool,
    pub immutable_payload: bool,
    pub callbacks: bool,
    /// The stack's own final state agrees with the ledger, and nothing was resent after an
    /// accept the stack saw (`agreement`).
    pub agreement: bool,
    pub graceful_shutdown: bool,
    pub recovery: bool,
    /// Attempts allowed per delivery; default `stack.max_attempts`.
    pub max_attempts: Option<u32>,
    /// Smallest gap allowed between an attempt and the retry after a transient failure.
    pub min_retry_gap: Option<HumanDuration>,
    /// Gaps must not shrink from one retry to the next (within the jitter).
    pub retry_growth: bool,
    /// Enqueue latency SLO (responsiveness).
    pub enqueue_p99: Option<HumanDuration>,
    /// End-to-end SLO of the trickle's small orders, each from its enqueue to the provider's
    /// last acceptance of its deliveries, while the batches drain (fairness). Needs
    /// `[load] trickle`.
    pub order_e2e_p99: Option<HumanDuration>,
    /// Deadline for quiescence after the load is enqueued.
    pub quiescence: HumanDuration,
    /// Deliveries allowed to end `unknown` (held for review).
    pub max_unknown: u32,
    /// Slack on top of the lease for recovery after a kill or stop.
    pub recovery_slack: HumanDuration,
    /// Scheduling slack on top of the backoff cap (`backoff.max` plus jitter): a retry later than
    /// that, for a delivery that could have been retried, breaks the cap (`gap_above_cap`).
    pub retry_cap_slack: HumanDuration,
    /// How long after SIGTERM a send may still arrive from the terminated worker (it was already
    /// on its way: waiting for a connection, mid-transaction).
    pub in_flight_allowance: HumanDuration,
    /// Performance gates, k6-style: `"deliveries_per_s >= 400"`, `"enqueue_p99 <= 50ms"`,
    /// `"e2e_p99 <= 3s"`.
    #[schemars(with = "Vec<String>")]
    pub thresholds: Vec<crate::report::gate::Threshold>,
    /// Fewest items a checker must judge for its verdict to count, keyed by checker name
    /// (`{ callbacks = 100 }`); below it the checker is `insufficient` and the run inconclusive.
    pub min_judged: BTreeMap<String, u64>,
}

impl Default for RawExpect {
    fn default() -> Self {
        RawExpect {
            exactly_once: true,
            no_loss: true,
            retry_discipline: true,
            immutable_payload: true,
            callbacks: true,
            agreement: true,
            graceful_shutdown: true,
            recovery: true,
            max_attempts: None,
            min_retry_gap: None,
            retry_growth: true,
            enqueue_p99: None,
            order_e2e_p99: None,
            quiescence: HumanDuration::from_millis(60_000),
            max_unknown: 0,
            recovery_slack: HumanDuration::from_millis(5_000),
            retry_cap_slack: HumanDuration::from_millis(5_000),
            in_flight_allowance: HumanDuration::from_millis(1_000),
            thresholds: Vec::new(),
            min_judged: BTreeMap::new(),
        }
    }
}
