//! Faults on one sender's link to a fake: what the fake does with a send request that has fully
//! arrived (an HTTP send's body, an e-mail's final dot) from a sender whose link the harness has
//! cut, slowed or made to drop answers. The harness decides per request (its `on_request` hook
//! knows the sending process) and returns a [`LinkFate`]; the fakes carry it out here and in
//! their connection code, and record what they did on the attempt's ledger entry.
//!
//! From the sender's side, each fate is what the real network does:
//! - [`LinkFate::Delay`]: the request reaches the provider late (latency on the way there);
//! - [`LinkFate::Hold`]: a partition. The request is held, unanswered, its connection open, until
//!   the link heals — then the provider serves it as if it had just arrived (TCP delivers the
//!   held bytes late, not never) — or until the sender hangs up first: then it never reached the
//!   provider, and is recorded `link_partition`, `status` `no_answer`, `client_hung_up`;
//! - [`LinkFate::Refuse`]: the link is down; the connection is reset (RST) before the provider
//!   reads the request. Recorded `link_refuse`, `Transient`: nothing was sent. An HTTP sender
//!   sees a reset, not `ECONNREFUSED`, since its connection was already accepted, so it cannot
//!   tell this from a reset after the provider served it. The SMTP fake asks before each command
//!   instead ([`crate::ledger::Hook::refuses`]) and closes the connection there without
//!   answering it (a FIN, so a reply the sender has not read yet still reaches it): the sender
//!   knows none of its message was sent (and no entry is recorded: no message was);
//! - [`LinkFate::Reset`]: the provider serves the request (commits an accepted send) and the
//!   connection is reset before a byte of the answer: the classic ambiguous send. Recorded with
//!   the provider's own outcome and `fault` `link_reset`, `status` `reset`.
//!
//! A fake never blocks a thread on a fate: holds and delays are async waits on the request's own
//! task. Never decided here: which sender, provider or moment is hit is the harness's business.

use std::time::Duration;

use tokio::sync::watch;

use crate::ledger::Draft;

/// What a link fault makes of one send request.
#[derive(Debug, Clone, Default)]
pub enum LinkFate {
    /// Serve it as usual.
    #[default]
    Pass,
    /// Serve it after this delay.
    Delay(Duration),
    /// Hold it unanswered until the link heals (then serve it), or until its sender hangs up.
    Hold(Heal),
    /// Reset the connection without serving it.
    Refuse,
    /// Serve it, then reset the connection instead of answering.
    Reset,
}

impl LinkFate {
    pub fn is_pass(&self) -> bool {
        matches!(self, LinkFate::Pass)
    }
}

/// The heal of a partition: resolves once the link is whole again.
#[derive(Debug, Clone)]
pub struct Heal(watch::Receiver<bool>);

/// The harness's side of a partition's [`Heal`]: [`Partition::heal`] (or dropping it) lets every
/// held request go on.
#[derive(Debug)]
pub struct Partition(watch::Sender<bool>);

impl Partition {
    /// A partition, cut now, and the heal its held requests wait for.
    pub fn new() -> (Partition, Heal) {
        let (tx, rx) = watch::channel(false);
        (Partition(tx), Heal(rx))
    }

    /// Heals the link: every request held on it is served now.
    pub fn heal(&self) {
        let _ = self.0.send(true);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.heal();
    }
}

impl Heal {
    /// Waits until the link heals (at once if it has).
    pub async fn healed(mut self) {
        // An error means the partition is gone, which heals it too.
        let _ = self.0.wait_for(|healed| *healed).await;
    }
}

/// A fault a link fate leaves on a ledger entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkFault {
    /// Held by a partition until its sender hung up: never reached the provider.
    Partition,
    /// Reset before the provider read it: never served.
    Refuse,
    /// Served, then reset before the answer.
    Reset,
}

impl LinkFault {
    /// The ledger's `fault` label.
    pub fn label(self) -> &'static str {
        match self {
            LinkFault::Partition => "link_partition",
            LinkFault::Refuse => "link_refuse",
            LinkFault::Reset => "link_reset",
        }
    }

    /// The fault whose label is `fault`, if any.
    pub fn of_label(fault: &str) -> Option<LinkFault> {
        [LinkFault::Partition, LinkFault::Refuse, LinkFault::Reset]
            .into_iter()
            .find(|f| f.label() == fault)
    }
}

/// The ledger's `status` of an entry whose answer a reset replaced.
pub const RESET: &str = "reset";

/// Marks `d`, a send a fate did not let the provider serve (a refuse, or a partition its sender
/// hung up on), as not sent: `Transient`, with the fault and no answer.
pub fn mark_not_served(d: &mut Draft, fault: LinkFault) {
    d.outcome = crate::ledger::Outcome::Transient;
    d.fault = Some(fault.label().into());
    d.message_id = None;
    d.retry_after_ms = None;
    match fault {
        LinkFault::Partition => {
            d.status = crate::outage::NO_ANSWER.into();
            d.error = Some("link partitioned: the sender hung up before the heal".into());
            d.client_hung_up = true;
        }
        _ => {
            d.status = RESET.into();
            d.error = Some("link down: connection reset before the request was read".into());
        }
    }
}

/// Marks `d`, a send the provider served, as answered by a reset instead: its outcome stays the
/// provider's, but the sender heard none of it (no status, no `Retry-After`).
pub fn mark_reset(d: &mut Draft) {
    let would = std::mem::replace(&mut d.status, RESET.into());
    d.error = Some(format!(
        "connection reset before the answer ({would} was not sent)"
    ));
    d.fault = Some(LinkFault::Reset.label().into());
    d.retry_after_ms = None;
}

/// What an HTTP fake does with a request once its fate is carried out as far as it goes before
/// the provider serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Serve it; if `reset`, record the entry with [`mark_reset`] and cut the connection instead
    /// of answering.
    Serve { reset: bool },
    /// Do not serve it: record it with [`mark_not_served`]; for a refuse, cut the connection.
    Skip(LinkFault),
}

/// Waits out `fate`'s delay or hold (HTTP fakes, inside [`crate::http::detached`]) and says what
/// to do next.
pub(crate) async fn before_serving_http(fate: LinkFate) -> Next {
    match fate {
        LinkFate::Pass => Next::Serve { reset: false },
        LinkFate::Delay(d) => {
            tokio::time::sleep(d).await;
            Next::Serve { reset: false }
        }
        LinkFate::Hold(heal) => match hold_http(heal).await {
            true => Next::Serve { reset: false },
            false => Next::Skip(LinkFault::Partition),
        },
        LinkFate::Refuse => Next::Skip(LinkFault::Refuse),
        LinkFate::Reset => Next::Serve { reset: true },
    }
}

/// How often a held HTTP request looks whether its sender hung up.
const HOLD_POLL: Duration = Duration::from_millis(20);

/// Holds the HTTP request this task serves until `heal` or [`crate::outage::MAX_HOLD`] (returns
/// `true`: serve it), or until its sender hangs up (returns `false`). Only meaningful inside
/// [`crate::http::detached`] with `inline = false`, where the hang-up is seen.
pub(crate) async fn hold_http(heal: Heal) -> bool {
    let until = tokio::time::Instant::now() + crate::outage::MAX_HOLD;
    let healed = heal.clone().healed();
    tokio::pin!(healed);
    loop {
        if crate::http::client_gone() {
            return false;
        }
        tokio::select! {
            () = &mut healed => return !crate::http::client_gone(),
            () = tokio::time::sleep(HOLD_POLL) => {}
        }
        if tokio::time::Instant::now() >= until {
            return true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip() {
        for f in [LinkFault::Partition, LinkFault::Refuse, LinkFault::Reset] {
            assert_eq!(LinkFault::of_label(f.label()), Some(f));
        }
        assert_eq!(LinkFault::of_label("outage_hang"), None);
    }

    #[tokio::test]
    async fn a_heal_lets_held_requests_go_and_dropping_the_partition_heals() {
        use futures::FutureExt;
        let (p, heal) = Partition::new();
        assert!(
            heal.clone().healed().now_or_never().is_none(),
            "held until the heal"
        );
        p.heal();
        assert!(heal.healed().now_or_never().is_some());
        let (p, heal) = Partition::new();
        drop(p);
        assert!(heal.healed().now_or_never().is_some());
    }
}
