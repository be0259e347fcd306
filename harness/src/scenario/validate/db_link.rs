//! The rules of the database-link chaos actions (`db_partition`, `db_reset`, `db_latency`,
//! `db_bandwidth`): which of `delay`, `jitter` (shared with `provider_latency`) and `bytes_per_s`
//! each takes, and their ranges.
//! The rules every action shares (trigger, target, `for`) stay in the parent module.

use std::time::Duration;

use super::super::raw::{ChaosAction, RawChaos};
use super::super::DbLinkFault;
use super::{Ctx, ScenarioError};

/// The longest `delay` or `jitter`: a link slower than this is a partition, and says so.
const MAX_DELAY: Duration = Duration::from_secs(60);

/// Whether `a` acts on a database link.
pub(super) fn is_db_link(a: ChaosAction) -> bool {
    matches!(
        a,
        ChaosAction::DbPartition
            | ChaosAction::DbReset
            | ChaosAction::DbLatency
            | ChaosAction::DbBandwidth
    )
}

/// The link fault of chaos step `index` (`None` for an action that is not on a link), or the
/// error of the first key it misuses.
pub(super) fn fault(
    cx: &Ctx,
    index: usize,
    c: &RawChaos,
) -> Result<Option<DbLinkFault>, ScenarioError> {
    let key = |k: &str| format!("chaos[{index}].{k}");
    let err = |k: &str, msg: String| cx.at(&key(k), format!("[[chaos]] #{}: {msg}", index + 1));
    let only = |k: &str, given: bool, owners: &[ChaosAction]| {
        if given && !owners.contains(&c.action) {
            let names: Vec<String> = owners
                .iter()
                .map(|a| format!("`{}`", super::chaos::action_name(*a)))
                .collect();
            return Err(err(
                k,
                format!("`{k}` only applies to {}", names.join(" and ")),
            ));
        }
        Ok(())
    };
    let latency_actions = [ChaosAction::DbLatency, ChaosAction::ProviderLatency];
    only("delay", c.delay.is_some(), &latency_actions)?;
    only("jitter", c.jitter.is_some(), &latency_actions)?;
    only(
        "bytes_per_s",
        c.bytes_per_s.is_some(),
        &[ChaosAction::DbBandwidth],
    )?;
    let fault = match c.action {
        ChaosAction::DbPartition => DbLinkFault::Partition,
        ChaosAction::DbReset => DbLinkFault::Reset,
        ChaosAction::DbLatency => {
            let (delay, jitter) = latency(&err, c, "the time added each way (e.g. \"20ms\")")?;
            DbLinkFault::Latency { delay, jitter }
        }
        ChaosAction::DbBandwidth => match c.bytes_per_s {
            None => {
                return Err(err(
                    "action",
                    "`db_bandwidth` needs `bytes_per_s`, the cap each way".into(),
                ))
            }
            Some(0) => return Err(err(
                "bytes_per_s",
                "`bytes_per_s` must be at least 1 (a link that passes nothing is a `db_partition`)"
                    .into(),
            )),
            Some(n) => DbLinkFault::Bandwidth { bytes_per_s: n },
        },
        _ => return Ok(None),
    };
    Ok(Some(fault))
}

/// The `delay` and `jitter` of a latency action (`db_latency`, `provider_latency`): `delay`
/// given (`what` says what it is) and above 0, both at most [`MAX_DELAY`] (slower than that is a
/// partition, and the error names the partition action of the same link).
pub(super) fn latency(
    err: &dyn Fn(&str, String) -> ScenarioError,
    c: &RawChaos,
    what: &str,
) -> Result<(Duration, Duration), ScenarioError> {
    let action = super::chaos::action_name(c.action);
    let partition = match c.action {
        ChaosAction::ProviderLatency => "provider_partition",
        _ => "db_partition",
    };
    let Some(delay) = c.delay.map(|d| d.0) else {
        return Err(err("action", format!("`{action}` needs `delay`, {what}")));
    };
    if delay.is_zero() {
        return Err(err("delay", "`delay` must be greater than 0".into()));
    }
    let jitter = c.jitter.map_or(Duration::ZERO, |d| d.0);
    for (k, d) in [("delay", delay), ("jitter", jitter)] {
        if d > MAX_DELAY {
            return Err(err(
                k,
                format!(
                    "`{k}` is at most {}; a link slower than that is a `{partition}`",
                    humantime::format_duration(MAX_DELAY)
                ),
            ));
        }
    }
    Ok((delay, jitter))
}
