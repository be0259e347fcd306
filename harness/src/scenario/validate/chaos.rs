//! The `[[chaos]]` steps: each step's trigger, action, target and timing checked against the
//! stack it will run on, with the cross-field rules of every action, placed at the key that is
//! wrong. Actions with keys of their own have their rules in `chaos_ext.rs` and `db_link.rs`.

use super::*;

pub(super) fn validate_chaos(
    cx: &Ctx,
    index: usize,
    c: &raw::RawChaos,
    stack: &StackSpec,
    load: &Load,
) -> Result<ChaosStep, ScenarioError> {
    let base = format!("chaos[{index}]");
    let key = |k: &str| format!("{base}.{k}");
    let err = |k: &str, msg: String| cx.at(&key(k), format!("[[chaos]] #{}: {msg}", index + 1));
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
                return Err(err("on_accept.nth", "`on_accept.nth` counts from 1".into()));
            }
            if !load.channels.contains(&o.channel) {
                return Err(err(
                    "on_accept.channel",
                    format!(
                        "`on_accept` watches channel `{}`, which [load] does not send on",
                        o.channel.as_str()
                    ),
                ));
            }
            if o.nth > load.recipients {
                // The trickle's orders are not counted: only the campaign's accepts are.
                return Err(err(
                    "on_accept.nth",
                    format!(
                        "`on_accept.nth` is {} but [load] sends {} deliveries on `{}`: the step \
                         could never fire",
                        o.nth,
                        load.recipients,
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
            // Nothing to point at but the entry itself.
            let mut e = cx.at(
                &base,
                format!(
                    "[[chaos]] #{}: needs a trigger: one of `at`, `progress`, `on_accept`",
                    index + 1
                ),
            );
            e.key = None;
            return Err(e);
        }
        _ => {
            // Point at the second trigger written: the first one is fine on its own.
            let mut given: Vec<(&str, usize)> = ["at", "progress", "on_accept"]
                .into_iter()
                .filter_map(|k| cx.keys.get(&key(k)).map(|e| (k, e.key.start)))
                .collect();
            given.sort_by_key(|(_, o)| *o);
            let names: Vec<String> = given.iter().map(|(k, _)| format!("`{k}`")).collect();
            let extra = given.get(1).map_or("at", |(k, _)| *k);
            return Err(err(
                extra,
                format!(
                    "{} are both given; give exactly one trigger of `at`, `progress`, `on_accept`",
                    names.join(" and ")
                ),
            ));
        }
    };
    let target = match &c.target {
        None => Target::Random,
        Some(toml::Value::Integer(i)) => {
            if *i < 1 || *i > stack.workers as i64 {
                let why = match cx.overrides.workers_flag() {
                    Some(flag) => format!(" (`{flag}` replaces [stack].workers)"),
                    None => String::new(),
                };
                return Err(err(
                    "target",
                    format!(
                        "`target` worker {i} does not exist: workers are numbered 1..={}{why}",
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
            "api" => Target::Api,
            other => {
                let mut e = err("target", format!(
                    "unknown `target` {other:?}; expected a worker number, `random`, `busiest`, `all`, `sender` or `api`"
                ));
                e.suggestion = nearest(other, ["random", "busiest", "all", "sender", "api"]);
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
    let provider_link = provider_link::fault(cx, index, c, &target)?;
    chaos_ext::api_target(&err, c, &target)?;
    let provider_fault = chaos_ext::provider_fault(&err, cx, &key, c)?;
    let needs_for = matches!(
        c.action,
        ChaosAction::Sigstop
            | ChaosAction::DbIdleTx
            | ChaosAction::DbPartition
            | ChaosAction::DbLatency
            | ChaosAction::DbBandwidth
            | ChaosAction::ProviderOutage
    ) || provider_link.is_some();
    let action = action_name(c.action);
    match (needs_for, c.duration) {
        (true, None) => {
            // `for` is missing: point at the action that needs it.
            return Err(err(
                "action",
                format!("`{action}` needs `for`, how long it lasts"),
            ));
        }
        (false, Some(_)) => {
            return Err(err(
                "for",
                format!(
                    "`for` only applies to `sigstop`, `db_idle_tx`, `db_partition`, `db_latency`, \
                     `db_bandwidth`, `provider_outage` and the provider-link actions, not \
                     `{action}`"
                ),
            ));
        }
        _ => {}
    }
    let is_db = matches!(
        c.action,
        ChaosAction::DbRestart | ChaosAction::DbTerminate | ChaosAction::DbIdleTx
    ) || db_link::is_db_link(c.action);
    let db_link = db_link::fault(cx, index, c)?;
    if c.action == ChaosAction::DbRestart {
        refuse_restart_of_a_server(cx, &key("action"), index)?;
    }
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
        optional: c.optional,
        db_link,
        provider_fault,
        provider_link,
    })
}

/// An action's name as scenarios write it (`db_latency`).
pub(super) fn action_name(a: ChaosAction) -> &'static str {
    crate::report::chaos_steps::action_str(a)
}

/// `db_restart` restarts the run's throwaway PostgreSQL cluster; on a server (`[database].url`,
/// `--database-url`, `DATABASE_URL`) there is nothing the harness may restart, and skipping the
/// step would let a run pass without the outage it was written to survive.
fn refuse_restart_of_a_server(cx: &Ctx, action: &str, index: usize) -> Result<(), ScenarioError> {
    let server = if cx.keys.get("database.url").is_some() {
        Some("[database].url")
    } else {
        cx.overrides.database_server
    };
    match server {
        Some(given) => Err(cx.at(
            action,
            format!(
                "[[chaos]] #{}: `db_restart` restarts the run's throwaway PostgreSQL cluster, but \
                 {given} puts the run's database on a server the harness must not restart; \
                 run without it or remove this step",
                index + 1
            ),
        )),
        None => Ok(()),
    }
}
