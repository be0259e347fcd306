//! The typed vocabulary of the harness's own records: the kinds of event on its timeline
//! ([`super::TimelineEvent`]: what it did to the stack and what it saw happen) and the roles of
//! the stack processes it started ([`Role`]). Typed, so a checker matching on a misspelt kind
//! does not compile instead of silently never matching. `report.json` carries them as snake_case
//! strings.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Enqueueing began / ended.
    LoadStart,
    LoadDone,
    /// The API answered its readiness check.
    ApiReady,
    /// A stack process was started (first start or replacement).
    Spawn,
    /// A stack process exited: `exit` when the harness expected it (a signal it sent, a clean
    /// exit after SIGTERM), `crashed` when it exited on its own.
    Exit,
    Crashed,
    /// Chaos signals to one worker.
    Sigkill,
    Sigterm,
    Sigstop,
    Sigcont,
    /// A `restart` action: SIGTERM (`restart_begin`), then the replacement (`restart`), or the
    /// replacement that could not start (`restart_failed`).
    RestartBegin,
    Restart,
    RestartFailed,
    /// A SIGTERM'd process outlived its grace period and was SIGKILLed.
    GraceExceeded,
    /// A chaos step found no live worker to act on.
    ChaosNoTarget,
    /// The database restart: begun, back up, failed, or skipped (no throwaway cluster).
    DbRestart,
    DbRestarted,
    DbRestartFailed,
    DbRestartSkipped,
    /// `pg_terminate_backend` on the stack's sessions: sessions ended, none found, or failed.
    DbTerminate,
    DbTerminateNoTarget,
    DbTerminateFailed,
    /// An idle transaction holding locks: begun, ended.
    DbIdleTx,
    DbIdleTxEnd,
    /// A stack process's database link (`harness/src/netchaos`): partitioned (traffic held both
    /// ways, connections open), healed, its connections reset, slowed (latency or a bandwidth
    /// cap), back to full speed. Each names the process whose link it is.
    DbLinkPartition,
    DbLinkHeal,
    DbLinkReset,
    DbLinkSlow,
    DbLinkSlowEnd,
    /// A chaos signal to the API process (`target = "api"`); the detail names the signal. The
    /// API's exit is an `exit`, the replacement answering its readiness check an `api_ready`.
    ApiSignal,
    /// A provider-wide outage began / ended (`provider_outage`); the detail names the provider,
    /// the mode and, at the end, the requests it answered.
    ProviderOutage,
    ProviderOutageEnd,
    /// A fault on one worker's link to a provider began (`provider_partition`,
    /// `provider_refuse`, `provider_reset`, `provider_latency`) / ended; each names the worker
    /// whose link it is, the detail the provider and, at the end, the requests it met.
    ProviderLinkPartition,
    ProviderLinkRefuse,
    ProviderLinkReset,
    ProviderLinkSlow,
    ProviderLinkHeal,
    /// The run settled / reached its deadline unsettled / stopped before settling (nothing left
    /// to make progress).
    Quiescent,
    Deadline,
    StoppedEarly,
}

impl EventKind {
    /// Whether the event may have left a lease behind that a rescue can still act on: a stack
    /// process killed, frozen, stopped or cut off from its database or a provider, or the
    /// database itself disturbed. Quiescence waits a lease and a heartbeat past the last one, so
    /// a stack that would resend a rescued row does so where the ledger sees it.
    pub fn unsettles_leases(self) -> bool {
        use EventKind::*;
        match self {
            LoadStart | LoadDone | ApiReady | Spawn | ChaosNoTarget | Quiescent | Deadline
            | StoppedEarly | DbRestartSkipped | DbTerminateNoTarget => false,
            Exit
            | Crashed
            | Sigkill
            | Sigterm
            | Sigstop
            | Sigcont
            | RestartBegin
            | Restart
            | RestartFailed
            | GraceExceeded
            | DbRestart
            | DbRestarted
            | DbRestartFailed
            | DbTerminate
            | DbTerminateFailed
            | DbIdleTx
            | DbIdleTxEnd
            | DbLinkPartition
            | DbLinkHeal
            | DbLinkReset
            | DbLinkSlow
            | DbLinkSlowEnd
            | ApiSignal
            | ProviderOutage
            | ProviderOutageEnd
            | ProviderLinkPartition
            | ProviderLinkRefuse
            | ProviderLinkReset
            | ProviderLinkSlow
            | ProviderLinkHeal => true,
        }
    }

    /// The snake_case name `report.json` uses.
    pub fn as_str(self) -> &'static str {
        use EventKind::*;
        match self {
            LoadStart => "load_start",
            LoadDone => "load_done",
            ApiReady => "api_ready",
            Spawn => "spawn",
            Exit => "exit",
            Crashed => "crashed",
            Sigkill => "sigkill",
            Sigterm => "sigterm",
            Sigstop => "sigstop",
            Sigcont => "sigcont",
            RestartBegin => "restart_begin",
            Restart => "restart",
            RestartFailed => "restart_failed",
            GraceExceeded => "grace_exceeded",
            ChaosNoTarget => "chaos_no_target",
            DbRestart => "db_restart",
            DbRestarted => "db_restarted",
            DbRestartFailed => "db_restart_failed",
            DbRestartSkipped => "db_restart_skipped",
            DbTerminate => "db_terminate",
            DbTerminateNoTarget => "db_terminate_no_target",
            DbTerminateFailed => "db_terminate_failed",
            DbIdleTx => "db_idle_tx",
            DbIdleTxEnd => "db_idle_tx_end",
            DbLinkPartition => "db_link_partition",
            DbLinkHeal => "db_link_heal",
            DbLinkReset => "db_link_reset",
            DbLinkSlow => "db_link_slow",
            DbLinkSlowEnd => "db_link_slow_end",
            Quiescent => "quiescent",
            Deadline => "deadline",
            StoppedEarly => "stopped_early",
            ApiSignal => "api_signal",
            ProviderOutage => "provider_outage",
            ProviderOutageEnd => "provider_outage_end",
            ProviderLinkPartition => "provider_link_partition",
            ProviderLinkRefuse => "provider_link_refuse",
            ProviderLinkReset => "provider_link_reset",
            ProviderLinkSlow => "provider_link_slow",
            ProviderLinkHeal => "provider_link_heal",
        }
    }

    /// How people see it (terminal, chart, tables): the SIGTERM half of a `restart` action as
    /// "SIGTERM (restart)", every other kind by its name.
    pub fn label(self) -> &'static str {
        match self {
            EventKind::RestartBegin => "SIGTERM (restart)",
            k => k.as_str(),
        }
    }

    /// An action on the database (it concerns every process, not one pid).
    pub fn is_database(self) -> bool {
        self.as_str().starts_with("db_")
    }

    /// A fault that cut one process off its database (a partition or a reset of its link): what
    /// it was doing may not be recorded, like a kill's, though the process runs on.
    pub fn cuts_database_link(self) -> bool {
        matches!(self, EventKind::DbLinkPartition | EventKind::DbLinkReset)
    }

    /// The start of a fault on one worker's link to a provider.
    pub fn starts_provider_link_fault(self) -> bool {
        use EventKind::*;
        matches!(
            self,
            ProviderLinkPartition | ProviderLinkRefuse | ProviderLinkReset | ProviderLinkSlow
        )
    }

    /// A signal that stops a worker from acting (it is dead or frozen).
    pub fn disables_worker(self) -> bool {
        matches!(self, EventKind::Sigkill | EventKind::Sigstop)
    }
}

/// What a stack process the harness started is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The schema migration, run to completion before anything else.
    Migrate,
    Api,
    Worker,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Migrate => "migrate",
            Role::Api => "api",
            Role::Worker => "worker",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_name_is_the_str_name() {
        use EventKind::*;
        for k in [
            LoadStart,
            LoadDone,
            ApiReady,
            Spawn,
            Exit,
            Crashed,
            Sigkill,
            Sigterm,
            Sigstop,
            Sigcont,
            RestartBegin,
            Restart,
            RestartFailed,
            GraceExceeded,
            ChaosNoTarget,
            DbRestart,
            DbRestarted,
            DbRestartFailed,
            DbRestartSkipped,
            DbTerminate,
            DbTerminateNoTarget,
            DbTerminateFailed,
            DbIdleTx,
            DbIdleTxEnd,
            DbLinkPartition,
            DbLinkHeal,
            DbLinkReset,
            DbLinkSlow,
            DbLinkSlowEnd,
            Quiescent,
            Deadline,
            StoppedEarly,
            ApiSignal,
            ProviderOutage,
            ProviderOutageEnd,
            ProviderLinkPartition,
            ProviderLinkRefuse,
            ProviderLinkReset,
            ProviderLinkSlow,
            ProviderLinkHeal,
        ] {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
            let back: EventKind = serde_json::from_value(k.as_str().into()).unwrap();
            assert_eq!(back, k);
        }
        for r in [Role::Migrate, Role::Api, Role::Worker] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
    }
}
