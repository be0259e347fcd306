//! Connect-time sender attribution: a child process that opens a connection to a fake provider,
//! sends one request and closes at once, a hundred times in a row, gets every one of its sends
//! attributed to its pid. The sends are looked up the way the run's ledger hook does it: the
//! connection's sender resolved in `on_connect`, each entry attributed from that table in
//! `on_entry`, with no `/proc` read after the connection is gone.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use mock_providers::config::ProvidersConfig;
use mock_providers::ledger::{EntryKind, Hook, Ledger, LedgerEntry, Outcome, Provider};
use ting_chaos_harness::attribution::Attributor;
use tokio::io::AsyncWriteExt;

/// Connections per test.
const N: usize = 100;

/// How long each connection waits for the attribution hook before it is served anyway.
const CONNECT_HOOK_BUDGET: Duration = Duration::from_secs(5);

/// What the run's ledger hook does for attribution, and nothing else.
struct Attribute {
    attributor: Attributor,
    /// ledger seq → sender, as `on_entry` found it when the send was recorded.
    senders: Mutex<HashMap<u64, Option<u32>>>,
}

impl Hook for Attribute {
    fn on_connect<'a>(&'a self, peer: SocketAddr) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.attributor.connected(peer).await;
        })
    }

    fn on_entry(&self, e: &LedgerEntry) {
        if e.kind == EntryKind::Send {
            let pid = e.peer.and_then(|p| self.attributor.sender(p));
            self.senders.lock().unwrap().insert(e.seq, pid);
        }
    }
}

/// Starts the fakes with the attribution hook, runs `script` in bash (as a candidate process,
/// `$PORT` set to `port(&providers)`), and returns the ledger, the hook and the child's pid.
/// Without `netlink` the attributor is told no server address, so it reads `/proc/net/tcp*`.
async fn run_child(
    script: &str,
    port: impl Fn(&mock_providers::Providers) -> u16,
    netlink: bool,
) -> (Vec<LedgerEntry>, Arc<Attribute>, u32) {
    // Every connection's lookup (a `/proc/net/tcp` scan without netlink, on the blocking pool)
    // must finish inside the connect-hook budget or its send goes unattributed: give it seconds,
    // not the default 250 ms, so a descheduled test process does not look like a lost sender.
    let ledger = Ledger::new().with_connect_hook_timeout(CONNECT_HOOK_BUDGET);
    let providers = mock_providers::start(
        5,
        ProvidersConfig::default(),
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        ledger.clone(),
    )
    .await
    .expect("fakes start");
    let attributor = Attributor::new();
    if netlink {
        for addr in providers.server_addrs() {
            attributor.add_server(addr);
        }
    }
    let hook = Arc::new(Attribute {
        attributor: attributor.clone(),
        senders: Mutex::default(),
    });
    ledger.add_hook(hook.clone());
    // The child waits for a line on stdin, so it is a candidate before its first connection.
    let mut child = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(format!("set -eu\nread -r go\n{script}"))
        .env("PORT", port(&providers).to_string())
        .env("N", N.to_string())
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn bash");
    let pid = child.id().expect("child pid");
    attributor.add_candidate(pid);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the child finishes within 120 s")
        .unwrap();
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    providers.shutdown().await;
    (ledger.snapshot(), hook, pid)
}

fn assert_all_attributed(entries: &[LedgerEntry], hook: &Attribute, pid: u32, provider: Provider) {
    let sends: Vec<&LedgerEntry> = entries
        .iter()
        .filter(|e| e.kind == EntryKind::Send)
        .collect();
    assert_eq!(sends.len(), N, "one send per connection");
    let senders = hook.senders.lock().unwrap();
    let mut unattributed = Vec::new();
    for e in &sends {
        assert_eq!(e.provider, provider);
        assert_eq!(e.outcome, Outcome::Accepted, "{e:?}");
        if senders.get(&e.seq).copied().flatten() != Some(pid) {
            unattributed.push((e.seq, e.peer, senders.get(&e.seq).copied().flatten()));
        }
    }
    assert!(
        unattributed.is_empty(),
        "{} of {N} sends not attributed to pid {pid} (seq, peer, found): {unattributed:?}",
        unattributed.len()
    );
}

/// One LINE push per connection; the child reads the status line and closes at once.
const HTTP_CHILD: &str = r#"
for i in $(seq 1 "$N"); do
  body=$(printf '{"to":"U%032x","messages":[{"type":"text","text":"hi %d"}]}' "$i" "$i")
  exec 3<>"/dev/tcp/127.0.0.1/$PORT"
  printf 'POST /v2/bot/message/push HTTP/1.1\r\nHost: fake\r\nAuthorization: Bearer ting-line-token\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' "${#body}" "$body" >&3
  read -r status <&3
  exec 3<&-
  case "$status" in "HTTP/1.1 200"*) ;; *) echo "push $i: $status" >&2; exit 1;; esac
done
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_one_request_per_connection_all_attributed() {
    let (entries, hook, pid) = run_child(HTTP_CHILD, |p| p.line_addr.port(), true).await;
    assert_all_attributed(&entries, &hook, pid, Provider::Line);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_netlink_proc_net_tcp_still_attributes_every_send() {
    let (entries, hook, pid) = run_child(HTTP_CHILD, |p| p.line_addr.port(), false).await;
    assert_all_attributed(&entries, &hook, pid, Provider::Line);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smtp_one_message_per_connection_all_attributed() {
    // One message per connection, QUIT, close.
    let script = r#"
expect() {
  read -r line <&3
  case "$line" in "$1"*) ;; *) echo "message $i: expected $1, got $line" >&2; exit 1;; esac
}
for i in $(seq 1 "$N"); do
  exec 3<>"/dev/tcp/127.0.0.1/$PORT"
  expect 220
  printf 'HELO child.test\r\n' >&3; expect 250
  printf 'MAIL FROM:<sender@example.com>\r\n' >&3; expect 250
  printf 'RCPT TO:<user%d@example.com>\r\n' "$i" >&3; expect 250
  printf 'DATA\r\n' >&3; expect 354
  printf 'Message-ID: <m%d@child.test>\r\nSubject: hi\r\n\r\nhello %d\r\n.\r\n' "$i" "$i" >&3; expect 250
  printf 'QUIT\r\n' >&3; expect 221
  exec 3<&-
done
"#;
    let (entries, hook, pid) = run_child(script, |p| p.smtp_addr.port(), true).await;
    assert_all_attributed(&entries, &hook, pid, Provider::Smtp);
}
