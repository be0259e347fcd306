//! Cross-field rules: the one place a raw scenario becomes a [`Scenario`].

use std::path::Path;

use super::error::{line_col, locate, nearest, ScenarioError};
use super::raw::{self, ChaosAction, RawScenario};
use super::*;

struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
}

impl Ctx<'_> {
    /// An error about `key` in `[table]`, placed where the key is written.
    fn at(&self, table: &str, key: &str, message: impl Into<String>) -> ScenarioError {
        let (line, col) = locate(self.text, table, key);
        ScenarioError {
            file: self.file.into(),
            line,
            col,
            message: message.into(),
            key: Some(key.into()),
            suggestion: None,
        }
    }

    fn at_offset(&self, offset: usize, key: &str, message: impl Into<String>) -> ScenarioError {
        let (line, col) = line_col(self.text, offset);
        ScenarioError {
            file: self.file.into(),
            line,
            col,
            message: message.into(),
            key: Some(key.into()),
            suggestion: None,
        }
    }
}

pub(super) fn validate(
    raw: RawScenario,
    path: &Path,
    file: &str,
    text: &str,
) -> Result<Scenario, ScenarioError> {
    let cx = Ctx { file, text };

    if raw.name.trim().is_empty()
        || !raw
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(cx.at(
            "",
            "name",
            format!(
                "`name` must be non-empty and use only letters, digits, `-`, `_`, `.` (got {:?})",
                raw.name
            ),
        ));
    }

    let stack = validate_stack(&cx, raw.stack, path)?;
    let load = validate_load(&cx, &raw.load)?;
    let mut providers = mock_providers::config::ProvidersConfig {
        line: raw.providers.line,
        smtp: raw.providers.smtp,
        sms: raw.providers.sms,
    };
    merge_bad(
        &cx,
        "line",
        raw.load.bad_addresses.line,
        &mut providers.line.bad_addresses,
    )?;
    merge_bad(
        &cx,
        "email",
        raw.load.bad_addresses.email,
        &mut providers.smtp.bad_addresses,
    )?;
    merge_bad(
        &cx,
        "sms",
        raw.load.bad_addresses.sms,
        &mut providers.sms.bad_addresses,
    )?;
    validate_latencies(&cx, &providers)?;

    let mut chaos = Vec::new();
    for (i, spanned) in raw.chaos.iter().enumerate() {
        chaos.push(validate_chaos(&cx, i, spanned, &stack, &load)?);
    }

    let e = raw.expect;
    if e.quiescence.0.is_zero() {
        return Err(cx.at(
            "expect",
            "quiescence",
            "`quiescence` must be greater than 0",
        ));
    }
    let max_attempts = e.max_attempts.unwrap_or(stack.max_attempts);
    if max_attempts == 0 {
        return Err(cx.at(
            "expect",
            "max_attempts",
            "`max_attempts` must be at least 1",
        ));
    }
    let expect = Expect {
        exactly_once: e.exactly_once,
        no_loss: e.no_loss,
        retry_discipline: e.retry_discipline,
        immutable_payload: e.immutable_payload,
        callbacks: e.callbacks,
        graceful_shutdown: e.graceful_shutdown,
        recovery: e.recovery,
        max_attempts,
        // Default: half the configured base gap, which any jitter up to 50% still respects.
        min_retry_gap: e
            .min_retry_gap
            .map(|d| d.0)
            .unwrap_or(stack.backoff.base / 2),
        retry_growth: e.retry_growth,
        enqueue_p99: e.enqueue_p99.map(|d| d.0),
        quiescence: e.quiescence.0,
        max_unknown: e.max_unknown,
        recovery_slack: e.recovery_slack.0,
        in_flight_allowance: e.in_flight_allowance.0,
        thresholds: e.thresholds,
    };

    Ok(Scenario {
        name: raw.name,
        description: raw.description,
        seed: raw.seed,
        source: path.to_path_buf(),
        database: DatabaseSpec {
            url: raw.database.url,
            keep: raw.database.keep,
        },
        stack,
        load,
        providers,
        chaos,
        expect,
    })
}

fn validate_stack(cx: &Ctx, s: raw::RawStack, path: &Path) -> Result<StackSpec, ScenarioError> {
    if !(1..=64).contains(&s.workers) {
        return Err(cx.at(
            "stack",
            "workers",
            format!("`workers` must be between 1 and 64 (got {})", s.workers),
        ));
    }
    if s.lease.0 < Duration::from_millis(100) {
        return Err(cx.at("stack", "lease", "`lease` must be at least 100ms"));
    }
    if s.heartbeat.0.is_zero() || s.heartbeat.0 >= s.lease.0 {
        return Err(cx.at(
            "stack",
            "heartbeat",
            format!(
                "`heartbeat` ({}) must be greater than 0 and shorter than `lease` ({})",
                s.heartbeat, s.lease
            ),
        ));
    }
    if !(1..=10_000).contains(&s.claim_batch) {
        return Err(cx.at(
            "stack",
            "claim_batch",
            "`claim_batch` must be between 1 and 10000",
        ));
    }
    if !(1..=100).contains(&s.max_attempts) {
        return Err(cx.at(
            "stack",
            "max_attempts",
            "`max_attempts` must be between 1 and 100",
        ));
    }
    let b = &s.backoff;
    if !(1.0..=100.0).contains(&b.factor) {
        return Err(cx.at(
            "stack.backoff",
            "factor",
            "`factor` must be between 1 and 100",
        ));
    }
    if b.base.0.is_zero() || b.base > b.max {
        return Err(cx.at(
            "stack.backoff",
            "base",
            format!(
                "`base` ({}) must be greater than 0 and at most `max` ({})",
                b.base, b.max
            ),
        ));
    }
    if !["hold", "resend"].contains(&s.email_unknown_policy.as_str()) {
        let mut err = cx.at(
            "stack",
            "email_unknown_policy",
            format!(
                "unknown `email_unknown_policy` {:?}; expected `hold` or `resend`",
                s.email_unknown_policy
            ),
        );
        err.suggestion = nearest(&s.email_unknown_policy, ["hold", "resend"]);
        return Err(err);
    }
    for f in &s.flaws {
        if !KNOWN_FLAWS.contains(&f.as_str()) {
            let mut err = cx.at("stack", "flaws", format!("unknown flaw `{f}`"));
            err.suggestion = nearest(f, KNOWN_FLAWS.iter().copied());
            return Err(err);
        }
    }
    let external = match &s.external {
        None => None,
        Some(x) => {
            if !s.flaws.is_empty() {
                return Err(cx.at(
                    "stack",
                    "flaws",
                    "`flaws` only applies to the built-in stack",
                ));
            }
            let argv = |key: &str, v: &Vec<String>| {
                if v.is_empty() || v[0].is_empty() {
                    Err(cx.at(
                        "stack.external",
                        key,
                        format!(
                        "`{key}` must be a command as an argv array, e.g. {key} = [\"./bin/{key}\"]"
                    ),
                    ))
                } else {
                    Ok(v.clone())
                }
            };
            let base = path.parent().unwrap_or(Path::new("."));
            Some(ExternalStack {
                api: argv("api", &x.api)?,
                worker: argv("worker", &x.worker)?,
                migrate: argv("migrate", &x.migrate)?,
                env: x.env.clone(),
                cwd: base.join(x.cwd.clone().unwrap_or_default()),
            })
        }
    };
    Ok(StackSpec {
        kind: if external.is_some() {
            StackKind::External
        } else {
            StackKind::Builtin
        },
        external,
        workers: s.workers,
        shutdown_grace: s.shutdown_grace.0,
        lease: s.lease.0,
        heartbeat: s.heartbeat.0,
        claim_batch: s.claim_batch,
        max_attempts: s.max_attempts,
        backoff: Backoff {
            base: b.base.0,
            factor: b.factor,
            max: b.max.0,
            jitter: b.jitter.get(),
        },
        flaws: s.flaws,
        email_unknown_policy: s.email_unknown_policy,
    })
}

fn validate_load(cx: &Ctx, l: &raw::RawLoad) -> Result<Load, ScenarioError> {
    if !(1..=1_000_000).contains(&l.recipients) {
        return Err(cx.at(
            "load",
            "recipients",
            format!(
                "`recipients` must be between 1 and 1000000 (got {})",
                l.recipients
            ),
        ));
    }
    let channels = l.channels.get_ref().clone();
    if channels.is_empty() {
        return Err(cx.at_offset(
            l.channels.span().start,
            "channels",
            "`channels` must name at least one of `line`, `email`, `sms`",
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for c in &channels {
        if !seen.insert(*c) {
            return Err(cx.at_offset(
                l.channels.span().start,
                "channels",
                format!("channel `{}` is listed twice", c.as_str()),
            ));
        }
    }
    let pacing = match (l.batches, l.rate) {
        (Some(_), Some(_)) => {
            return Err(cx.at(
                "load",
                "rate",
                "`batches` and `rate` are exclusive: give one",
            ));
        }
        (Some(n), None) => {
            if n == 0 || n > l.recipients {
                return Err(cx.at(
                    "load",
                    "batches",
                    format!(
                        "`batches` must be between 1 and `recipients` ({}) (got {n})",
                        l.recipients
                    ),
                ));
            }
            if l.duration.is_some() {
                return Err(cx.at(
                    "load",
                    "duration",
                    "`duration` goes with `rate`, not `batches`",
                ));
            }
            Pacing::Batches(n)
        }
        (None, Some(r)) => {
            if !(r > 0.0 && r <= 1000.0) {
                return Err(cx.at(
                    "load",
                    "rate",
                    format!("`rate` must be in (0, 1000] batches per second (got {r})"),
                ));
            }
            let Some(d) = l.duration.filter(|d| !d.0.is_zero()) else {
                return Err(cx.at("load", "rate", "`rate` needs a `duration` greater than 0"));
            };
            let pacing = Pacing::Rate {
                per_second: r,
                duration: d.0,
            };
            if pacing.batch_count() > l.recipients {
                return Err(cx.at(
                    "load",
                    "rate",
                    "`rate` × `duration` gives more batches than recipients",
                ));
            }
            pacing
        }
        (None, None) => Pacing::Batches(1),
    };
    if l.template.id.trim().is_empty() {
        return Err(cx.at("load.template", "id", "template `id` must not be empty"));
    }
    Ok(Load {
        recipients: l.recipients,
        channels,
        pacing,
        template: l.template.clone(),
        tricky_names: l.tricky_names.get(),
    })
}

fn merge_bad(
    cx: &Ctx,
    channel: &str,
    from_load: mock_providers::units::Ratio,
    provider: &mut mock_providers::units::Ratio,
) -> Result<(), ScenarioError> {
    if from_load.get() > 0.0 {
        if provider.get() > 0.0 && provider.get() != from_load.get() {
            return Err(cx.at("load.bad_addresses", channel, format!(
                "bad-address share for `{channel}` is set both here ({}) and in its [providers] table ({}); keep one",
                from_load.get(), provider.get()
            )));
        }
        *provider = from_load;
    }
    Ok(())
}

fn validate_latencies(
    cx: &Ctx,
    p: &mock_providers::config::ProvidersConfig,
) -> Result<(), ScenarioError> {
    use mock_providers::config::Latency;
    let check = |table: &str, l: &Latency| match l {
        Latency::Uniform { min, max } if min > max => Err(cx.at(
            table,
            "latency",
            format!("uniform latency has min {min} > max {max}"),
        )),
        Latency::Lognormal { p50, p99 } if p50 > p99 => Err(cx.at(
            table,
            "latency",
            format!("lognormal latency has p50 {p50} > p99 {p99}"),
        )),
        _ => Ok(()),
    };
    check("providers.line", &p.line.latency)?;
    check("providers.sms", &p.sms.latency)?;
    check("providers.smtp", &p.smtp.latency)?;
    for l in p.smtp.stage_latency.values() {
        check("providers.smtp", l)?;
    }
    Ok(())
}

fn validate_chaos(
    cx: &Ctx,
    index: usize,
    spanned: &toml::Spanned<raw::RawChaos>,
    stack: &StackSpec,
    load: &Load,
) -> Result<ChaosStep, ScenarioError> {
    let c = spanned.get_ref();
    let at = spanned.span().start;
    let err =
        |key: &str, msg: String| cx.at_offset(at, key, format!("[[chaos]] #{}: {msg}", index + 1));
    let trigger = match (&c.at, &c.progress, &c.on_accept) {
        (Some(t), None, None) => Trigger::At(t.0),
        (None, Some(p), None) => {
            if p.get() <= 0.0 {
                return Err(err("progress", "`progress` must be greater than 0%".into()));
            }
            Trigger::Progress(p.get())
        }
        (None, None, Some(o)) => {
            if o.nth == 0 {
                return Err(err("on_accept", "`on_accept.nth` counts from 1".into()));
            }
            if !load.channels.contains(&o.channel) {
                return Err(err(
                    "on_accept",
                    format!(
                        "`on_accept` watches channel `{}`, which [load] does not send on",
                        o.channel.as_str()
                    ),
                ));
            }
            Trigger::OnAccept {
                channel: o.channel,
                nth: o.nth,
            }
        }
        (None, None, None) => {
            return Err(err(
                "at",
                "needs a trigger: one of `at`, `progress`, `on_accept`".into(),
            ));
        }
        _ => {
            return Err(err(
                "at",
                "give exactly one trigger of `at`, `progress`, `on_accept`".into(),
            ))
        }
    };
    let target = match &c.target {
        None => Target::Random,
        Some(toml::Value::Integer(i)) => {
            if *i < 1 || *i > stack.workers as i64 {
                return Err(err(
                    "target",
                    format!(
                        "`target` worker {i} does not exist: workers are numbered 1..={}",
                        stack.workers
                    ),
                ));
            }
            Target::Worker(*i as u32)
        }
        Some(toml::Value::String(s)) => match s.as_str() {
            "random" => Target::Random,
            "busiest" => Target::Busiest,
            "all" => Target::All,
            "sender" => Target::Sender,
            other => {
                let mut e = err("target", format!(
                    "unknown `target` {other:?}; expected a worker number, `random`, `busiest`, `all` or `sender`"
                ));
                e.suggestion = nearest(other, ["random", "busiest", "all", "sender"]);
                return Err(e);
            }
        },
        Some(other) => {
            return Err(err(
                "target",
                format!("`target` must be a worker number or a word, not {other}"),
            ))
        }
    };
    if target == Target::Sender && !matches!(trigger, Trigger::OnAccept { .. }) {
        return Err(err(
            "target",
            "`target = \"sender\"` needs an `on_accept` trigger".into(),
        ));
    }
    let needs_for = matches!(c.action, ChaosAction::Sigstop | ChaosAction::DbIdleTx);
    match (needs_for, c.duration) {
        (true, None) => {
            return Err(err(
                "for",
                format!("`{:?}` needs `for`, how long it lasts", c.action).to_lowercase(),
            ));
        }
        (false, Some(_)) => {
            return Err(err(
                "for",
                "`for` only applies to `sigstop` and `db_idle_tx`".into(),
            ));
        }
        _ => {}
    }
    let is_db = matches!(
        c.action,
        ChaosAction::DbRestart | ChaosAction::DbTerminate | ChaosAction::DbIdleTx
    );
    if is_db && c.restart_after.is_some() {
        return Err(err(
            "restart_after",
            "`restart_after` applies to worker actions only".into(),
        ));
    }
    Ok(ChaosStep {
        trigger,
        action: c.action,
        target,
        duration: c.duration.map(|d| d.0),
        restart_after: c.restart_after.map(|d| d.0),
    })
}
