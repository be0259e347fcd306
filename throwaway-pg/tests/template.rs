//! The initdb template cache: the first cluster publishes a pristine copy, later clusters are
//! copies of it (same system identifier) yet independent of each other, and
//! `TING_PG_NO_TEMPLATE` bypasses it.
//!
//! The only test in this binary, because it sets `TING_PG_TMPDIR`/`TING_PG_NO_TEMPLATE`; it
//! works in its own base directory so it never touches the shared `/tmp` template.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sqlx::{Connection, PgConnection};
use throwaway_pg::{Cluster, ClusterOptions, NO_TEMPLATE_ENV, TMPDIR_ENV};

async fn system_identifier(cluster: &Cluster) -> i64 {
    let mut conn = PgConnection::connect(&cluster.admin_url()).await.unwrap();
    sqlx::query_scalar("select system_identifier from pg_control_system()")
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

fn templates_in(base: &Path) -> Vec<String> {
    std::fs::read_dir(base)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ting-pg-template-"))
        .collect()
}

#[tokio::test]
async fn template_is_published_once_copied_later_and_bypassable() {
    let base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::env::set_var(TMPDIR_ENV, base.path());

    std::env::set_var(NO_TEMPLATE_ENV, "1");
    let a = Cluster::start(ClusterOptions::default()).await.unwrap();
    let b = Cluster::start(ClusterOptions::default()).await.unwrap();
    assert!(a.data_dir().starts_with(base.path()));
    assert_ne!(
        system_identifier(&a).await,
        system_identifier(&b).await,
        "two initdb runs"
    );
    assert!(
        templates_in(base.path()).is_empty(),
        "NO_TEMPLATE still published one"
    );
    a.stop().await.unwrap();
    b.stop().await.unwrap();

    std::env::remove_var(NO_TEMPLATE_ENV);
    let first = Cluster::start(ClusterOptions::default()).await.unwrap();
    assert_eq!(
        templates_in(base.path()).len(),
        1,
        "the first start publishes a template"
    );
    let mut conn = PgConnection::connect(&first.admin_url()).await.unwrap();
    sqlx::raw_sql("create table only_in_first (v int)")
        .execute(&mut conn)
        .await
        .unwrap();
    let second = Cluster::start(ClusterOptions::default()).await.unwrap();
    assert_eq!(
        system_identifier(&first).await,
        system_identifier(&second).await,
        "second is a copy"
    );
    let mut conn = PgConnection::connect(&second.admin_url()).await.unwrap();
    let n: i64 =
        sqlx::query_scalar("select count(*) from pg_class where relname = 'only_in_first'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(n, 0, "clusters copied from one template share data");
    let copied_id = system_identifier(&first).await;
    first.stop().await.unwrap();
    second.stop().await.unwrap();
    assert_eq!(templates_in(base.path()).len(), 1);

    // A damaged template (its WAL is gone: no checkpoint to start from) is withdrawn, the
    // cluster is made by initdb instead, and the next start publishes a fresh template.
    let template = base.path().join(&templates_in(base.path())[0]);
    for wal in std::fs::read_dir(template.join("pg_wal"))
        .unwrap()
        .flatten()
    {
        if wal.path().is_file() {
            std::fs::remove_file(wal.path()).unwrap();
        }
    }
    let third = Cluster::start(ClusterOptions::default()).await.unwrap();
    assert_ne!(
        system_identifier(&third).await,
        copied_id,
        "third came from the damaged template"
    );
    third.stop().await.unwrap();
    assert!(
        templates_in(base.path()).is_empty(),
        "damaged template still there"
    );
    let fourth = Cluster::start(ClusterOptions::default()).await.unwrap();
    let fifth = Cluster::start(ClusterOptions::default()).await.unwrap();
    assert_eq!(
        system_identifier(&fourth).await,
        system_identifier(&fifth).await,
        "republished"
    );
    fourth.stop().await.unwrap();
    fifth.stop().await.unwrap();
    std::env::remove_var(TMPDIR_ENV);
}
