//! A client flooding the fake SMTP server with bad commands cannot grow its ledger without
//! bound: protocol errors about no recipient are kept up to `PROTOCOL_ERRORS_KEPT` per kind and
//! counted beyond (issue 13: `ting-chaos mocks` grew to 707 MB under such a stream).

mod smtp_support;

use mock_providers::config::SmtpConfig;
use mock_providers::ledger::{Outcome, PROTOCOL_ERRORS_KEPT};
use mock_providers::smtp::Limits;
use smtp_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn two_hundred_thousand_bad_commands_keep_the_ledger_bounded_and_counted() {
    const BAD: u64 = 200_000;
    let mut limits = Limits::default();
    limits.session.max_errors = u32::MAX;
    let w = spawn_with(1, SmtpConfig::default(), limits).await;
    let stream = tokio::net::TcpStream::connect(w.addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        let chunk = "BOGUS\r\n".repeat(10_000);
        for _ in 0..BAD / 10_000 {
            wr.write_all(chunk.as_bytes()).await.unwrap();
        }
        wr
    });
    // The greeting, then one reply per bad command.
    let (mut lines, mut buf) = (0u64, vec![0u8; 64 * 1024]);
    while lines < BAD + 1 {
        let n = rd.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed after {lines} replies");
        lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
    }
    drop(writer.await.unwrap());
    let errors = w.ledger.protocol_errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        (errors[0].seen, errors[0].kept),
        (BAD, PROTOCOL_ERRORS_KEPT)
    );
    let kept = w
        .ledger
        .snapshot()
        .iter()
        .filter(|e| e.outcome == Outcome::ProtocolError)
        .count() as u64;
    assert_eq!(kept, PROTOCOL_ERRORS_KEPT);
    assert!(w.ledger.len() as u64 <= PROTOCOL_ERRORS_KEPT + 1);
}
