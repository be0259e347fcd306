//! The rules of the chaos actions on workers' links to a provider (`provider_partition`,
//! `provider_refuse`, `provider_reset`, `provider_latency`): each needs `provider`, acts on
//! workers (never `target = "api"`: the API sends nothing to providers), takes no
//! `restart_after`; `provider_latency` needs `delay` (and may take `jitter`), in the ranges
//! `db_latency` has (`db_link::latency`). `for` is
//! checked with every other lasting action in the parent module.

use super::super::raw::{ChaosAction, RawChaos};
use super::super::{ProviderLinkFault, ProviderLinkKind, Target};
use super::{Ctx, ScenarioError};

/// Whether `a` acts on workers' links to a provider.
pub(super) fn is_provider_link(a: ChaosAction) -> bool {
    matches!(
        a,
        ChaosAction::ProviderPartition
            | ChaosAction::ProviderRefuse
            | ChaosAction::ProviderReset
            | ChaosAction::ProviderLatency
    )
}

/// The provider-link fault of chaos step `index` (`None` for any other action), or the error of
/// the first key it misuses.
pub(super) fn fault(
    cx: &Ctx,
    index: usize,
    c: &RawChaos,
    target: &Target,
) -> Result<Option<ProviderLinkFault>, ScenarioError> {
    if !is_provider_link(c.action) {
        return Ok(None);
    }
    let key = |k: &str| format!("chaos[{index}].{k}");
    let err = |k: &str, msg: String| cx.at(&key(k), format!("[[chaos]] #{}: {msg}", index + 1));
    let action = super::chaos::action_name(c.action);
    let Some(provider) = c.provider else {
        return Err(err(
            "action",
            format!("`{action}` needs `provider`, whose link it cuts: `line`, `smtp` or `sms`"),
        ));
    };
    if *target == Target::Api {
        return Err(err(
            "target",
            format!(
                "`{action}` acts on workers' links to a provider; the API sends nothing to \
                 providers (give a worker number, `random`, `busiest`, `all` or `sender`)"
            ),
        ));
    }
    if c.restart_after.is_some() {
        return Err(err(
            "restart_after",
            "`restart_after` applies to process actions only".into(),
        ));
    }
    let kind = match c.action {
        ChaosAction::ProviderPartition => ProviderLinkKind::Partition,
        ChaosAction::ProviderRefuse => ProviderLinkKind::Refuse,
        ChaosAction::ProviderReset => ProviderLinkKind::Reset,
        _ => {
            let what = "the time added to each send (e.g. \"2s\")";
            let (delay, jitter) = super::db_link::latency(&err, c, what)?;
            ProviderLinkKind::Latency { delay, jitter }
        }
    };
    Ok(Some(ProviderLinkFault {
        provider: provider.provider(),
        kind,
    }))
}
