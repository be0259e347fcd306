//! `ting-chaos mocks` through the real binary: fixed ports from the config file and from a flag,
//! the printed addresses, one LINE push and one SMTP exchange against them, the ledger over the
//! control API, then SIGTERM: a clean exit, no process left behind, every port released.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const DEADLINE: Duration = Duration::from_secs(30);

/// Four ports free right now (bound on port 0, then released).
fn free_ports() -> Vec<u16> {
    let held: Vec<TcpListener> = (0..4)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// The address after `prefix` on the printed line that starts with `label`.
fn addr_of(lines: &[String], label: &str, prefix: &str) -> SocketAddr {
    let line = lines
        .iter()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label} line in {lines:?}"));
    let at = line.find(prefix).unwrap() + prefix.len();
    let rest = &line[at..];
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '/')
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// Reads one whole SMTP reply (continuation lines included).
async fn reply(r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> String {
    let mut out = String::new();
    loop {
        let mut line = String::new();
        let n = tokio::time::timeout(DEADLINE, r.read_line(&mut line))
            .await
            .expect("smtp reply in time")
            .unwrap();
        assert!(n > 0, "connection closed after {out:?}");
        out.push_str(&line);
        if line.as_bytes().get(3) != Some(&b'-') {
            return out;
        }
    }
}

/// Live children of `pid`, from /proc.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let after = s[s.rfind(')')? + 2..].to_string();
                    after.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// Starts `ting-chaos mocks ARGS` and returns it with the lines it printed up to `seed …`.
async fn start(args: &[&str]) -> (tokio::process::Child, Vec<String>) {
    let mut child = tokio::process::Command::new(bin())
        .arg("mocks")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.starts_with("seed ")) {
        let line = tokio::time::timeout(DEADLINE, out.next_line())
            .await
            .expect("addresses printed in time")
            .unwrap()
            .expect("ting-chaos mocks exited before printing its addresses");
        lines.push(line);
    }
    (child, lines)
}

/// SIGTERM, then the exit status (within the deadline).
async fn terminate(child: &mut tokio::process::Child) -> std::process::ExitStatus {
    let pid = child.id().expect("still running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    tokio::time::timeout(DEADLINE, child.wait())
        .await
        .expect("ting-chaos mocks did not stop after SIGTERM")
        .unwrap()
}

#[tokio::test]
async fn mocks_serves_fixed_ports_and_stops_cleanly_on_sigterm() {
    let ports = free_ports();
    let (line_port, sms_port, smtp_port, control_port) = (ports[0], ports[1], ports[2], ports[3]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mocks.toml");
    std::fs::write(
        &config,
        format!(
            "[ports]\nline = {line_port}\nsms = {sms_port}\nsmtp = {smtp_port}\n\n\
             [line]\nchannel_token = \"dev-token\"\n"
        ),
    )
    .unwrap();
    let control_port_s = control_port.to_string();
    let config_s = config.to_string_lossy().into_owned();
    let (mut child, lines) = start(&[
        "--config",
        &config_s,
        "--control-port",
        &control_port_s,
        "--seed",
        "7",
    ])
    .await;
    let pid = child.id().unwrap();
    assert!(lines.iter().any(|l| l.starts_with("seed 7")), "{lines:?}");
    // The banner says what clients must present: the token from the file, the default SMS account.
    let banner = lines.join("\n");
    for want in [
        "Bearer dev-token",
        "AC00000000000000000000000000000000",
        "ting-sms-auth-token",
    ] {
        assert!(banner.contains(want), "{want} not in the banner:\n{banner}");
    }
    let line = addr_of(&lines, "LINE", "http://");
    let sms = addr_of(&lines, "SMS", "http://");
    let smtp = addr_of(&lines, "SMTP", "smtp://");
    let control = addr_of(&lines, "SMTP", "control: http://");
    assert_eq!(
        [line.port(), sms.port(), smtp.port(), control.port()],
        [line_port, sms_port, smtp_port, control_port]
    );
    assert!(line.ip().is_loopback() && smtp.ip().is_loopback());

    // One LINE push, with the token from the config file.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let r = http
        .post(format!("http://{line}/v2/bot/message/push"))
        .header("authorization", "Bearer dev-token")
        .header("content-type", "application/json")
        .body(r#"{"to":"U0123456789abcdef0123456789abcdef","messages":[{"type":"text","text":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers().contains_key("x-line-request-id"));

    // One SMTP exchange.
    let stream = TcpStream::connect(smtp).await.unwrap();
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    assert!(reply(&mut rd).await.starts_with("220"));
    let steps = [
        ("EHLO dev.test\r\n", "250"),
        ("MAIL FROM:<app@dev.test>\r\n", "250"),
        ("RCPT TO:<ana@dev.test>\r\n", "250"),
        ("DATA\r\n", "354"),
        (
            "From: app@dev.test\r\nTo: ana@dev.test\r\nSubject: hi\r\nMessage-ID: <cli@dev.test>\r\n\r\nhello\r\n.\r\n",
            "250",
        ),
        ("QUIT\r\n", "221"),
    ];
    for (send, want) in steps {
        wr.write_all(send.as_bytes()).await.unwrap();
        let got = reply(&mut rd).await;
        assert!(got.starts_with(want), "{send:?}: {got}");
    }

    // Both are in the ledger, read over the SMTP control port.
    let ledger = http
        .get(format!("http://{control}/_mock/ledger"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let entries: Vec<serde_json::Value> = ledger
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let got: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| {
            (
                e["provider"].as_str().unwrap(),
                e["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, [("line", "accepted"), ("smtp", "accepted")]);
    assert_eq!(entries[1]["email"]["mail_from"], "app@dev.test");

    // SIGTERM: a clean exit, nothing left running, every port free again.
    assert!(children(pid).is_empty(), "mocks started child processes");
    let status = terminate(&mut child).await;
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "process still there"
    );
    for port in ports {
        TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("port {port} still held after exit: {e}"));
    }
}

/// With a scenario as `--config`, the scenario's seed applies unless `--seed` is given, 0
/// included.
#[tokio::test]
async fn seed_flag_overrides_the_scenario_seed_even_with_0() {
    let scenario = repo().join("scenarios/callbacks-chaos.toml");
    let text = std::fs::read_to_string(&scenario).unwrap();
    let own: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("seed = "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(own, 0);
    let path = scenario.to_string_lossy().into_owned();
    let own_line = format!("seed {own};");
    let cases: [(&[&str], &str); 2] = [(&[], &own_line), (&["--seed", "0"], "seed 0;")];
    for (extra, want) in cases {
        let mut args = vec!["--config", path.as_str()];
        args.extend_from_slice(extra);
        let (mut child, lines) = start(&args).await;
        assert!(
            lines.iter().any(|l| l.starts_with(want)),
            "{extra:?}: {lines:?}"
        );
        assert_eq!(terminate(&mut child).await.code(), Some(0));
    }
}

/// A port already taken is an infrastructure error (exit 3) that names the listener.
#[test]
fn a_taken_port_is_reported() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = std::process::Command::new(bin())
        .args(["mocks", "--smtp-port", &port])
        .output()
        .unwrap();
    assert_eq!(code(&out), 3, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SMTP") && err.contains(&port), "{err}");
}

/// Two fakes given one port is a usage error (exit 2) naming both settings, before anything binds.
#[test]
fn one_port_for_two_fakes_is_a_usage_error() {
    let out = std::process::Command::new(bin())
        .args(["mocks", "--line-port", "47001", "--sms-port", "47001"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--line-port") && err.contains("--sms-port") && err.contains("47001"),
        "{err}"
    );
}

/// A providers-only config obeys the rules a scenario's `[providers]` do, placed at the key:
/// exit 2 before anything is served.
#[test]
fn a_providers_config_that_cannot_work_is_refused_at_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[line]\ntransient = [{ status = 200, rate = \"10%\" }]\n", "mocks.toml:2:", "status"),
        ("[sms]\nrate_limit = -5.0\n", "mocks.toml:2:1", "rate_limit"),
        ("[smtp]\nmax_size = 0\n", "mocks.toml:2:1", "max_size"),
        ("[sms.callbacks]\nenabled = true\ndelay_max = \"300000000000y\"\n", "mocks.toml:3:", "too long"),
        // An internally tagged table is placed at its header.
        ("[line.latency]\nkind = \"fixed\"\nvalue = \"100000000000000000000.5s\"\n", "mocks.toml:1:1", "too long"),
        ("[smtp]\nfaults = [{ stage = \"rcpt\", code = 451, enhanced = \"4.3.0\\r\\n250 ok\", rate = 0.1 }]\n", "mocks.toml:2:", "enhanced"),
    ];
    for (toml, at, says) in cases {
        let config = dir.path().join("mocks.toml");
        std::fs::write(&config, toml).unwrap();
        let out = std::process::Command::new(bin())
            .args(["mocks", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{toml}: {err}");
        assert!(err.contains(at) && err.contains(says), "{toml}: {err}");
        assert!(!err.contains("panicked"), "{toml}: {err}");
    }
}
