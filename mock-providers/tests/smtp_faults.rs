//! Every injected SMTP fault, at every stage, seen from a raw client and in the ledger; stage
//! latency; accept-then-drop; drop mid-DATA; the `before_response` hook holding the 250.

mod smtp_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use mock_providers::config::{Latency, SmtpConfig, SmtpFault, SmtpStage};
use mock_providers::ledger::{Hook, LedgerEntry, Outcome};
use mock_providers::units::{HumanDuration, Ratio};
use smtp_support::*;

fn always(stage: SmtpStage, code: u16) -> SmtpConfig {
    SmtpConfig {
        faults: vec![SmtpFault {
            stage,
            code,
            enhanced: None,
            rate: Ratio(1.0),
        }],
        ..SmtpConfig::default()
    }
}

/// (recipient, attempt, outcome, status, fault) of every send entry.
fn summary(w: &World) -> Vec<(String, u32, Outcome, String, Option<String>)> {
    w.sends()
        .into_iter()
        .map(|e| (e.recipient, e.attempt, e.outcome, e.status, e.fault))
        .collect()
}

#[tokio::test]
async fn each_stage_fault_gives_its_code_and_ledger_entry() {
    use SmtpStage::*;
    // (stage, code, expected reply status, outcome); recipients a and b in one transaction.
    let cases = [
        (Mail, 451, "451 4.3.0", Outcome::Transient),
        (Mail, 452, "452 4.3.1", Outcome::Transient),
        (Mail, 550, "550 5.7.1", Outcome::Permanent),
        (Mail, 553, "553 5.1.7", Outcome::Permanent),
        (Rcpt, 450, "450 4.2.1", Outcome::Transient),
        (Rcpt, 451, "451 4.3.0", Outcome::Transient),
        (Rcpt, 452, "452 4.3.1", Outcome::Transient),
        (Rcpt, 550, "550 5.1.1", Outcome::Permanent),
        (Rcpt, 551, "551 5.1.6", Outcome::Permanent),
        (Rcpt, 552, "552 5.2.2", Outcome::Permanent),
        (Rcpt, 553, "553 5.1.3", Outcome::Permanent),
        (Data, 554, "554 5.7.1", Outcome::Permanent),
        (DataEnd, 451, "451 4.3.0", Outcome::Transient),
        (DataEnd, 452, "452 4.3.1", Outcome::Transient),
        (DataEnd, 552, "552 5.3.4", Outcome::Permanent),
        (DataEnd, 554, "554 5.7.1", Outcome::Permanent),
    ];
    for (stage, code, status, outcome) in cases {
        let w = spawn(3, always(stage, code)).await;
        let mut c = w.client().await;
        let msg = simple_message("f@x.test", "s", "b");
        let replies = c
            .transaction("shop@x.test", &["a@x.test", "b@x.test"], &msg)
            .await;
        let label = format!("{} {code}", stage.as_str());
        let what = format!("{label}: {replies:?}");
        // The reply at the faulted stage, and no acceptance anywhere.
        let at = match stage {
            Mail => 1,
            Rcpt => 2,
            Data => 4,
            _ => 5,
        };
        assert!(replies[at].starts_with(status), "{what}");
        assert!(
            !replies.iter().any(|r| r.starts_with("250 2.0.0")),
            "{what}"
        );
        let got = summary(&w);
        let want: Vec<_> = match stage {
            Mail => vec![(
                "".to_string(),
                1,
                outcome,
                status.to_string(),
                Some(label.clone()),
            )],
            _ => ["a@x.test", "b@x.test"]
                .iter()
                .map(|r| {
                    (
                        r.to_string(),
                        1,
                        outcome,
                        status.to_string(),
                        Some(label.clone()),
                    )
                })
                .collect(),
        };
        assert_eq!(got, want, "{what}");
        assert!(w.commits.lock().unwrap().is_empty(), "{what}");
        // Every rejection says why, with the reply line.
        assert!(w
            .sends()
            .iter()
            .all(|e| e.error.as_deref().unwrap_or("").starts_with(status)));
    }
}

/// In a multi-recipient transaction each RCPT gets its own seeded decision (the one a lone RCPT
/// to that recipient would get), not one shared with its co-recipients.
#[tokio::test]
async fn each_rcpt_of_a_transaction_gets_its_own_planned_fault() {
    use mock_providers::smtp::plan::plan_recipient;
    let seed = 9;
    let cfg = SmtpConfig {
        faults: vec![
            SmtpFault {
                stage: SmtpStage::Rcpt,
                code: 451,
                enhanced: None,
                rate: Ratio(0.3),
            },
            SmtpFault {
                stage: SmtpStage::Rcpt,
                code: 552,
                enhanced: None,
                rate: Ratio(0.2),
            },
        ],
        bad_addresses: Ratio(0.15),
        ..SmtpConfig::default()
    };
    let rcpts: Vec<String> = (0..12).map(|i| format!("m{i}@x.test")).collect();
    let w = spawn(seed, cfg.clone()).await;
    let mut c = w.client().await;
    c.cmd("EHLO c").await;
    c.cmd("MAIL FROM:<shop@x.test>").await;
    let mut kinds = std::collections::BTreeSet::new();
    for r in &rcpts {
        let got = c.cmd(&format!("RCPT TO:<{r}>")).await;
        let want = match plan_recipient(seed, &cfg, r, 1) {
            Ok(_) => "250 2.1.5".to_string(),
            Err(f) => f.reply.status(),
        };
        assert!(got.starts_with(&want), "{r}: got {got:?}, planned {want}");
        kinds.insert(want);
    }
    assert!(kinds.len() >= 3, "a mix of decisions: {kinds:?}");
}

#[tokio::test]
async fn greeting_faults() {
    let w = spawn(3, always(SmtpStage::Greeting, 421)).await;
    let mut c = w.client().await;
    assert_eq!(
        c.greeting,
        "421 4.3.2 service not available, closing transmission channel (injected)\r\n"
    );
    assert_eq!(c.until_closed().await, "");
    assert_eq!(
        summary(&w),
        [(
            "".into(),
            1,
            Outcome::Transient,
            "421 4.3.2".into(),
            Some("greeting 421".into())
        )]
    );

    let w = spawn(3, always(SmtpStage::Greeting, 554)).await;
    let mut c = w.client().await;
    assert!(c.greeting.starts_with("554 5.7.1"), "{}", c.greeting);
    assert!(c.cmd("EHLO c").await.starts_with("503 5.5.1"));
    assert!(c.cmd("QUIT").await.starts_with("221"));
    assert_eq!(
        summary(&w),
        [(
            "".into(),
            1,
            Outcome::Permanent,
            "554 5.7.1".into(),
            Some("greeting 554".into())
        )]
    );
}

#[tokio::test]
async fn bad_address_is_550_511_permanent() {
    let cfg = SmtpConfig {
        bad_addresses: Ratio(1.0),
        ..SmtpConfig::default()
    };
    let w = spawn(3, cfg).await;
    let mut c = w.client().await;
    let r = c.transaction("shop@x.test", &["a@x.test"], "").await;
    assert!(r[2].starts_with("550 5.1.1"), "{r:?}");
    assert!(r[3].starts_with("554 5.5.1"), "no valid recipients: {r:?}");
    assert_eq!(
        summary(&w),
        [(
            "a@x.test".into(),
            1,
            Outcome::Permanent,
            "550 5.1.1".into(),
            Some("bad_address".into())
        )]
    );
}

#[tokio::test]
async fn accept_then_drop_commits_but_the_client_sees_eof() {
    let cfg = SmtpConfig {
        accept_then_drop_rate: Ratio(1.0),
        ..SmtpConfig::default()
    };
    let w = spawn(3, cfg).await;
    let mut c = w.client().await;
    let r = c
        .transaction(
            "shop@x.test",
            &["a@x.test"],
            &simple_message("atd@x.test", "s", "hello"),
        )
        .await;
    assert_eq!(r.last().unwrap(), "<closed>", "{r:?}");
    assert_eq!(c.until_closed().await, "");
    let sends = w.sends();
    assert_eq!(sends.len(), 1);
    let e = &sends[0];
    assert_eq!(
        (e.outcome, e.status.as_str(), e.fault.as_deref()),
        (Outcome::Accepted, "dropped", Some("accept_then_drop"))
    );
    assert_eq!(
        (e.message_id.as_deref(), e.body.as_deref()),
        (Some("atd@x.test"), Some("hello\n"))
    );
    w.wait_ledger("on_commit", |_| w.commits.lock().unwrap().len() == 1)
        .await;
}

#[tokio::test]
async fn drop_mid_data_commits_nothing() {
    let cfg = SmtpConfig {
        drop_mid_data_rate: Ratio(1.0),
        ..SmtpConfig::default()
    };
    let w = spawn(3, cfg).await;
    let mut c = w.client().await;
    c.cmd("EHLO c").await;
    c.cmd("MAIL FROM:<shop@x.test>").await;
    c.cmd("RCPT TO:<a@x.test>").await;
    assert!(c.cmd("DATA").await.starts_with("354"));
    c.send("Subject: first line\r\n").await;
    c.until_closed().await;
    assert_eq!(
        summary(&w),
        [(
            "a@x.test".into(),
            1,
            Outcome::Transient,
            "dropped".into(),
            Some("drop_mid_data".into())
        )]
    );
    assert!(w.commits.lock().unwrap().is_empty());
}

#[tokio::test]
async fn stage_latency_delays_the_reply() {
    let fixed = |ms| Latency::Fixed {
        value: HumanDuration::from_millis(ms),
    };
    let cfg = SmtpConfig {
        stage_latency: BTreeMap::from([(SmtpStage::Rcpt, fixed(150))]),
        latency: fixed(200),
        ..SmtpConfig::default()
    };
    let w = spawn(3, cfg).await;
    let mut c = w.client().await;
    c.cmd("EHLO c").await;
    c.cmd("MAIL FROM:<shop@x.test>").await;
    let t = Instant::now();
    c.cmd("RCPT TO:<a@x.test>").await;
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "rcpt {:?}",
        t.elapsed()
    );
    c.cmd("DATA").await;
    let t = Instant::now();
    c.send(stuff(&simple_message("l@x.test", "s", "b"))).await;
    assert!(c.reply().await.starts_with("250"));
    let e = w.sends().pop().unwrap();
    // Recorded after the commit latency, just before the reply; arrival stamped at the dot.
    assert!(e.mono_ns - e.received_ns >= 200_000_000, "{e:?}");
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "commit {:?}",
        t.elapsed()
    );
}

/// Greeting, MAIL and DATA latency, each with its own value: every reply comes no earlier than
/// its stage's latency (measured from the command, or from connect for the greeting).
#[tokio::test]
async fn greeting_mail_and_data_latency_delay_their_replies() {
    let fixed = |ms| Latency::Fixed {
        value: HumanDuration::from_millis(ms),
    };
    let (greeting, mail, data) = (120, 140, 160);
    let cfg = SmtpConfig {
        stage_latency: BTreeMap::from([
            (SmtpStage::Greeting, fixed(greeting)),
            (SmtpStage::Mail, fixed(mail)),
            (SmtpStage::Data, fixed(data)),
        ]),
        ..SmtpConfig::default()
    };
    let w = spawn(3, cfg).await;
    let ms = |t: Instant| t.elapsed().as_millis() as u64;
    let t = Instant::now();
    let mut c = tokio::time::timeout(DEADLINE, w.client()).await.unwrap();
    assert!(c.greeting.starts_with("220"), "{}", c.greeting);
    let took = ms(t);
    assert!(took >= greeting, "greeting after {took} ms");
    c.cmd("EHLO c").await;
    let t = Instant::now();
    assert!(c.cmd("MAIL FROM:<shop@x.test>").await.starts_with("250"));
    let took = ms(t);
    assert!(took >= mail, "MAIL reply after {took} ms");
    c.cmd("RCPT TO:<a@x.test>").await;
    let t = Instant::now();
    assert!(c.cmd("DATA").await.starts_with("354"));
    let took = ms(t);
    assert!(took >= data, "DATA reply after {took} ms");
    c.send(stuff(&simple_message("lat@x.test", "s", "b"))).await;
    assert!(c.reply().await.starts_with("250 2.0.0"));
}

/// Holds every `before_response` until released, reporting each entry it holds.
struct Gate {
    entered: tokio::sync::mpsc::UnboundedSender<LedgerEntry>,
    release: tokio::sync::Semaphore,
}

impl Hook for Gate {
    fn before_response<'a>(&'a self, entry: &'a LedgerEntry) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let _ = self.entered.send(entry.clone());
            self.release.acquire().await.unwrap().forget();
        })
    }
}

#[tokio::test]
async fn before_response_hook_holds_the_250() {
    let w = spawn(3, SmtpConfig::default()).await;
    let (tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
    let gate = Arc::new(Gate {
        entered: tx,
        release: tokio::sync::Semaphore::new(0),
    });
    w.ledger.add_hook(gate.clone());
    let mut c = w.client().await;
    c.cmd("EHLO c").await;
    c.cmd("MAIL FROM:<shop@x.test>").await;
    c.cmd("RCPT TO:<a@x.test>").await;
    c.cmd("DATA").await;
    c.send(stuff(&simple_message("h@x.test", "s", "b"))).await;
    let held = tokio::time::timeout(DEADLINE, entered.recv())
        .await
        .unwrap()
        .unwrap();
    // Committed before the hook runs, and no reply while it holds.
    assert_eq!(
        (held.outcome, held.recipient.as_str()),
        (Outcome::Accepted, "a@x.test")
    );
    assert_eq!(w.sends().len(), 1);
    let early = tokio::time::timeout(Duration::from_millis(200), c.reply()).await;
    assert!(
        early.is_err(),
        "reply written while the hook held it: {early:?}"
    );
    assert!(
        w.commits.lock().unwrap().is_empty(),
        "on_commit ran before the reply"
    );
    gate.release.add_permits(1);
    assert!(c.reply().await.starts_with("250 2.0.0"));
    w.wait_ledger("on_commit", |_| w.commits.lock().unwrap().len() == 1)
        .await;
}
