//! Aiming a signal at a worker while it has a send in flight.
//!
//! A kill that lands while the worker sits between sends (in its database, asleep in a backoff)
//! leaves nothing mid-request, and the `recovery` rules then judge nothing. So a step that
//! signals one chosen worker first waits, up to [`AIM_WITHIN`], for that worker's next send
//! request to arrive at a fake ([`Aims::arrived`], from the ledger's `on_request` hook). The fake
//! holds that request — before deciding, waiting its latency or answering — until the signal has
//! been sent and its [`Held`] is dropped, so the request is in flight when the signal lands. A
//! worker that sends nothing in that time is signalled anyway, and the step says so.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use mock_providers::ledger::Provider;
use tokio::sync::oneshot;

/// How long a step waits for its target's next send before signalling anyway.
pub const AIM_WITHIN: Duration = Duration::from_secs(2);

/// The longest a fake holds a request for a step that has not let it go (a bound, so a bug in
/// the harness can never wedge a fake).
const HOLD_AT_MOST: Duration = Duration::from_secs(5);

/// Workers a step is waiting to catch mid-send, by pid.
#[derive(Default)]
pub struct Aims {
    waiting: Mutex<HashMap<u32, oneshot::Sender<Held>>>,
}

/// A request held at the fake until this is dropped.
pub struct Held {
    /// Which provider the held request went to.
    pub provider: Provider,
    _release: oneshot::Sender<()>,
}

impl Aims {
    /// Waits up to `within` ([`AIM_WITHIN`]) for `pid`'s next send request and returns it held,
    /// or `None` when `pid` sent nothing in time.
    pub async fn catch(&self, pid: u32, within: Duration) -> Option<Held> {
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap().insert(pid, tx);
        let held = tokio::time::timeout(within, rx).await;
        self.waiting.lock().unwrap().remove(&pid);
        held.ok().and_then(Result::ok)
    }

    /// A send request from `sender` (when known) has arrived at `provider`'s fake: if a step is
    /// waiting for it, hands it over and holds the request until the step lets it go.
    pub async fn arrived(&self, provider: Provider, sender: impl FnOnce() -> Option<u32>) {
        let tx = {
            let mut waiting = self.waiting.lock().unwrap();
            if waiting.is_empty() {
                return;
            }
            match sender() {
                Some(pid) => waiting.remove(&pid),
                None => None,
            }
        };
        let Some(tx) = tx else { return };
        let (release, released) = oneshot::channel();
        let held = Held {
            provider,
            _release: release,
        };
        if tx.send(held).is_ok() {
            let _ = tokio::time::timeout(HOLD_AT_MOST, released).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[tokio::test]
    async fn a_request_from_the_target_is_held_until_the_step_lets_go() {
        let aims = Arc::new(Aims::default());
        let catcher = aims.clone();
        let step = tokio::spawn(async move { catcher.catch(7, AIM_WITHIN).await });
        // Wait (with a deadline) until the step is registered.
        let deadline = Instant::now() + Duration::from_secs(5);
        while aims.waiting.lock().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "the step never registered");
            tokio::task::yield_now().await;
        }
        // Another worker's request passes at once.
        aims.arrived(Provider::Line, || Some(8)).await;
        let fake = {
            let aims = aims.clone();
            tokio::spawn(async move { aims.arrived(Provider::Sms, || Some(7)).await })
        };
        let held = step.await.unwrap().expect("caught pid 7's request");
        assert_eq!(held.provider, Provider::Sms);
        tokio::task::yield_now().await;
        assert!(
            !fake.is_finished(),
            "the fake answered while the request was held"
        );
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), fake)
            .await
            .expect("the fake goes on once the step lets go")
            .unwrap();
    }

    #[tokio::test]
    async fn a_target_that_sends_nothing_is_not_waited_for_long() {
        let aims = Aims::default();
        assert!(aims.catch(7, Duration::from_millis(10)).await.is_none());
        assert!(aims.waiting.lock().unwrap().is_empty());
        // Nothing waits now: a request passes without asking who sent it.
        aims.arrived(Provider::Line, || -> Option<u32> { unreachable!() })
            .await;
    }
}
