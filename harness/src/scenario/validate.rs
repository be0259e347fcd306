//! Cross-field rules: the one place a raw scenario becomes a [`Scenario`].

use std::path::Path;

use super::error::{line_col, nearest, ScenarioError};
use super::keys::{leaf, Keys};
use super::raw::{self, ChaosAction, RawScenario};
use super::*;

mod chaos;
mod chaos_ext;
mod db_link;
mod provider_link;

struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
    keys: Keys,
    overrides: &'a Overrides,
}

impl Ctx<'_> {
    /// An error about the key at `path` (`stack.workers`, `chaos[0].target`), placed where that
    /// key is written: under a header, as a dotted key, in an inline table or in an array. A key
    /// left at its default is placed at its nearest written table.
    fn at(&self, path: &str, message: impl Into<String>) -> ScenarioError {
        let (line, col) = self
            .keys
            .offset_of(path)
            .map_or((1, 1), |o| line_col(self.text, o));
        ScenarioError {
            file: self.file.into(),
            line,
            col,
            message: message.into(),
            key: Some(leaf(path).to_string()),
            suggestion: None,
        }
    }

    /// [`Ctx::at`] for the first of `paths` that is written (else the first).
    fn at_first(&self, paths: &[&str], message: impl Into<String>) -> ScenarioError {
        let path = paths
            .iter()
            .find(|p| self.keys.get(p).is_some())
            .unwrap_or(&paths[0]);
        self.at(path, message)
    }
}

/// An error about the first written of `paths` (key paths as in [`Ctx::at`]) in a TOML `text`
/// that is not a scenario (a providers-only `mocks --config` file), placed like scenario errors.
pub(super) fn placed(
    file: &str,
    text: &str,
    paths: &[&str],
    message: impl Into<String>,
) -> ScenarioError {
    let none = Overrides::default();
    Ctx {
        file,
        text,
        keys: Keys::parse(text).unwrap_or_default(),
        overrides: &none,
    }
    .at_first(paths, message)
}

pub(super) fn validate(
    raw: RawScenario,
    path: &Path,
    file: &str,
    text: &str,
    overrides: &Overrides,
) -> Result<Scenario, ScenarioError> {
    let cx = Ctx {
        file,
        text,
        keys: Keys::parse(text).unwrap_or_default(),
        overrides,
    };

    if raw.name.trim().is_empty()
        || !raw
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(cx.at(
            "name",
            format!(
                "`name` must be non-empty and use only letters, digits, `-`, `_`, `.` (got {:?})",
                raw.name
            ),
        ));
    }
    // It names the run's folder (`<name>-<timestamp>`) and its batches: a file name holds 255
    // bytes at most.
    if raw.name.len() > MAX_NAME {
        return Err(cx.at(
            "name",
            format!(
                "`name` must be at most {MAX_NAME} characters: it names the run's report folder \
                 (got {})",
                raw.name.len()
            ),
        ));
    }

    if let Some(url) = &raw.database.url {
        validate_database_url(&cx, url)?;
    }
    let stack = validate_stack(&cx, raw.stack, path)?;
    let load = validate_load(&cx, &raw.load, &stack)?;
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
    validate_providers(&cx, &providers)?;

    let mut chaos = Vec::new();
    for (i, c) in raw.chaos.iter().enumerate() {
        chaos.push(chaos::validate_chaos(&cx, i, c, &stack, &load)?);
    }

    let e = raw.expect;
    if e.quiescence.0.is_zero() {
        return Err(cx.at("expect.quiescence", "`quiescence` must be greater than 0"));
    }
    if let Some(slo) = e.order_e2e_p99 {
        if slo.0.is_zero() {
            return Err(cx.at(
                "expect.order_e2e_p99",
                "`order_e2e_p99` must be greater than 0",
            ));
        }
        if load.trickle.is_none() {
            return Err(cx.at(
                "expect.order_e2e_p99",
                "`order_e2e_p99` judges the small orders of `[load] trickle`; add e.g. `trickle = { rate = \"20/s\", recipients = 1 }` to [load]",
            ));
        }
    }
    if let Some(t) = &load.trickle {
        let most = u64::from(load.recipients)
            + u64::from(t.max_orders(e.quiescence.0)) * u64::from(t.recipients);
        if most > 1_000_000 {
            return Err(cx.at(
                "load.trickle.rate",
                format!(
                    "the trickle may send up to {} orders (`rate` over 30 s), \
                     {most} recipients with the batches' — more than 1000000; lower the rate",
                    t.max_orders(e.quiescence.0)
                ),
            ));
        }
    }
    let max_attempts = e.max_attempts.unwrap_or(stack.max_attempts);
    if max_attempts == 0 {
        return Err(cx.at("expect.max_attempts", "`max_attempts` must be at least 1"));
    }
    for name in e.min_judged.keys() {
        if !crate::check::NAMES.contains(&name.as_str()) {
            let mut err = cx.at(
                &format!("expect.min_judged.{name}"),
                format!(
                    "unknown checker `{name}` in `min_judged`; checkers: {}",
                    crate::check::NAMES.join(", ")
                ),
            );
            err.suggestion = nearest(name, crate::check::NAMES);
            return Err(err);
        }
    }
    let expect = Expect {
        exactly_once: e.exactly_once,
        no_loss: e.no_loss,
        retry_discipline: e.retry_discipline,
        immutable_payload: e.immutable_payload,
        callbacks: e.callbacks,
        agreement: e.agreement,
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
        order_e2e_p99: e.order_e2e_p99.map(|d| d.0),
        quiescence: e.quiescence.0,
        max_unknown: e.max_unknown,
        recovery_slack: e.recovery_slack.0,
        retry_cap_slack: e.retry_cap_slack.0,
        in_flight_allowance: e.in_flight_allowance.0,
        thresholds: e.thresholds,
        min_judged: e.min_judged,
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

/// `[stack.external] env`: names a process environment can hold (not empty, no `=` or NUL),
/// values without NUL, and none of the variables the harness sets from the run
/// ([`crate::run::CONTRACT_VARS`]): a stack given another `TING_MAX_ATTEMPTS` or `TING_API_ADDR`
/// than the run's would be judged by settings it never had.
fn external_env(cx: &Ctx, env: &BTreeMap<String, String>) -> Result<(), ScenarioError> {
    for (k, v) in env {
        let at = format!("stack.external.env.{k}");
        if k.is_empty() || k.contains(['=', '\0']) {
            return Err(cx.at(
                &at,
                format!("`env` name {k:?} is not a variable name: it must be non-empty, without `=` or NUL"),
            ));
        }
        if v.contains('\0') {
            return Err(cx.at(
                &at,
                format!("`env` value of `{k}` holds a NUL byte, which no environment can carry"),
            ));
        }
        if crate::run::CONTRACT_VARS.contains(&k.as_str()) {
            return Err(cx.at(
                &at,
                format!(
                    "`env` may not set `{k}`: the harness sets it from the run (docs/stack-contract.md); \
                     change the scenario key it comes from instead"
                ),
            ));
        }
    }
    Ok(())
}

/// The longest scenario `name`.
const MAX_NAME: usize = 100;

/// `[database].url` must name a PostgreSQL server; the URL itself is not echoed (it may hold a
/// password).
fn validate_database_url(cx: &Ctx, url: &str) -> Result<(), ScenarioError> {
    match url.split_once("://") {
        // The rule provisioning applies (the URL itself never in the message).
        Some(("postgres" | "postgresql", rest)) if !rest.is_empty() => {
            match throwaway_pg::url_with_database(url, "ting_probe") {
                Err(throwaway_pg::Error::BadUrl { reason, .. }) => Err(cx.at(
                    "database.url",
                    format!("`url` is not a URL PostgreSQL can be reached at: {reason}"),
                )),
                _ => Ok(()),
            }
        }
        Some((scheme, _)) if scheme != "postgres" && scheme != "postgresql" => Err(cx.at(
            "database.url",
            format!(
                "`url` must be a PostgreSQL URL (`postgres://…` or `postgresql://…`), not `{scheme}://…`"
            ),
        )),
        _ => Err(cx.at(
            "database.url",
            "`url` must be a PostgreSQL URL such as `postgres://user:password@host:5432/postgres`",
        )),
    }
}

fn validate_stack(cx: &Ctx, s: raw::RawStack, path: &Path) -> Result<StackSpec, ScenarioError> {
    if !(1..=64).contains(&s.workers) {
        return Err(cx.at(
            "stack.workers",
            format!("`workers` must be between 1 and 64 (got {})", s.workers),
        ));
    }
    let workers = match cx.overrides.workers {
        Some(w) if !(1..=64).contains(&w) => {
            return Err(ScenarioError {
                file: cx.file.into(),
                line: 0,
                col: 0,
                message: format!("--workers must be between 1 and 64 (got {w})"),
                key: None,
                suggestion: None,
            })
        }
        Some(w) => w,
        None => s.workers,
    };
    if s.shutdown_grace.0.is_zero() {
        return Err(cx.at(
            "stack.shutdown_grace",
            "`shutdown_grace` must be greater than 0: it is how long a worker may finish its sends after SIGTERM",
        ));
    }
    if s.lease.0 < Duration::from_millis(100) {
        return Err(cx.at("stack.lease", "`lease` must be at least 100ms"));
    }
    if s.heartbeat.0.is_zero() || s.heartbeat.0 >= s.lease.0 {
        return Err(cx.at_first(
            &["stack.heartbeat", "stack.lease"],
            format!(
                "`heartbeat` ({}) must be greater than 0 and shorter than `lease` ({})",
                s.heartbeat, s.lease
            ),
        ));
    }
    if !(1..=10_000).contains(&s.claim_batch) {
        return Err(cx.at(
            "stack.claim_batch",
            "`claim_batch` must be between 1 and 10000",
        ));
    }
    if !(1..=100).contains(&s.max_attempts) {
        return Err(cx.at(
            "stack.max_attempts",
            "`max_attempts` must be between 1 and 100",
        ));
    }
    let b = &s.backoff;
    if !(1.0..=100.0).contains(&b.factor) {
        return Err(cx.at("stack.backoff.factor", "`factor` must be between 1 and 100"));
    }
    if b.base.0.is_zero() || b.base > b.max {
        return Err(cx.at_first(
            &["stack.backoff.base", "stack.backoff.max"],
            format!(
                "`base` ({}) must be greater than 0 and at most `max` ({})",
                b.base, b.max
            ),
        ));
    }
    let Some(email_unknown_policy) = UnknownPolicy::ALL
        .iter()
        .find(|(name, _)| *name == s.email_unknown_policy)
        .map(|(_, p)| *p)
    else {
        let mut err = cx.at(
            "stack.email_unknown_policy",
            format!(
                "unknown `email_unknown_policy` {:?}; expected `hold` or `resend`",
                s.email_unknown_policy
            ),
        );
        err.suggestion = nearest(&s.email_unknown_policy, ["hold", "resend"]);
        return Err(err);
    };
    for (i, f) in s.flaws.iter().enumerate() {
        if !KNOWN_FLAWS.contains(&f.as_str()) {
            let mut err = cx.at_first(
                &[&format!("stack.flaws[{i}]"), "stack.flaws"],
                format!("unknown flaw `{f}`"),
            );
            err.key = Some("flaws".into());
            err.suggestion = nearest(f, KNOWN_FLAWS.iter().copied());
            return Err(err);
        }
    }
    let external = match &s.external {
        None => None,
        Some(x) => {
            if !s.flaws.is_empty() {
                return Err(cx.at("stack.flaws", "`flaws` only applies to the built-in stack"));
            }
            external_env(cx, &x.env)?;
            let argv = |key: &str, v: &Vec<String>| {
                if let Some(i) = v.iter().position(|a| a.contains('\0')) {
                    return Err(cx.at(
                        &format!("stack.external.{key}[{i}]"),
                        format!("`{key}[{i}]` holds a NUL byte, which no command line can carry"),
                    ));
                }
                if v.is_empty() || v[0].is_empty() {
                    Err(cx.at(
                        &format!("stack.external.{key}"),
                        format!(
                        "`{key}` must be a command as an argv array, e.g. {key} = [\"./bin/{key}\"]"
                    ),
                    ))
                } else {
                    Ok(v.clone())
                }
            };
            // Relative to the scenario's folder; checked now so a typo fails here, not after the
            // database and the fake providers have been started.
            let base = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            let cwd = base.join(x.cwd.clone().unwrap_or_default());
            if x.cwd.is_some() && !cwd.is_dir() {
                return Err(cx.at(
                    "stack.external.cwd",
                    format!(
                        "`cwd` {} is not a directory (relative paths start at the scenario's folder)",
                        cwd.display()
                    ),
                ));
            }
            Some(ExternalStack {
                api: argv("api", &x.api)?,
                worker: argv("worker", &x.worker)?,
                migrate: argv("migrate", &x.migrate)?,
                env: x.env.clone(),
                cwd,
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
        workers,
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
        email_unknown_policy,
    })
}

fn validate_load(cx: &Ctx, l: &raw::RawLoad, stack: &StackSpec) -> Result<Load, ScenarioError> {
    if !(1..=1_000_000).contains(&l.recipients) {
        return Err(cx.at(
            "load.recipients",
            format!(
                "`recipients` must be between 1 and 1000000 (got {})",
                l.recipients
            ),
        ));
    }
    let channels = l.channels.clone();
    if channels.is_empty() {
        return Err(cx.at(
            "load.channels",
            "`channels` must name at least one of `line`, `email`, `sms`",
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, c) in channels.iter().enumerate() {
        if !seen.insert(*c) {
            let mut err = cx.at(
                &format!("load.channels[{i}]"),
                format!("channel `{}` is listed twice", c.as_str()),
            );
            err.key = Some("channels".into());
            return Err(err);
        }
    }
    let pacing = match (l.batches, l.rate) {
        (Some(_), Some(_)) => {
            return Err(cx.at("load.rate", "`batches` and `rate` are exclusive: give one"));
        }
        (Some(n), None) => {
            if n == 0 || n > l.recipients {
                return Err(cx.at(
                    "load.batches",
                    format!(
                        "`batches` must be between 1 and `recipients` ({}) (got {n})",
                        l.recipients
                    ),
                ));
            }
            if l.duration.is_some() {
                return Err(cx.at(
                    "load.duration",
                    "`duration` goes with `rate`, not `batches`",
                ));
            }
            Pacing::Batches(n)
        }
        (None, Some(r)) => {
            if !(0.001..=1000.0).contains(&r) {
                return Err(cx.at(
                    "load.rate",
                    format!("`rate` must be between 0.001 and 1000 batches per second (got {r})"),
                ));
            }
            let Some(d) = l.duration.filter(|d| !d.0.is_zero()) else {
                return Err(cx.at("load.rate", "`rate` needs a `duration` greater than 0"));
            };
            let pacing = Pacing::Rate {
                per_second: r,
                duration: d.0,
            };
            if pacing.batch_count() > l.recipients {
                return Err(cx.at(
                    "load.rate",
                    "`rate` × `duration` gives more batches than recipients",
                ));
            }
            pacing
        }
        (None, None) => Pacing::Batches(1),
    };
    validate_template(cx, &l.template, &channels, stack)?;
    let template_edit = l
        .template_edit
        .as_ref()
        .map(|e| validate_template_edit(cx, e, pacing.batch_count()))
        .transpose()?;
    Ok(Load {
        recipients: l.recipients,
        channels,
        pacing,
        template: l.template.clone(),
        tricky_names: l.tricky_names.get(),
        trickle: l
            .trickle
            .as_ref()
            .map(|t| validate_trickle(cx, t))
            .transpose()?,
        repeat: l
            .repeat
            .as_ref()
            .map(|r| validate_repeat(cx, r))
            .transpose()?,
        template_edit,
    })
}

/// An edit needs a batch before it (what it edits under) and one from it on (what carries it).
fn validate_template_edit(
    cx: &Ctx,
    e: &raw::RawTemplateEdit,
    batches: u32,
) -> Result<TemplateEdit, ScenarioError> {
    if e.from_batch < 2 || e.from_batch > batches {
        return Err(cx.at(
            "load.template_edit.from_batch",
            format!(
                "`from_batch` must be between 2 and the number of batches ({batches}) (got {}): \
                 an edit needs a batch before it and one after",
                e.from_batch
            ),
        ));
    }
    Ok(TemplateEdit {
        from_batch: e.from_batch,
    })
}

fn validate_trickle(cx: &Ctx, t: &raw::RawTrickle) -> Result<Trickle, ScenarioError> {
    if t.rate.0 > 1000.0 {
        return Err(cx.at(
            "load.trickle.rate",
            format!("trickle `rate` must be at most 1000/s (got {}/s)", t.rate.0),
        ));
    }
    if !(1..=100).contains(&t.recipients) {
        return Err(cx.at(
            "load.trickle.recipients",
            format!(
                "trickle `recipients` must be between 1 and 100: its orders are small (got {})",
                t.recipients
            ),
        ));
    }
    Ok(Trickle {
        per_second: t.rate.0,
        recipients: t.recipients,
    })
}

fn validate_repeat(cx: &Ctx, r: &raw::RawRepeat) -> Result<Repeat, ScenarioError> {
    if r.share.get() <= 0.0 {
        return Err(cx.at(
            "load.repeat.share",
            "repeat `share` must be greater than 0%; leave `repeat` out to repeat nothing",
        ));
    }
    if r.after.max > Duration::from_secs(60) {
        return Err(cx.at(
            "load.repeat.after",
            "repeat `after` must end within 60s of the original request",
        ));
    }
    Ok(Repeat {
        share: r.share.get(),
        after_min: r.after.min,
        after_max: r.after.max,
    })
}

/// Every body parses, uses only variables the load generator provides, and the bodies the chosen
/// channels need are not empty.
fn validate_template(
    cx: &Ctx,
    t: &raw::RawTemplate,
    channels: &[Channel],
    stack: &StackSpec,
) -> Result<(), ScenarioError> {
    if t.id.trim().is_empty() {
        return Err(cx.at("load.template.id", "template `id` must not be empty"));
    }
    let parts = [
        ("subject", &t.subject),
        ("text", &t.text),
        ("html", &t.html),
        ("line", &t.line),
        ("sms", &t.sms),
    ];
    for ch in channels {
        let needed: &[&str] = match ch {
            Channel::Line => &["line"],
            Channel::Sms => &["sms"],
            Channel::Email => &["subject", "text"],
        };
        for part in needed {
            let body = parts.iter().find(|(p, _)| p == part).map(|(_, b)| b);
            if body.is_some_and(|b| b.trim().is_empty()) {
                return Err(cx.at(
                    &format!("load.template.{part}"),
                    format!(
                        "template `{part}` must not be empty: channel `{}` sends it",
                        ch.as_str()
                    ),
                ));
            }
        }
    }
    // The built-in stack refuses unescaped slots unless its flaw switch puts them back.
    let allow_unescaped =
        stack.kind == StackKind::External || stack.flaws.iter().any(|f| f == "unescaped-template");
    // The built-in stack renders ting-template's subset: escaped variables and comments only.
    let rules = template::Rules {
        allow_unescaped,
        variables_only: stack.kind != StackKind::External,
    };
    for (part, body) in parts {
        if let Err(e) = template::check(body, rules) {
            let mut err = cx.at(
                &format!("load.template.{part}"),
                format!("template `{part}` at {}: {}", e.at, e.message),
            );
            err.suggestion = e.suggestion;
            return Err(err);
        }
    }
    Ok(())
}

fn merge_bad(
    cx: &Ctx,
    channel: &str,
    from_load: mock_providers::units::Ratio,
    provider: &mut mock_providers::units::Ratio,
) -> Result<(), ScenarioError> {
    if from_load.get() > 0.0 {
        if provider.get() > 0.0 && provider.get() != from_load.get() {
            return Err(cx.at(&format!("load.bad_addresses.{channel}"), format!(
                "bad-address share for `{channel}` is set both here ({}) and in its [providers] table ({}); keep one",
                from_load.get(), provider.get()
            )));
        }
        *provider = from_load;
    }
    Ok(())
}

/// Provider settings that parse but cannot work: the rules `mocks --config` and
/// `PUT /_mock/faults` apply too ([`mock_providers::validate`]), placed at the key.
fn validate_providers(
    cx: &Ctx,
    p: &mock_providers::config::ProvidersConfig,
) -> Result<(), ScenarioError> {
    chaos_ext::no_outage_in_profiles(cx, p)?;
    mock_providers::validate::providers(p).map_err(|e| {
        let e = e.under("providers");
        let paths: Vec<&str> = e.paths.iter().map(String::as_str).collect();
        cx.at_first(&paths, e.message)
    })
}
