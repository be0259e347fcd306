//! A whole world of fakes per test: all three servers on 127.0.0.1 port 0, and a client for them.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use base64::Engine;
use mock_providers::config::{HttpFault, ProvidersConfig};
use mock_providers::ledger::{Ledger, LedgerEntry};
use mock_providers::units::{HumanDuration, Ratio};
use mock_providers::Providers;
use serde_json::{json, Value};

pub const TOKEN: &str = "ting-line-token";

pub struct World {
    pub p: Providers,
    pub http: reqwest::Client,
}

pub async fn world(seed: u64, cfg: ProvidersConfig) -> World {
    let p = mock_providers::start(seed, cfg, IpAddr::V4(Ipv4Addr::LOCALHOST), Ledger::new())
        .await
        .expect("fakes start");
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    World { p, http }
}

/// A LINE-shaped user id for `i`.
pub fn uid(i: u32) -> String {
    format!("U{:032x}", u128::from(i) * 0x9e37_79b9_7f4a_7c15 + 1)
}

pub fn phone(i: u32) -> String {
    format!("+1555{i:07}")
}

pub fn fault(status: u16, rate: f64) -> HttpFault {
    HttpFault {
        status,
        rate: Ratio(rate),
        retry_after: None,
        code: None,
        monthly_quota: false,
        after_commit: false,
    }
}

pub fn ms(n: u64) -> HumanDuration {
    HumanDuration::from_millis(n)
}

pub struct Resp {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub json: Value,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    }
}

async fn resp(r: reqwest::Response) -> Resp {
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let bytes = r.bytes().await.unwrap();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Resp {
        status,
        headers,
        json,
    }
}

impl World {
    pub fn entries(&self) -> Vec<LedgerEntry> {
        self.p.ledger.snapshot()
    }

    /// Raw LINE push with full control over auth, key and body.
    pub async fn line_raw(&self, auth: Option<&str>, key: Option<&str>, body: String) -> Resp {
        let mut rb = self
            .http
            .post(format!("{}/v2/bot/message/push", self.p.line_base()))
            .header("content-type", "application/json")
            .body(body);
        if let Some(a) = auth {
            rb = rb.header("authorization", format!("Bearer {a}"));
        }
        if let Some(k) = key {
            rb = rb.header("x-line-retry-key", k);
        }
        resp(rb.send().await.unwrap()).await
    }

    pub async fn line_push(&self, to: &str, key: Option<&str>, text: &str) -> Resp {
        let body = json!({"to": to, "messages": [{"type": "text", "text": text}]}).to_string();
        self.line_raw(Some(TOKEN), key, body).await
    }

    pub fn sms_url(&self, path: &str) -> String {
        let sid = &self.p.config().sms.account_sid;
        format!("{}/2010-04-01/Accounts/{sid}/{path}", self.p.sms_base())
    }

    fn basic(&self) -> String {
        let c = self.p.config().sms;
        let raw = format!("{}:{}", c.account_sid, c.auth_token);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }

    /// Raw Twilio create; `auth = false` sends no credentials.
    pub async fn sms_raw(&self, auth: bool, form: &[(&str, &str)], key: Option<&str>) -> Resp {
        let mut rb = self.http.post(self.sms_url("Messages.json")).form(form);
        if auth {
            rb = rb.header("authorization", self.basic());
        }
        if let Some(k) = key {
            rb = rb.header("idempotency-key", k);
        }
        resp(rb.send().await.unwrap()).await
    }

    pub async fn sms_send(&self, to: &str, body: &str, callback: Option<&str>) -> Resp {
        let mut form = vec![("To", to), ("From", "+15550009999"), ("Body", body)];
        if let Some(cb) = callback {
            form.push(("StatusCallback", cb));
        }
        self.sms_raw(true, &form, None).await
    }

    pub async fn sms_get(&self, path_and_query: &str) -> Resp {
        let rb = self
            .http
            .get(self.sms_url(path_and_query))
            .header("authorization", self.basic());
        resp(rb.send().await.unwrap()).await
    }

    pub async fn get(&self, url: String) -> Resp {
        resp(self.http.get(url).send().await.unwrap()).await
    }
}

/// Waits for `cond` to hold, checking after every ledger append, up to `secs` seconds.
pub async fn until(secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {secs}s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
