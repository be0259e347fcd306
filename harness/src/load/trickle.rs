//! The trickle: small orders (their own batch ids, the batches' channels and template) enqueued at
//! a steady rate beside the batches, from the start of the load until the run says the batches'
//! deliveries are done and at least [`Trickle::MIN_ORDERS`] were sent, or its bound.
//!
//! Each order is its own task, started on schedule whatever the previous ones are doing, as
//! independent customers would: a slow API delays answers, not arrivals — up to
//! [`MAX_IN_FLIGHT`] orders waiting for their answers; past that the next order waits for one of
//! them (an open stream that outruns the stack would only measure a collapse the harness itself
//! caused, and every waiting order's latency is already recorded). An order's expected
//! deliveries are published before its request is sent, so the quiescence tracker knows them
//! before any provider can see them. It never decides when the run is done.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{EnqueueError, Enqueued, Poster, Recipient};
use crate::check::Expected;
use crate::scenario::{Scenario, Trickle};

/// Orders awaiting their answer at most.
pub const MAX_IN_FLIGHT: usize = 16;

/// A running trickle.
pub struct TrickleRun {
    stop: watch::Sender<Stop>,
    fresh: Arc<Mutex<Vec<Order>>>,
    /// Batch ids of the orders the stack accepted, not yet taken.
    accepted: Arc<Mutex<Vec<String>>>,
    /// Batch ids of the orders the stack never accepted, not yet taken.
    not_accepted: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<Result<Enqueued, EnqueueError>>,
}

/// What the run asked of the trickle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stop {
    No,
    /// Once at least [`Trickle::MIN_ORDERS`] were sent.
    WhenEnough,
    /// At once (the run's deadline).
    Now,
}

/// An order the trickle is enqueueing: its batch id and its deliveries.
pub struct Order {
    pub batch_id: String,
    pub expected: Vec<Expected>,
}

/// The batch id of the trickle's `k`-th order (0-based).
pub fn order_id(scenario: &Scenario, k: usize) -> String {
    format!("{}-{}-o{}", scenario.name, scenario.seed, k + 1)
}

/// What one order's task gave: its answers, or why the trickle must stop.
type OrderTask = Result<Enqueued, EnqueueError>;

/// One finished order's answers, or the error that ends the trickle.
fn order_answer(joined: Result<OrderTask, tokio::task::JoinError>) -> OrderTask {
    joined.map_err(|e| EnqueueError {
        batch_id: "trickle".into(),
        detail: format!("order task failed: {e}"),
    })?
}

/// Folds the orders answered so far into `out`, without waiting for the others.
fn fold_finished(posts: &mut JoinSet<OrderTask>, out: &mut Enqueued) -> Result<(), EnqueueError> {
    while let Some(joined) = posts.try_join_next() {
        out.merge(order_answer(joined)?);
    }
    Ok(())
}

impl TrickleRun {
    /// Starts the trickle. `people` are its recipients (`recipients` per order, in order; at
    /// most `people.len() / recipients` orders are sent).
    pub fn start(trickle: &Trickle, poster: Poster, people: Vec<Recipient>) -> TrickleRun {
        let (stop, mut stop_rx) = watch::channel(Stop::No);
        let fresh: Arc<Mutex<Vec<Order>>> = Arc::default();
        let per = trickle.recipients as usize;
        let gap = Duration::from_secs_f64(1.0 / trickle.per_second);
        let publish = fresh.clone();
        let accepted: Arc<Mutex<Vec<String>>> = Arc::default();
        let accept = accepted.clone();
        let not_accepted: Arc<Mutex<Vec<String>>> = Arc::default();
        let refused = not_accepted.clone();
        let task = tokio::spawn(async move {
            let scenario = poster.scenario.clone();
            let people = Arc::new(people);
            let mut posts = JoinSet::new();
            // Each order's answer is folded in as soon as it is in: a finished task holds its
            // own latency histogram (~170 KB), and a long run sends thousands of orders.
            let mut out = Enqueued::new();
            let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
            let start = Instant::now();
            for (k, chunk) in (0..people.len() / per).map(|k| (k, k * per..(k + 1) * per)) {
                let enough = k as u32 >= Trickle::MIN_ORDERS;
                let stopped = |s: Stop| s == Stop::Now || (enough && s == Stop::WhenEnough);
                // On schedule from the intended start: a slow answer never delays an arrival.
                let due = tokio::time::sleep_until((start + gap * k as u32).into());
                tokio::pin!(due);
                // The run dropped its handle (it failed or was interrupted): stop too.
                let mut gone = false;
                loop {
                    if stopped(*stop_rx.borrow_and_update()) {
                        break;
                    }
                    tokio::select! {
                        _ = &mut due => break,
                        changed = stop_rx.changed() => if changed.is_err() {
                            gone = true;
                            break;
                        },
                    }
                }
                if gone || stopped(*stop_rx.borrow()) {
                    break;
                }
                fold_finished(&mut posts, &mut out)?;
                let Ok(permit) = in_flight.clone().acquire_owned().await else {
                    break;
                };
                let batch_id = order_id(&scenario, k);
                let expected =
                    super::recipients::expected(&scenario, &people[chunk.clone()], |_| {
                        (batch_id.clone(), false)
                    });
                publish.lock().unwrap().push(Order {
                    batch_id: batch_id.clone(),
                    expected,
                });
                let (poster, people, accept) = (poster.clone(), people.clone(), accept.clone());
                let refused = refused.clone();
                posts.spawn(async move {
                    let _permit = permit;
                    let started = poster
                        .start(("trickle", k), &batch_id, &people[chunk])
                        .await;
                    let mut one = Enqueued::new();
                    one.record_started(started, true).await?;
                    let ids = one.batches.iter().map(|b| b.batch_id.clone());
                    accept.lock().unwrap().extend(ids);
                    let gone = one.failures.not_accepted.iter();
                    refused
                        .lock()
                        .unwrap()
                        .extend(gone.map(|b| b.batch_id.clone()));
                    Ok::<_, EnqueueError>(one)
                });
            }
            while let Some(joined) = posts.join_next().await {
                out.merge(order_answer(joined)?);
            }
            Ok(out)
        });
        TrickleRun {
            stop,
            fresh,
            accepted,
            not_accepted,
            task,
        }
    }

    /// Orders started since the last call, in order.
    pub fn take_new(&self) -> Vec<Order> {
        std::mem::take(&mut *self.fresh.lock().unwrap())
    }

    /// Batch ids of the orders accepted (202/200) since the last call.
    pub fn take_accepted(&self) -> Vec<String> {
        std::mem::take(&mut *self.accepted.lock().unwrap())
    }

    /// Batch ids of the orders the stack never accepted (within the retry window) since the
    /// last call: their deliveries are not expected.
    pub fn take_not_accepted(&self) -> Vec<String> {
        std::mem::take(&mut *self.not_accepted.lock().unwrap())
    }

    /// Asks the trickle to stop once it has sent at least [`Trickle::MIN_ORDERS`] orders.
    pub fn stop(&self) {
        self.stop.send_if_modified(|s| {
            let was = *s;
            *s = was.max(Stop::WhenEnough);
            *s != was
        });
    }

    /// Every order has been sent and answered (or one failed).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops the trickle and its orders in flight, recording nothing.
    pub fn abort(self) {
        self.task.abort();
    }

    /// Stops the trickle at once and waits for the last answers: the orders' latencies and enqueue
    /// times, and the orders started since the last [`TrickleRun::take_new`].
    pub async fn finish(self) -> Result<(Enqueued, Vec<Order>), EnqueueError> {
        let _ = self.stop.send(Stop::Now);
        let fresh = self.fresh;
        let sent = self.task.await.map_err(|e| EnqueueError {
            batch_id: "trickle".into(),
            detail: format!("trickle task failed: {e}"),
        })??;
        let late = std::mem::take(&mut *fresh.lock().unwrap());
        Ok((sent, late))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(k: u64) -> Enqueued {
        let mut one = Enqueued::new();
        one.latency_us.record(1_000).unwrap();
        one.batches.push(crate::report::BatchEnqueue {
            batch_id: format!("o{k}"),
            sent_ns: k,
            acked_ns: k + 1,
            trickle: true,
            latency_us: 1_000,
        });
        one
    }

    /// An answered order's task is folded in before the next order starts, so a run of
    /// thousands of orders holds the tasks still waiting, not every one it ever sent.
    #[tokio::test]
    async fn answered_orders_are_folded_in_and_let_go() {
        let mut posts = JoinSet::new();
        let mut out = Enqueued::new();
        for k in 0..100 {
            posts.spawn(async move { Ok::<_, EnqueueError>(answered(k)) });
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.batches.len() < 100 {
            assert!(Instant::now() < deadline, "orders never folded in");
            fold_finished(&mut posts, &mut out).unwrap();
            tokio::task::yield_now().await;
        }
        assert!(posts.is_empty(), "no finished task is kept");
        assert_eq!(out.latency_us.len(), 100);
        let sent: Vec<u64> = out.batches.iter().map(|b| b.sent_ns).collect();
        assert!(sent.is_sorted(), "in the order they were sent");

        posts.spawn(async {
            Err(EnqueueError {
                batch_id: "o101".into(),
                detail: "refused".into(),
            })
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let err = loop {
            assert!(Instant::now() < deadline, "the failed order never surfaced");
            match fold_finished(&mut posts, &mut out) {
                Err(e) => break e,
                Ok(()) => tokio::task::yield_now().await,
            }
        };
        assert_eq!(
            err.batch_id, "o101",
            "a failed order still ends the trickle"
        );
    }
}
