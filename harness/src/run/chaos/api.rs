//! `target = "api"`: SIGKILL, SIGTERM or restart of the API process while batches are being
//! enqueued, and its replacement on the same address (the load and the fakes' callbacks know
//! only that address). Applied when the old API was seen to exit by the signal and a new API
//! process answered its readiness check. The signal is aimed, as a worker's is at a send in
//! flight ([`super::aim`]): it waits up to [`super::aim::AIM_WITHIN`] for the API's next 2xx
//! answer to a batch and lands right after it — the moment an API that answers before it
//! commits still holds the batch only in memory. One that commits first loses nothing there. While the API is down the load retries each batch with
//! the same batch id (`load::RETRY_FOR`) and the fakes retry the delivery reports it could not
//! take (`mock_providers::callbacks`): neither is the stack's loss.
//!
//! Only [`crate::supervise`] signals the process; this module asks it to.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::{exit_effect, Chaos, OBSERVE_WITHIN};
use crate::check::EventKind;
use crate::report::chaos_steps::ChaosOutcome;
use crate::scenario::{ChaosAction, ChaosStep};
use crate::supervise::Spec;

/// How long a replacement API has to answer `GET /healthz`.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// The running API process and how to start another.
#[derive(Clone)]
pub struct ApiProcess {
    pub pid: u32,
    pub spec: Spec,
    /// `http://addr`, the same for every API process of the run.
    pub base: String,
}

/// Signals the API and, on a task the run waits for, observes its exit and starts the new one.
///
/// One step on the API at a time: a step due while an earlier one's old API is still draining or
/// its replacement still starting waits until that replacement is ready (or failed), and acts on
/// it — the API running from then on. Signalling the draining process instead would start two
/// replacements on one address.
pub(super) async fn act(chaos: &Arc<Chaos>, i: usize, step: &ChaosStep, why: &str) {
    let turn = chaos.api_turn.clone().lock_owned().await;
    let answered = chaos.world.enqueue_answered.clone();
    let aimed = tokio::time::timeout(super::aim::AIM_WITHIN, answered.notified())
        .await
        .is_ok();
    let aim = if aimed {
        "right after the API answered a batch 2xx".to_string()
    } else {
        format!(
            "no batch answered within {}: signalled anyway",
            humantime::format_duration(super::aim::AIM_WITHIN)
        )
    };
    let Some(api) = chaos.api.lock().unwrap().clone() else {
        chaos.log(i).decide(
            ChaosOutcome::NoTarget,
            format!("{why}: no API process is running"),
        );
        return;
    };
    let w = &chaos.world;
    let sup = &w.supervisor;
    if !sup.is_alive(api.pid) {
        let reason = format!("{why}: the API (pid {}) is not running", api.pid);
        w.event(EventKind::ChaosNoTarget, None, None, reason.clone());
        chaos.log(i).decide(ChaosOutcome::NoTarget, reason);
        return;
    }
    let (signal, label) = match step.action {
        ChaosAction::Sigkill => (Signal::SIGKILL, "SIGKILL"),
        ChaosAction::Restart => (Signal::SIGTERM, "SIGTERM (restart)"),
        _ => (Signal::SIGTERM, "SIGTERM"),
    };
    let back_after = match step.action {
        ChaosAction::Restart => Duration::ZERO,
        _ => step.restart_after.unwrap_or_default(),
    };
    // The old API's exit, then the new one ready.
    chaos.log(i).target(api.pid, 2);
    w.event(
        EventKind::ApiSignal,
        None,
        Some(api.pid),
        format!("{label}: {why}; {aim}"),
    );
    if let Err(e) = sup.signal(api.pid, signal) {
        chaos
            .log(i)
            .observe(false, format!("{signal} to API pid {}: {e:#}", api.pid));
        return;
    }
    let me = chaos.clone();
    chaos.keep(tokio::spawn(async move {
        me.observe_api_exit(i, api.pid, signal).await;
        tokio::time::sleep(back_after).await;
        me.start_api(i, &api).await;
        drop(turn);
    }));
}

impl Chaos {
    /// Waits for the API to exit (SIGTERM: within the grace period, then SIGKILL).
    async fn observe_api_exit(&self, i: usize, pid: u32, signal: Signal) {
        let w = &self.world;
        let sup = &w.supervisor;
        let grace = w.scenario.stack.shutdown_grace;
        if signal == Signal::SIGTERM && !sup.wait_exit(pid, grace).await {
            w.event(
                EventKind::GraceExceeded,
                None,
                Some(pid),
                format!(
                    "API still running {} after SIGTERM; SIGKILL",
                    humantime::format_duration(grace)
                ),
            );
            sup.terminate(pid, Duration::ZERO).await;
        }
        let exited = sup.wait_exit(pid, OBSERVE_WITHIN).await;
        let rec = sup.record(pid);
        let (ok, what) = match &rec {
            Some(r) if exited && r.exited_ns.is_some() => exit_effect(r, signal),
            _ => (false, format!("API pid {pid} still running after {signal}")),
        };
        w.event(
            EventKind::Exit,
            None,
            Some(pid),
            format!("api {:?}", rec.map(|r| (r.exit_code, r.signal))),
        );
        self.log(i).observe(ok, format!("API {what}"));
    }

    /// Starts a new API process on the same address; took effect once it answered `/healthz`.
    async fn start_api(&self, i: usize, old: &ApiProcess) {
        let w = &self.world;
        let since = Instant::now();
        let pid = match w.supervisor.spawn(old.spec.clone()).await {
            Ok(pid) => pid,
            Err(e) => {
                w.event(EventKind::RestartFailed, None, None, format!("api: {e:#}"));
                self.log(i)
                    .observe(false, format!("the new API did not start: {e:#}"));
                return;
            }
        };
        w.attributor.add_candidate(pid);
        *self.api.lock().unwrap() = Some(ApiProcess { pid, ..old.clone() });
        let ready =
            crate::run::start::wait_healthy(&w.supervisor, pid, &old.base, READY_WITHIN).await;
        match ready {
            Ok(()) => {
                w.event(EventKind::ApiReady, None, Some(pid), old.base.clone());
                self.log(i).observe(
                    true,
                    format!(
                        "new API pid {pid} answered {}/healthz {} ms after it started",
                        old.base,
                        since.elapsed().as_millis()
                    ),
                );
            }
            Err(e) => {
                w.event(
                    EventKind::RestartFailed,
                    None,
                    Some(pid),
                    format!("api: {e:#}"),
                );
                self.log(i).observe(
                    false,
                    format!("the new API pid {pid} never became ready: {e:#}"),
                );
            }
        }
    }
}
