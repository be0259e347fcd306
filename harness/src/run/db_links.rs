//! Which stack processes reach PostgreSQL through a proxy of `crate::netchaos`: the API and
//! every worker slot, when the scenario has a database-link chaos step (a run without one
//! measures the stack with no proxy hop in its path). The migration and the harness's own
//! connections (status, database chaos) go direct.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::netchaos::{LinkOwner, Links};
use crate::scenario::Scenario;

/// The run's links, when a step needs them.
pub fn for_run(scenario: &Scenario, database_url: &str) -> anyhow::Result<Option<Arc<Links>>> {
    if scenario.chaos.iter().all(|c| c.db_link.is_none()) {
        return Ok(None);
    }
    Ok(Some(Arc::new(Links::new(database_url, scenario.seed)?)))
}

/// Points `owner`'s `TING_DATABASE_URL` in `env` at its proxy (made on first use; a replaced
/// worker gets its slot's).
pub async fn route(
    links: &Option<Arc<Links>>,
    owner: LinkOwner,
    env: &mut BTreeMap<String, String>,
) -> anyhow::Result<()> {
    if let Some(l) = links {
        env.insert("TING_DATABASE_URL".into(), l.url_for(owner).await?);
    }
    Ok(())
}
