//! `Database::provision` on a private cluster and on a given server, and `test_database`:
//! a fresh database each time, dropped (or kept) as asked, and nothing left behind.
//!
//! The given-server path runs against a private cluster standing in for "a server", so it is
//! tested on every machine; `DATABASE_URL`, when set, is exercised as well.

mod common;

use std::time::Duration;

use common::{alive, wait_until};
use sqlx::{Connection, PgConnection};
use throwaway_pg::{shared_cluster, test_database, Cluster, ClusterOptions, Database};

async fn current_database(url: &str) -> String {
    let mut conn = PgConnection::connect(url).await.unwrap();
    let name: String = sqlx::query_scalar("select current_database()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    name
}

async fn exists(admin_url: &str, db: &str) -> bool {
    let mut conn = PgConnection::connect(admin_url).await.unwrap();
    let n: i64 = sqlx::query_scalar("select count(*) from pg_database where datname = $1")
        .bind(db)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    n == 1
}

#[tokio::test]
async fn private_cluster_database_is_fresh_and_close_removes_the_cluster() {
    let db = Database::provision(None, ClusterOptions::default(), false)
        .await
        .unwrap();
    assert!(db.name().starts_with("ting_"));
    assert_eq!(current_database(db.url()).await, db.name());
    let cluster = db.cluster().unwrap();
    assert_eq!(db.admin_url(), cluster.admin_url());
    let (pid, dir) = (
        cluster.postmaster_pid().unwrap(),
        cluster.data_dir().to_path_buf(),
    );

    db.close().await.unwrap();
    assert!(wait_until(Duration::from_secs(5), || !alive(pid)));
    assert!(!dir.exists());
}

#[tokio::test]
async fn private_cluster_kept_on_close_leaves_its_data_and_stops_the_server() {
    let mut db = Database::provision(None, ClusterOptions::default(), true)
        .await
        .unwrap();
    let mut conn = PgConnection::connect(db.url()).await.unwrap();
    sqlx::raw_sql("create table t (v int); insert into t values (7);")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    db.cluster_mut().unwrap().restart().await.unwrap();
    let cluster = db.cluster().unwrap();
    let (pid, dir) = (
        cluster.postmaster_pid().unwrap(),
        cluster.data_dir().to_path_buf(),
    );

    db.close().await.unwrap();
    assert!(!alive(pid), "a kept cluster is still stopped");
    assert!(dir.join("PG_VERSION").exists(), "kept directory is gone");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn given_server_gets_a_fresh_database_dropped_on_close_or_drop_unless_kept() {
    let server = Cluster::start(ClusterOptions::default()).await.unwrap();
    let admin = server.admin_url();

    let closed = Database::provision(Some(&admin), ClusterOptions::default(), false)
        .await
        .unwrap();
    assert!(closed.cluster().is_none());
    assert_eq!(closed.admin_url(), admin);
    assert_eq!(current_database(closed.url()).await, closed.name());
    let name = closed.name().to_string();
    // A session still open must not prevent the drop.
    let _open = PgConnection::connect(closed.url()).await.unwrap();
    closed.close().await.unwrap();
    assert!(!exists(&admin, &name).await, "close did not drop {name}");

    let dropped = Database::provision(Some(&admin), ClusterOptions::default(), false)
        .await
        .unwrap();
    let name = dropped.name().to_string();
    assert!(exists(&admin, &name).await);
    drop(dropped);
    assert!(!exists(&admin, &name).await, "drop did not drop {name}");

    let kept = Database::provision(Some(&admin), ClusterOptions::default(), true)
        .await
        .unwrap();
    let name = kept.name().to_string();
    kept.close().await.unwrap();
    assert!(exists(&admin, &name).await, "keep dropped {name}");

    server.stop().await.unwrap();
}

#[tokio::test]
async fn database_url_server_if_set() {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        println!("skipped: DATABASE_URL is not set (the given-server path is still tested on a private cluster)");
        return;
    };
    let db = Database::provision(Some(&url), ClusterOptions::default(), false)
        .await
        .unwrap();
    let name = db.name().to_string();
    assert_eq!(current_database(db.url()).await, name);
    db.close().await.unwrap();
    assert!(!exists(&url, &name).await);
}

#[tokio::test]
async fn bad_server_urls_are_refused_before_connecting() {
    for bad in ["mysql://localhost/x", "not a url"] {
        let err = Database::provision(Some(bad), ClusterOptions::default(), false)
            .await
            .unwrap_err();
        assert!(
            matches!(err, throwaway_pg::Error::BadUrl { .. }),
            "{bad}: {err}"
        );
    }
}

#[tokio::test]
async fn test_database_hands_out_distinct_databases_and_drops_them() {
    let a = test_database().await.unwrap();
    let b = test_database().await.unwrap();
    assert_ne!(a.name(), b.name());
    assert_eq!(current_database(&a.url).await, a.name());
    assert_eq!(current_database(&b.url).await, b.name());
    let admin = a.admin_url().to_string();
    let (name_a, name_b) = (a.name().to_string(), b.name().to_string());

    drop(a);
    assert!(!exists(&admin, &name_a).await, "drop did not drop {name_a}");
    b.close().await.unwrap();
    assert!(
        !exists(&admin, &name_b).await,
        "close did not drop {name_b}"
    );
}

#[tokio::test]
async fn without_database_url_one_cluster_serves_the_whole_process() {
    if std::env::var_os("DATABASE_URL").is_some() {
        println!("skipped: DATABASE_URL is set, so no shared private cluster is started");
        return;
    }
    let db = test_database().await.unwrap();
    let first = shared_cluster().await.unwrap();
    assert!(
        db.url.contains(&format!(":{}/", first.port())),
        "{}",
        db.url
    );
    let again = shared_cluster().await.unwrap();
    assert!(std::ptr::eq(first, again));
}
