//! A private cluster starts, answers, restarts with its data and port, applies its settings,
//! and leaves nothing behind after `stop()` or a plain drop.
//!
//! These tests must never depend on a server already running on this machine.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{alive, children_of, uid_of, wait_until};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};
use throwaway_pg::{Cluster, ClusterOptions};

async fn connect(url: &str) -> PgConnection {
    PgConnection::connect(url).await.expect("connect")
}

/// The postmaster, its children, and the directory.
fn footprint(cluster: &Cluster) -> (Vec<u32>, PathBuf) {
    let pm = cluster.postmaster_pid().expect("running");
    let mut pids = vec![pm];
    pids.extend(children_of(pm));
    (pids, cluster.data_dir().to_path_buf())
}

fn assert_gone(pids: &[u32], dir: &std::path::Path) {
    // Our own children are reaped before stop/drop return, the backends exit with the
    // postmaster: a short deadline only covers the backends' last instructions.
    assert!(
        wait_until(Duration::from_secs(5), || pids.iter().all(|p| !alive(*p))),
        "still alive: {:?}",
        pids.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
    );
    assert!(!dir.exists(), "{} still exists", dir.display());
}

#[tokio::test]
async fn starts_answers_and_stop_removes_process_and_directory() {
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    println!("time to ready: {:?}", cluster.ready_in());
    let mut conn = connect(&cluster.admin_url()).await;
    let one: i32 = sqlx::query_scalar("select 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);
    conn.close().await.unwrap();
    let (pids, dir) = footprint(&cluster);
    assert!(
        pids.len() > 1,
        "a running postmaster has auxiliary processes: {pids:?}"
    );
    assert!(dir.join("PG_VERSION").exists());
    let watchdog = cluster.watchdog_pid().unwrap();

    cluster.stop().await.unwrap();
    assert_gone(&pids, &dir);
    assert!(!alive(watchdog), "the watchdog is dismissed and reaped");
}

#[tokio::test]
async fn plain_drop_removes_process_and_directory() {
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let (pids, dir) = footprint(&cluster);
    drop(cluster);
    assert_gone(&pids, &dir);
}

#[tokio::test]
async fn drop_with_a_session_open_still_removes_everything() {
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let mut conn = connect(&cluster.admin_url()).await;
    sqlx::query("select 1").execute(&mut conn).await.unwrap();
    let (pids, dir) = footprint(&cluster);
    drop(cluster);
    assert_gone(&pids, &dir);
    assert!(sqlx::query("select 1").execute(&mut conn).await.is_err());
}

#[tokio::test]
async fn restart_keeps_committed_data_and_the_port() {
    let mut cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let port = cluster.port();
    let old_pid = cluster.postmaster_pid().unwrap();
    let mut conn = connect(&cluster.admin_url()).await;
    sqlx::raw_sql("create table kept (v int); insert into kept values (42);")
        .execute(&mut conn)
        .await
        .unwrap();

    cluster.restart().await.unwrap();

    assert_eq!(cluster.port(), port);
    let new_pid = cluster.postmaster_pid().unwrap();
    assert_ne!(new_pid, old_pid);
    assert!(!alive(old_pid));
    assert!(
        sqlx::query("select 1").execute(&mut conn).await.is_err(),
        "an immediate restart cuts existing sessions"
    );
    let mut conn = connect(&cluster.admin_url()).await;
    let v: i32 = sqlx::query_scalar("select v from kept")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(v, 42);
    let log = std::fs::read_to_string(cluster.log_path()).unwrap();
    assert!(
        log.contains("immediate shutdown"),
        "restart was not immediate-mode:\n{log}"
    );

    let (pids, dir) = footprint(&cluster);
    cluster.stop().await.unwrap();
    assert_gone(&pids, &dir);
}

#[tokio::test]
async fn settings_reach_the_server_and_extra_overrides() {
    let opts = ClusterOptions {
        max_connections: 37,
        shared_buffers: "16MB".into(),
        synchronous_commit: false,
        extra: vec![
            ("work_mem".into(), "7MB".into()),
            ("full_page_writes".into(), "on".into()),
        ],
    };
    let cluster = Cluster::start(opts).await.unwrap();
    let mut conn = connect(&cluster.admin_url()).await;
    let cases = [
        ("max_connections", "37"),
        ("shared_buffers", "16MB"),
        ("synchronous_commit", "off"),
        ("fsync", "off"),
        ("full_page_writes", "on"),
        ("work_mem", "7MB"),
        ("listen_addresses", "127.0.0.1"),
    ];
    for (name, want) in cases {
        let got: String = sqlx::query_scalar(&format!("show {name}"))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(got, want, "{name}");
    }
    let sockets: String = sqlx::query_scalar("show unix_socket_directories")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(PathBuf::from(sockets), cluster.data_dir());
    cluster.stop().await.unwrap();
}

#[tokio::test]
async fn defaults_keep_synchronous_commit_and_size_the_server() {
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let mut conn = connect(&cluster.admin_url()).await;
    for (name, want) in [
        ("synchronous_commit", "on"),
        ("max_connections", "100"),
        ("shared_buffers", "128MB"),
        ("full_page_writes", "off"),
    ] {
        let got: String = sqlx::query_scalar(&format!("show {name}"))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(got, want, "{name}");
    }
    cluster.stop().await.unwrap();
}

#[tokio::test]
async fn unix_socket_in_the_directory_accepts_connections() {
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let mut conn = PgConnectOptions::new()
        .socket(cluster.data_dir())
        .port(cluster.port())
        .username("postgres")
        .database("postgres")
        .connect()
        .await
        .unwrap();
    let one: i32 = sqlx::query_scalar("select 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);
    cluster.stop().await.unwrap();
}

#[tokio::test]
async fn runs_unprivileged_even_as_root() {
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let pid = cluster.postmaster_pid().unwrap();
    assert_ne!(uid_of(pid), 0, "postgres must not run as root");
    cluster.stop().await.unwrap();
}

#[tokio::test]
async fn url_for_names_the_database() {
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let port = cluster.port();
    assert_eq!(
        cluster.admin_url(),
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    );
    assert_eq!(
        cluster.url_for("ting_ab12"),
        format!("postgres://postgres@127.0.0.1:{port}/ting_ab12")
    );
    cluster.stop().await.unwrap();
}
