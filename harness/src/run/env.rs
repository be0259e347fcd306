//! The environment every stack process gets: the stack contract's `TING_*` variables.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use mock_providers::config::ProvidersConfig;

use crate::scenario::Scenario;

/// Addresses of the run's infrastructure, as the stack contract names them.
pub struct Endpoints {
    pub database_url: String,
    pub api_addr: SocketAddr,
    pub line: SocketAddr,
    pub smtp: SocketAddr,
    pub sms: SocketAddr,
}

/// The variables the harness sets for every stack process, from the scenario and the run (and
/// `TING_WORKER_ID` for workers): `[stack.external] env` may not replace them, or the stack would
/// run with other settings than the ones it is judged by.
pub const CONTRACT_VARS: &[&str] = &[
    "TING_DATABASE_URL",
    "TING_API_ADDR",
    "TING_LINE_API_BASE",
    "TING_LINE_CHANNEL_TOKEN",
    "TING_SMTP_ADDR",
    "TING_SMTP_EVENTS_SECRET",
    "TING_EMAIL_FROM",
    "TING_SMS_API_BASE",
    "TING_SMS_ACCOUNT_SID",
    "TING_SMS_AUTH_TOKEN",
    "TING_SMS_FROM",
    "TING_LEASE_MS",
    "TING_HEARTBEAT_MS",
    "TING_CLAIM_BATCH",
    "TING_MAX_ATTEMPTS",
    "TING_BACKOFF_BASE_MS",
    "TING_BACKOFF_FACTOR",
    "TING_BACKOFF_MAX_MS",
    "TING_BACKOFF_JITTER",
    "TING_SHUTDOWN_GRACE_MS",
    "TING_EMAIL_UNKNOWN_POLICY",
    "TING_WORKER_ID",
];

/// `TING_*` variables for every stack process (workers add `TING_WORKER_ID`).
pub fn contract_env(s: &Scenario, p: &ProvidersConfig, e: &Endpoints) -> BTreeMap<String, String> {
    let st = &s.stack;
    let mut env = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        env.insert(k.to_string(), v);
    };
    set("TING_DATABASE_URL", e.database_url.clone());
    set("TING_API_ADDR", e.api_addr.to_string());
    set("TING_LINE_API_BASE", format!("http://{}", e.line));
    set("TING_LINE_CHANNEL_TOKEN", p.line.channel_token.clone());
    set("TING_SMTP_ADDR", e.smtp.to_string());
    set("TING_SMTP_EVENTS_SECRET", p.smtp.events_secret.clone());
    set("TING_EMAIL_FROM", "notifications@ting-chaos.test".into());
    set("TING_SMS_API_BASE", format!("http://{}", e.sms));
    set("TING_SMS_ACCOUNT_SID", p.sms.account_sid.clone());
    set("TING_SMS_AUTH_TOKEN", p.sms.auth_token.clone());
    set("TING_SMS_FROM", "+15005550006".into());
    set("TING_LEASE_MS", st.lease.as_millis().to_string());
    set("TING_HEARTBEAT_MS", st.heartbeat.as_millis().to_string());
    set("TING_CLAIM_BATCH", st.claim_batch.to_string());
    set("TING_MAX_ATTEMPTS", st.max_attempts.to_string());
    set(
        "TING_BACKOFF_BASE_MS",
        st.backoff.base.as_millis().to_string(),
    );
    set("TING_BACKOFF_FACTOR", st.backoff.factor.to_string());
    set(
        "TING_BACKOFF_MAX_MS",
        st.backoff.max.as_millis().to_string(),
    );
    set("TING_BACKOFF_JITTER", st.backoff.jitter.to_string());
    set(
        "TING_SHUTDOWN_GRACE_MS",
        st.shutdown_grace.as_millis().to_string(),
    );
    set(
        "TING_EMAIL_UNKNOWN_POLICY",
        st.email_unknown_policy.as_str().into(),
    );
    if !st.flaws.is_empty() {
        set("TING_STACK_FLAWS", st.flaws.join(","));
    }
    if let Some(x) = &st.external {
        for (k, v) in &x.env {
            env.insert(k.clone(), v.clone());
        }
    }
    // The stack logs plainly into its log files unless the scenario says otherwise.
    env.entry("RUST_LOG".into())
        .or_insert_with(|| "info".into());
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variable the harness sets from the run is one `[stack.external] env` may not
    /// replace (the flaws and `RUST_LOG` are the user's to set).
    #[test]
    fn every_variable_the_harness_sets_is_listed() {
        let text = "name = \"t\"\n[stack.external]\napi = [\"a\"]\nworker = [\"w\"]\nmigrate = [\"m\"]\nenv = { TING_WORKER_CONCURRENCY = \"4\" }\n[load]\nrecipients = 1\nchannels = [\"line\"]\n";
        let s = crate::scenario::parse(std::path::Path::new("t.toml"), text).unwrap();
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let e = Endpoints {
            database_url: "postgres://x".into(),
            api_addr: addr,
            line: addr,
            smtp: addr,
            sms: addr,
        };
        let env = contract_env(&s, &s.providers, &e);
        for k in env.keys() {
            let users = ["RUST_LOG", "TING_STACK_FLAWS", "TING_WORKER_CONCURRENCY"];
            assert!(
                CONTRACT_VARS.contains(&k.as_str()) || users.contains(&k.as_str()),
                "{k} is set by the harness but not in CONTRACT_VARS"
            );
        }
        assert_eq!(env.len(), CONTRACT_VARS.len() - 1 + 2, "{env:?}");
    }
}
