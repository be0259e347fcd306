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
