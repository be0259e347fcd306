//! The delivery state machine and THE compare-and-set function every path goes through.
//!
//! `STATE_MACHINE.md` draws the diagram; [`legal`] is its single source of truth. Worker outcomes,
//! callbacks, polls and the rescuer all call [`transition`], which refuses an edge [`legal`]
//! does not list (so nothing ever leaves a terminal state) and applies the change only if the row
//! is still in one of the expected states (and, when fenced, still under the caller's lease). The
//! claim (`claim.rs`) is the one bulk form of the `pending|retryable → sending` edge, the one
//! state change outside [`transition`]: still a compare-and-set (`WHERE state IN ('pending',
//! 'retryable')` on the row it locks, `SKIP LOCKED`), recorded on the row itself (`claimed_at`,
//! `claimed_from`). Each change writes its own transition onto the row (`head_*`); the database
//! moves the one it replaces into `delivery_events` (`migrations/0007_…`). This module must never
//! call a provider or hold a lock past one statement.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use sqlx::PgConnection;

/// A delivery's state, spelled as in the stack contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    Pending,
    Sending,
    Retryable,
    Submitted,
    Delivered,
    PermanentFailure,
    Failed,
    Unknown,
}

impl State {
    pub const ALL: [State; 8] = [
        State::Pending,
        State::Sending,
        State::Retryable,
        State::Submitted,
        State::Delivered,
        State::PermanentFailure,
        State::Failed,
        State::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Sending => "sending",
            State::Retryable => "retryable",
            State::Submitted => "submitted",
            State::Delivered => "delivered",
            State::PermanentFailure => "permanent_failure",
            State::Failed => "failed",
            State::Unknown => "unknown",
        }
    }

    /// Nothing leaves a terminal state.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            State::Delivered | State::PermanentFailure | State::Failed
        )
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for State {
    type Err = String;
    fn from_str(s: &str) -> Result<State, String> {
        State::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown state {s:?}"))
    }
}

/// Who takes an edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Worker,
    Callback,
    Poll,
    Rescuer,
    Api,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Worker => "worker",
            Source::Callback => "callback",
            Source::Poll => "poll",
            Source::Rescuer => "rescuer",
            Source::Api => "api",
        }
    }
}

/// The edges of the state machine and who may take each, exactly the edges some code path takes
/// (a unit test checks this against the diagram in `STATE_MACHINE.md`). See that file for why.
///
/// `pending|retryable → sending` is the claim (`claim::CLAIM_SQL`), the one bulk statement that
/// changes a state outside [`transition`]; a test checks that its `WHERE state IN (…)` is exactly
/// the set of states this function lets the worker move to `sending`.
pub fn legal(from: State, to: State, source: Source) -> bool {
    use Source::*;
    use State::*;
    match (from, to) {
        (Pending | Retryable, Sending) => source == Worker,
        (Sending, Pending | Retryable) => matches!(source, Worker | Rescuer),
        (Sending, Submitted) => matches!(source, Worker | Callback),
        (Sending, Delivered | PermanentFailure) => matches!(source, Worker | Callback),
        (Sending, Failed) => matches!(source, Worker | Rescuer),
        (Sending, Unknown) => matches!(source, Worker | Rescuer),
        (Submitted, Delivered | PermanentFailure) => matches!(source, Callback | Poll),
        (Submitted, Unknown) => source == Poll,
        (Unknown, Delivered | PermanentFailure) => matches!(source, Callback | Poll),
        (Unknown, Retryable | Failed) => source == Rescuer,
        _ => false,
    }
}

/// Optional column updates that ride along with a transition.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Updates {
    /// Next attempt no earlier than now + this (retryable / released rows).
    pub retry_in: Option<Duration>,
    pub provider_message_id: Option<String>,
    /// `(class, provider's own text)`, e.g. `("permanent", "550 5.1.1 mailbox unknown")`.
    pub error: Option<(String, String)>,
    /// First status poll no earlier than now + this (rows entering `submitted`).
    pub poll_in: Option<Duration>,
    /// The class of the attempt outcome this change records (`channels::class`: accepted,
    /// transient, ambiguous, permanent). Kept on the event, and only on an edge that leaves
    /// `sending` (one per attempt): `/metrics` counts attempts by it.
    pub outcome_class: Option<&'static str>,
}

/// Whose lease the change is conditional on.
#[derive(Clone, Debug)]
pub enum Fence {
    None,
    /// The row must still be leased to `owner` under `token` (a rescue bumps the token).
    Lease {
        owner: String,
        token: i64,
    },
    /// As `Lease`, and no attempt may have started under that lease: how an unstarted claim is
    /// given back. Checked when the row lock is taken, so a start that commits while the giver
    /// waits for the lock (having read the row before it) wins, and the row stays `sending`.
    Unstarted {
        owner: String,
        token: i64,
    },
    /// As `Lease`, and the started e-mail attempt has not marked its body as going out
    /// (`claim::mark_body`): how a rescuer retries an e-mail that committed nothing. Checked
    /// under the row lock, so a mark that commits while the rescuer waits wins.
    BodyUnsent {
        owner: String,
        token: i64,
    },
}

/// One requested change of state.
#[derive(Clone, Debug)]
pub struct Transition<'a> {
    pub delivery_id: i64,
    pub from: &'a [State],
    pub to: State,
    pub source: Source,
    pub detail: Option<String>,
    pub fence: Fence,
    pub set: Updates,
}

#[derive(Debug, thiserror::Error)]
pub enum TransitionError {
    #[error("illegal transition {from} -> {to} by {by:?}")]
    Illegal { from: State, to: State, by: Source },
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

/// The compare-and-set with its `old` row and the check of the row's state that goes with it (one
/// text for both forms: see [`CAS_SQL`] and [`CAS_ONE_SQL`]).
macro_rules! cas_sql {
    ($old:literal, $state_check:literal) => {
        concat!(
            r#"
WITH old AS ("#,
            $old,
            r#"), upd AS (
    UPDATE delivery_state d SET
        state = $3,
        updated_at = now(),
        next_attempt_at = COALESCE(now() + $4 * interval '1 millisecond', d.next_attempt_at),
        provider_message_id = COALESCE($5, d.provider_message_id),
        last_error_class = CASE WHEN $6::text IS NULL THEN d.last_error_class ELSE $6 END,
        last_error = CASE WHEN $6::text IS NULL THEN d.last_error ELSE $7 END,
        uncertain_since = CASE WHEN $6::text IS NULL THEN d.uncertain_since
                               WHEN $6 = 'ambiguous'
                               THEN COALESCE(d.uncertain_since, d.attempt_started_at)
                               ELSE NULL END,
        submitted_at = CASE WHEN $3 = 'submitted' THEN now() ELSE d.submitted_at END,
        next_poll_at = CASE WHEN $3 = 'submitted'
                            THEN now() + COALESCE($8, 0) * interval '1 millisecond'
                            ELSE d.next_poll_at END,
        lease_owner = CASE WHEN $3 = 'sending' THEN d.lease_owner ELSE NULL END,
        lease_expires_at = CASE WHEN $3 = 'sending' THEN d.lease_expires_at ELSE NULL END,
        head_from = old.state,
        head_source = $11,
        head_detail = $12,
        head_outcome_class = CASE WHEN old.state = 'sending' THEN $14::text END,
        head_at = clock_timestamp(),
        head_claimed_by = CASE WHEN old.state = 'sending' THEN d.lease_owner END
    FROM old
    WHERE d.id = old.id"#,
            $state_check,
            r#"
      AND ($9::text IS NULL OR (d.lease_owner = $9 AND d.lease_token = $10
           AND (NOT $13 OR d.attempt_lease_token IS DISTINCT FROM d.lease_token)
           AND (NOT $15 OR d.body_lease_token IS DISTINCT FROM d.lease_token)))
    RETURNING old.state AS from_state
)
SELECT from_state FROM upd
"#
        )
    };
}

/// The compare-and-set from one of several states: the row is locked first, so `old.state` is the
/// state the update really left (`UPDATE … RETURNING` sees only the new row), however the row
/// changed while this statement waited for it. The lock already checked the state on the latest
/// row; the update must not compare `d.state` with `old.state` again, because the update's scan of
/// `d` may read the version before the one the lock waited for (a join condition, judged before
/// PostgreSQL re-reads the row) and would drop a row that is in an expected state.
const CAS_SQL: &str = cas_sql!(
    "SELECT id, state FROM delivery_state WHERE id = $1 AND state = ANY($2) FOR UPDATE",
    ""
);

/// The compare-and-set from exactly one state (`$2` has one element; a worker's own outcome, a
/// release): the state it leaves is that one, so no row lock is taken first (one WAL record less
/// per transition). `old` is a constant, so `d.state = old.state` is the plain `WHERE state = …` of
/// an `UPDATE`: PostgreSQL re-checks it and the fence on the row's latest version when it had to
/// wait for that row, so the compare-and-set is the same.
const CAS_ONE_SQL: &str = cas_sql!(
    "SELECT $1::bigint AS id, ($2::text[])[1] AS state",
    " AND d.state = old.state"
);

/// Applies `t` if the row is in one of `t.from` (and the fence holds) and records it as the row's
/// latest transition in the same statement (leaving `sending`, with the lease owner that claimed
/// the attempt); the one it replaces moves into `delivery_events`. Returns the state it left, or `None` when the compare-and-set lost (the row
/// moved on, or the lease was lost): the caller treats that as "someone else decided".
pub async fn transition(
    conn: &mut PgConnection,
    t: &Transition<'_>,
) -> Result<Option<State>, TransitionError> {
    for &from in t.from {
        if !legal(from, t.to, t.source) {
            return Err(TransitionError::Illegal {
                from,
                to: t.to,
                by: t.source,
            });
        }
    }
    let from: Vec<&str> = t.from.iter().map(|s| s.as_str()).collect();
    let (owner, token, unstarted, body_unsent) = match &t.fence {
        Fence::None => (None, 0, false, false),
        Fence::Lease { owner, token } => (Some(owner.as_str()), *token, false, false),
        Fence::Unstarted { owner, token } => (Some(owner.as_str()), *token, true, false),
        Fence::BodyUnsent { owner, token } => (Some(owner.as_str()), *token, false, true),
    };
    let (class, text) = match &t.set.error {
        Some((c, e)) => (Some(c.as_str()), Some(e.as_str())),
        None => (None, None),
    };
    let sql = if from.len() == 1 {
        CAS_ONE_SQL
    } else {
        CAS_SQL
    };
    let row: Option<(String,)> = sqlx::query_as(sql)
        .bind(t.delivery_id)
        .bind(&from)
        .bind(t.to.as_str())
        .bind(t.set.retry_in.map(|d| d.as_millis() as f64))
        .bind(t.set.provider_message_id.as_deref())
        .bind(class)
        .bind(text)
        .bind(t.set.poll_in.map(|d| d.as_millis() as f64))
        .bind(owner)
        .bind(token)
        .bind(t.source.as_str())
        .bind(t.detail.as_deref())
        .bind(unstarted)
        .bind(t.set.outcome_class)
        .bind(body_unsent)
        .fetch_optional(conn)
        .await?;
    row.map(|(s,)| {
        s.parse()
            .map_err(|e: String| sqlx::Error::Decode(e.into()).into())
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::Source::*;
    use super::State::*;
    use super::*;

    /// A named event and the edge it asks for.
    fn event(name: &str) -> (State, Source) {
        match name {
            "claim" => (Sending, Worker),
            "release" => (Pending, Worker),
            "line_accepted" => (Delivered, Worker),
            "accepted" => (Submitted, Worker),
            "transient" => (Retryable, Worker),
            "permanent" => (PermanentFailure, Worker),
            "exhausted" => (Failed, Worker),
            "ambiguous_email" => (Unknown, Worker),
            "cb_delivered" => (Delivered, Callback),
            "cb_failed" => (PermanentFailure, Callback),
            "cb_sent" => (Submitted, Callback),
            "poll_delivered" => (Delivered, Poll),
            "rescue_unstarted" => (Pending, Rescuer),
            "rescue_resend" => (Retryable, Rescuer),
            "rescue_adopt" => (Submitted, Rescuer),
            "rescue_exhausted" => (Failed, Rescuer),
            "poll_unconfirmed" => (Unknown, Poll),
            "cb_unknown_sent" => (Submitted, Callback),
            "rescue_unknown" => (Unknown, Rescuer),
            "policy_resend" => (Retryable, Rescuer),
            "api_anything" => (Delivered, Api),
            _ => panic!("no event {name}"),
        }
    }

    #[test]
    fn state_event_table() {
        // (state, event, Some(next) | None = rejected)
        let cases: &[(State, &str, Option<State>)] = &[
            (Pending, "claim", Some(Sending)),
            (Retryable, "claim", Some(Sending)),
            (Submitted, "claim", None),
            (Sending, "claim", None),
            (Sending, "release", Some(Pending)),
            (Sending, "line_accepted", Some(Delivered)),
            (Sending, "accepted", Some(Submitted)),
            (Sending, "transient", Some(Retryable)),
            (Sending, "permanent", Some(PermanentFailure)),
            (Sending, "exhausted", Some(Failed)),
            (Sending, "ambiguous_email", Some(Unknown)),
            (Pending, "accepted", None),
            (Retryable, "permanent", None),
            (Submitted, "cb_delivered", Some(Delivered)),
            (Submitted, "cb_failed", Some(PermanentFailure)),
            (Submitted, "poll_delivered", Some(Delivered)),
            (Sending, "cb_delivered", Some(Delivered)),
            (Unknown, "cb_delivered", Some(Delivered)),
            (Unknown, "policy_resend", Some(Retryable)),
            (Unknown, "transient", None),
            (Sending, "rescue_unstarted", Some(Pending)),
            (Sending, "rescue_resend", Some(Retryable)),
            // The worker adopts SMS sids (its lookup before a resend), never the rescuer.
            (Sending, "rescue_adopt", None),
            (Sending, "rescue_exhausted", Some(Failed)),
            (Submitted, "poll_unconfirmed", Some(Unknown)),
            (Sending, "poll_unconfirmed", None),
            (Unknown, "cb_failed", Some(PermanentFailure)),
            (Unknown, "cb_unknown_sent", None),
            // A poll under way when the horizon settled the row still records its answer.
            (Unknown, "poll_delivered", Some(Delivered)),
            (Sending, "rescue_unknown", Some(Unknown)),
            (Pending, "rescue_resend", None),
            (Submitted, "rescue_resend", None),
            // Stale and duplicate reports never regress a terminal state.
            (Delivered, "cb_sent", None),
            (Delivered, "cb_failed", None),
            (PermanentFailure, "cb_delivered", None),
            (Failed, "claim", None),
            (Delivered, "claim", None),
            (Delivered, "rescue_resend", None),
            (Failed, "policy_resend", None),
            (Delivered, "api_anything", None),
        ];
        for &(state, name, want) in cases {
            let (to, source) = event(name);
            let got = legal(state, to, source).then_some(to);
            assert_eq!(got, want, "{state} + {name}");
        }
    }

    #[test]
    fn no_edge_leaves_a_terminal_state() {
        for from in State::ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in State::ALL {
                for src in [Worker, Callback, Poll, Rescuer, Api] {
                    assert!(!legal(from, to, src), "{from} -> {to} by {src:?}");
                }
            }
        }
    }

    /// The mermaid diagram in `STATE_MACHINE.md` and [`legal`] list exactly the same edges, each
    /// with the same takers (the parenthesised names in the edge's label).
    #[test]
    fn the_diagram_and_legal_agree() {
        let doc = include_str!("../STATE_MACHINE.md");
        let diagram = doc
            .split("```mermaid")
            .nth(1)
            .and_then(|d| d.split("```").next())
            .expect("a mermaid block");
        let sources = [Worker, Callback, Poll, Rescuer, Api];
        let mut drawn = std::collections::BTreeSet::new();
        for line in diagram.lines().map(str::trim).filter(|l| l.contains("-->")) {
            let (edge, label) = line.split_once(':').unwrap_or((line, ""));
            let (from, to) = edge.split_once("-->").unwrap();
            let (from, to) = (from.trim(), to.trim());
            if from == "[*]" || to == "[*]" {
                continue;
            }
            let from: State = from.parse().unwrap();
            let to: State = to.parse().unwrap();
            let mut takers = 0;
            for group in label.split('(').skip(1) {
                let names = group.split(')').next().unwrap();
                for name in names.split(',').map(str::trim) {
                    let src = sources
                        .into_iter()
                        .find(|s| s.as_str() == name)
                        .unwrap_or_else(|| panic!("{line}: unknown taker {name:?}"));
                    drawn.insert((from, to, src.as_str()));
                    takers += 1;
                }
            }
            assert!(takers > 0, "{line}: no taker named");
        }
        let mut coded = std::collections::BTreeSet::new();
        for from in State::ALL {
            for to in State::ALL {
                for src in sources {
                    if legal(from, to, src) {
                        coded.insert((from, to, src.as_str()));
                    }
                }
            }
        }
        let only_drawn: Vec<_> = drawn.difference(&coded).collect();
        let only_coded: Vec<_> = coded.difference(&drawn).collect();
        assert!(
            only_drawn.is_empty() && only_coded.is_empty(),
            "drawn but not legal: {only_drawn:?}; legal but not drawn: {only_coded:?}"
        );
    }

    /// The claim is the one bulk state change outside [`transition`]: the states its
    /// `WHERE state IN (…)` takes rows from are exactly those `legal` lets the worker move to
    /// `sending`, so it can never take a row out of a terminal state.
    #[test]
    fn the_claim_takes_exactly_the_states_legal_allows() {
        let allowed: Vec<State> = State::ALL
            .into_iter()
            .filter(|s| legal(*s, Sending, Worker))
            .collect();
        assert_eq!(allowed, [Pending, Retryable]);
        let sql = crate::claim::CLAIM_SQL;
        let (_, rest) = sql
            .split_once("WHERE state IN (")
            .expect("the claim picks by state");
        let list = rest.split(')').next().unwrap();
        let mut taken: Vec<State> = list
            .split(',')
            .map(|s| s.trim().trim_matches('\'').parse().unwrap())
            .collect();
        taken.sort();
        assert_eq!(taken, allowed, "{sql}");
        assert!(sql.contains("FOR UPDATE SKIP LOCKED"));
        assert!(allowed.iter().all(|s| !s.is_terminal()));
    }

    #[test]
    fn names_round_trip() {
        for s in State::ALL {
            assert_eq!(s.as_str().parse::<State>().unwrap(), s);
        }
    }
}
