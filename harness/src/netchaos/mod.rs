//! Chaos on the links between each stack process and PostgreSQL. Every stack process gets a
//! [`proxy::Proxy`] of its own (its `TING_DATABASE_URL` names the proxy's port) and a worker
//! restarted by chaos keeps its slot's proxy, so a step can partition, reset, slow or throttle
//! one process's link or all of them ([`link::Link`]). The harness's own connections (status,
//! migrations it checks, the database chaos actions) go to PostgreSQL directly.

pub mod link;
pub mod proxy;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::Context;

pub use link::{Counters, Faults, Latency, Link};
pub use proxy::Proxy;

/// Whose link: one per stack process role, one per worker slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkOwner {
    Migrate,
    Api,
    /// 1-based worker slot; its replacements use the same link.
    Worker(u32),
}

impl std::fmt::Display for LinkOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkOwner::Migrate => f.write_str("migrate"),
            LinkOwner::Api => f.write_str("api"),
            LinkOwner::Worker(s) => write!(f, "worker {s}"),
        }
    }
}

/// The run's database links, made on first use per owner.
pub struct Links {
    /// The run's database URL (what the harness itself connects to).
    direct: reqwest::Url,
    upstream: String,
    seed: u64,
    proxies: Mutex<BTreeMap<LinkOwner, Proxy>>,
}

impl Links {
    /// Links to the database at `database_url`, which must be a TCP URL (`host:port`): a
    /// Unix-socket URL cannot be proxied, and is refused with a clear error.
    pub fn new(database_url: &str, seed: u64) -> anyhow::Result<Links> {
        let direct = reqwest::Url::parse(database_url).context("parse the database URL")?;
        let host = direct
            .host_str()
            .filter(|h| !h.is_empty() && !h.starts_with('%'));
        let in_query = direct.query_pairs().any(|(k, _)| k == "host");
        let Some(host) = host.filter(|_| !in_query) else {
            anyhow::bail!(
                "database link chaos needs a TCP database URL (postgres://host:port/db); this one \
                 connects through a Unix socket"
            );
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = direct.port().unwrap_or(5432);
        let upstream = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Ok(Links {
            direct,
            upstream,
            seed,
            proxies: Mutex::default(),
        })
    }

    /// The database URL `owner` gets: the run's URL with host and port of its own proxy.
    pub async fn url_for(&self, owner: LinkOwner) -> anyhow::Result<String> {
        let existing = self.proxies.lock().unwrap().get(&owner).map(|p| p.addr);
        let addr = match existing {
            Some(a) => a,
            None => {
                let link = Arc::new(Link::new(owner.to_string(), self.seed ^ link_seed(owner)));
                let p = Proxy::start(self.upstream.clone(), link).await?;
                // Two callers racing for one owner share the first proxy.
                self.proxies.lock().unwrap().entry(owner).or_insert(p).addr
            }
        };
        let mut url = self.direct.clone();
        url.set_host(Some(&addr.ip().to_string()))
            .map_err(|e| anyhow::anyhow!("database URL host: {e}"))?;
        url.set_port(Some(addr.port()))
            .map_err(|()| anyhow::anyhow!("database URL cannot take a port"))?;
        Ok(url.to_string())
    }

    /// The link of `owner`, if it was made.
    pub fn link(&self, owner: LinkOwner) -> Option<Arc<Link>> {
        self.proxies
            .lock()
            .unwrap()
            .get(&owner)
            .map(|p| p.link.clone())
    }

    /// Every link made so far, by owner.
    pub fn all(&self) -> Vec<(LinkOwner, Arc<Link>)> {
        self.proxies
            .lock()
            .unwrap()
            .iter()
            .map(|(o, p)| (*o, p.link.clone()))
            .collect()
    }
}

fn link_seed(owner: LinkOwner) -> u64 {
    match owner {
        LinkOwner::Migrate => 0x11,
        LinkOwner::Api => 0x22,
        LinkOwner::Worker(s) => 0x1000 + u64::from(s),
    }
}

#[cfg(test)]
mod tests;
