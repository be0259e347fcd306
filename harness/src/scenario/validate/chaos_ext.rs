//! The rules of the chaos actions on providers and on the API process: `target = "api"` only
//! with a signal or restart (and a way back), `provider_outage` only with a provider that has an
//! outage mode, `provider` and `mode` only with a provider action, and no `outage` written into a
//! `[providers.*]` table (an outage for the whole run is a `[[chaos]]` step's job). Called only
//! from [`super::chaos::validate_chaos`]; errors are placed at the key, like every other rule.

use super::super::raw::{self, ChaosAction};
use super::super::{ProviderFault, Target};
use super::Ctx;
use crate::scenario::ScenarioError;
use mock_providers::outage::OutageMode;

type Err<'a> = &'a dyn Fn(&str, String) -> ScenarioError;

use super::chaos::action_name;

/// `target = "api"`: SIGKILL, SIGTERM or restart of the API, which must come back (the load and
/// the fakes' callbacks use it), so a kill or a term needs `restart_after`.
pub(super) fn api_target(
    err: Err,
    c: &raw::RawChaos,
    target: &Target,
) -> Result<(), ScenarioError> {
    if *target != Target::Api {
        return Ok(());
    }
    match c.action {
        ChaosAction::Restart => Ok(()),
        ChaosAction::Sigkill | ChaosAction::Sigterm if c.restart_after.is_some() => Ok(()),
        ChaosAction::Sigkill | ChaosAction::Sigterm => Err(err(
            "target",
            format!(
                "`target = \"api\"` with `{}` needs `restart_after`: the load and the providers' \
                 callbacks need the API back (or use `action = \"restart\"`)",
                action_name(c.action)
            ),
        )),
        other => Err(err(
            "target",
            format!(
                "`target = \"api\"` takes `sigkill`, `sigterm` or `restart`, not `{}`",
                action_name(other)
            ),
        )),
    }
}

/// `provider_outage`'s provider and mode; `provider` and `mode` on any other action are errors.
pub(super) fn provider_fault(
    err: Err,
    cx: &Ctx,
    key: &dyn Fn(&str) -> String,
    c: &raw::RawChaos,
) -> Result<Option<ProviderFault>, ScenarioError> {
    if c.action != ChaosAction::ProviderOutage {
        let link = super::provider_link::is_provider_link(c.action);
        for (k, given, owners) in [
            (
                "provider",
                c.provider.is_some() && !link,
                "`provider_outage` and the provider-link actions",
            ),
            ("mode", c.mode.is_some(), "`provider_outage`"),
        ] {
            if given {
                return Err(err(
                    k,
                    format!(
                        "`{k}` only applies to {owners}, not `{}`",
                        action_name(c.action)
                    ),
                ));
            }
        }
        return Ok(None);
    }
    let Some(provider) = c.provider else {
        return Err(err(
            "action",
            "`provider_outage` needs `provider`, which fake fails: `line`, `smtp` or `sms`".into(),
        ));
    };
    if cx.keys.get(&key("target")).is_some() {
        return Err(err(
            "target",
            "`provider_outage` fails the provider for every process; `target` does not apply"
                .into(),
        ));
    }
    if c.restart_after.is_some() {
        return Err(err(
            "restart_after",
            "`restart_after` applies to process actions only".into(),
        ));
    }
    Ok(Some(ProviderFault {
        provider: provider.provider(),
        mode: c.mode.unwrap_or(OutageMode::Unavailable),
    }))
}

/// An `outage` in a `[providers.*]` table would fail the provider for the whole run: refused,
/// pointing at the `[[chaos]]` step that does it for a while.
pub(super) fn no_outage_in_profiles(
    cx: &Ctx,
    p: &mock_providers::config::ProvidersConfig,
) -> Result<(), ScenarioError> {
    for (name, set) in [
        ("line", p.line.outage.is_some()),
        ("smtp", p.smtp.outage.is_some()),
        ("sms", p.sms.outage.is_some()),
    ] {
        if set {
            return Err(cx.at(
                &format!("providers.{name}.outage"),
                format!(
                    "[providers.{name}] `outage` would fail the provider for the whole run; use a \
                     [[chaos]] step `action = \"provider_outage\"` with `provider = \"{name}\"` and `for`"
                ),
            ));
        }
    }
    Ok(())
}
