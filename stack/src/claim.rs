//! The claim path: take ready rows under a lease, record an attempt's start under that lease,
//! release unstarted rows, and renew leases. Reused by `ting-chaos bench claim`.
//!
//! Every statement here is one round trip and no transaction spans a provider call. The
//! attempt-start fence is what stops a worker that lost its lease (frozen by SIGSTOP, say) from
//! sending. This module must never call a provider.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{Column, PgConnection, PgExecutor, Row as _};

use crate::channels::Channel;
use crate::render::Payload;
use crate::state::{self, Fence, Source, State, Transition, Updates};

/// One claimed delivery, with everything a sender needs.
#[derive(Clone, Debug)]
pub struct Claimed {
    pub id: i64,
    pub key: String,
    pub channel: Channel,
    pub address: String,
    pub payload: Payload,
    pub payload_sha256: String,
    pub correlation_id: String,
    /// Attempts made before this claim.
    pub attempts: i32,
    pub lease_owner: String,
    pub lease_token: i64,
    pub created_at: DateTime<Utc>,
    pub last_error_class: Option<String>,
    pub attempt_started_at: Option<DateTime<Utc>>,
    pub from_state: State,
}

/// A claimed row as the claim statements return it: `from_state`, then [`returning!`]'s columns,
/// in exactly this order ([`COLUMNS`]).
struct Row {
    from_state: String,
    id: i64,
    key: String,
    channel: String,
    address: String,
    payload: sqlx::types::Json<Payload>,
    payload_sha256: String,
    correlation_id: String,
    attempts: i32,
    lease_owner: Option<String>,
    lease_token: i64,
    created_at: DateTime<Utc>,
    last_error_class: Option<String>,
    attempt_started_at: Option<DateTime<Utc>>,
}

/// The claim statements' output columns, by position.
const COLUMNS: [&str; 14] = [
    "from_state",
    "id",
    "key",
    "channel",
    "address",
    "payload",
    "payload_sha256",
    "correlation_id",
    "attempts",
    "lease_owner",
    "lease_token",
    "created_at",
    "last_error_class",
    "attempt_started_at",
];

/// The columns every claim statement returns after `from_state`, in [`COLUMNS`] order: `i` is the
/// claimed row's `delivery_items` row, `s` its `delivery_state` row as the claim left it.
macro_rules! returning {
    () => {
        "i.id, i.key, i.channel, i.address, i.payload, i.payload_sha256, i.correlation_id, \
         s.attempts, s.lease_owner, s.lease_token, i.created_at, s.last_error_class, \
         s.attempt_started_at"
    };
}

impl Row {
    /// Decodes claim rows by position. The claim is the hottest statement of a worker and
    /// `FromRow` by name (a name lookup and a type-compatibility check per column per row) was a
    /// quarter of the client's instructions per claimed row in `bench claim` under callgrind; the
    /// names are checked once per result set instead, so a reordered `RETURNING` is an error, not
    /// a silent mix-up.
    fn decode_all(rows: &[PgRow]) -> Result<Vec<Row>, sqlx::Error> {
        if let Some(first) = rows.first() {
            check_columns(first.columns().iter().map(|c| c.name()))?;
        }
        rows.iter().map(Row::decode).collect()
    }

    fn decode(r: &PgRow) -> Result<Row, sqlx::Error> {
        Ok(Row {
            from_state: r.try_get_unchecked(0)?,
            id: r.try_get_unchecked(1)?,
            key: r.try_get_unchecked(2)?,
            channel: r.try_get_unchecked(3)?,
            address: r.try_get_unchecked(4)?,
            payload: r.try_get_unchecked(5)?,
            payload_sha256: r.try_get_unchecked(6)?,
            correlation_id: r.try_get_unchecked(7)?,
            attempts: r.try_get_unchecked(8)?,
            lease_owner: r.try_get_unchecked(9)?,
            lease_token: r.try_get_unchecked(10)?,
            created_at: r.try_get_unchecked(11)?,
            last_error_class: r.try_get_unchecked(12)?,
            attempt_started_at: r.try_get_unchecked(13)?,
        })
    }
}

fn check_columns<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> Result<(), sqlx::Error> {
    let got: Vec<&str> = names.collect();
    if got != COLUMNS {
        return Err(sqlx::Error::Protocol(format!(
            "claim statement returned columns {got:?}, expected {COLUMNS:?}"
        )));
    }
    Ok(())
}

impl TryFrom<Row> for Claimed {
    type Error = sqlx::Error;

    /// A channel or state this code does not know is a decode error, never a guess: the claim
    /// fails, its rows keep the lease until it lapses, and the rescuer logs them again.
    fn try_from(r: Row) -> Result<Claimed, sqlx::Error> {
        let channel = Channel::parse(&r.channel).ok_or_else(|| {
            sqlx::Error::Decode(
                format!("delivery {}: unknown channel {:?}", r.id, r.channel).into(),
            )
        })?;
        let from_state = r
            .from_state
            .parse()
            .map_err(|e: String| sqlx::Error::Decode(format!("delivery {}: {e}", r.id).into()))?;
        Ok(Claimed {
            id: r.id,
            key: r.key,
            channel,
            address: r.address,
            payload: r.payload.0,
            payload_sha256: r.payload_sha256,
            correlation_id: r.correlation_id,
            attempts: r.attempts,
            lease_owner: r.lease_owner.unwrap_or_default(),
            lease_token: r.lease_token,
            created_at: r.created_at,
            last_error_class: r.last_error_class,
            attempt_started_at: r.attempt_started_at,
            from_state,
        })
    }
}

/// The claim statement with its `ORDER BY` (one text for the claim and its flaw).
macro_rules! claim_sql {
    ($order:literal) => {
        concat!(
            r#"
WITH picked AS MATERIALIZED (
    SELECT id, state FROM delivery_state
    WHERE state IN ('pending', 'retryable') AND next_attempt_at <= now()
    ORDER BY "#,
            $order,
            r#"
    LIMIT {batch}
    FOR UPDATE SKIP LOCKED
), s AS (
    UPDATE delivery_state d
    SET lease_owner = $1, lease_token = d.lease_token + 1,
        lease_expires_at = now() + $2 * interval '1 millisecond', updated_at = now(),
        state = 'sending', claimed_at = clock_timestamp(), claimed_from = picked.state,
        head_from = NULL, head_source = NULL, head_detail = NULL, head_outcome_class = NULL,
        head_at = NULL, head_claimed_by = NULL
    FROM picked
    WHERE d.id = picked.id AND d.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING picked.state AS from_state, d.id, d.attempts, d.lease_owner, d.lease_token,
              d.last_error_class, d.attempt_started_at
)
SELECT s.from_state, "#,
            returning!(),
            r#"
FROM s CROSS JOIN LATERAL (SELECT * FROM delivery_items i WHERE i.id = s.id OFFSET 0) i
"#
        )
    };
}

/// The claim: `$1` worker id, `$2` lease in milliseconds, and the batch size written into the text
/// ([`for_batch`]). Ready rows of small batches first (`priority` 0, set at enqueue: see
/// `api/batches.rs`), each class in due order, so a transactional order never waits for a
/// campaign to drain. The partial index `delivery_state_ready` on `(priority, next_attempt_at)`
/// makes `picked` an index scan over ready rows only, already in this order.
///
/// The batch size is part of the text, not a bind parameter, so that PostgreSQL settles on the
/// statement's generic plan. After five custom plans its plan cache compares their average cost
/// with the generic plan's; with `LIMIT $n` the generic plan guesses a tenth of the table and looks
/// dearer, so the claim was planned afresh on every call, and planning was more than half of a
/// one-row claim's time on the server (0.44 ms against 0.18 ms under `pgbench -r`). A worker asks
/// for at most `claim_batch` sizes, each its own prepared statement.
///
/// The plan must still not depend on the planner's guesses: `picked` is materialised and the
/// update also matches `id = ANY(ARRAY(…))` (with a plain join a generic plan once hash-joined
/// `picked` against a sequential scan of the whole table, 2.9 ms against 0.17 ms per claim on
/// 12 000 rows, growing with the table), and each claimed row's `delivery_items` row, which the
/// claim only reads (it rewrites the narrow `delivery_state` row alone: see
/// `migrations/0005_lean_state.sql`), is one primary-key lookup of its own (`LATERAL … OFFSET 0`
/// keeps the planner from making it a join whose size it would guess: joined by `id = ANY(…)` it
/// re-read every claimed row's item once per claimed row, 100 × 100 lookups and four fifths of a
/// 100-row claim's time).
///
/// The claim writes no event row of its own: it records itself on the state row (`claimed_at`,
/// `claimed_from`) and clears the row's latest transition, which the database moves into
/// `delivery_events` (`migrations/0007_latest_transition_on_the_row.sql`); the transition that
/// ends the attempt carries the claim (`delivery_transitions` reads every one back).
pub const CLAIM_SQL: &str = claim_sql!("priority, next_attempt_at");

/// The `fifo-by-batch` flaw: the claim in due order alone, so every row of a batch enqueued
/// earlier (a campaign) goes before a small order enqueued after it. Never used unless the flaw
/// is switched on.
pub const CLAIM_FIFO_SQL: &str = claim_sql!("next_attempt_at");

/// A claim statement ([`CLAIM_SQL`], [`CLAIM_FIFO_SQL`]) for `batch` rows.
pub fn for_batch(sql: &str, batch: i64) -> String {
    sql.replace("{batch}", &batch.to_string())
}

/// Claims up to `batch` ready rows for `worker_id` with a lease of `lease`.
pub async fn claim(
    conn: &mut PgConnection,
    worker_id: &str,
    batch: i64,
    lease: Duration,
) -> Result<Vec<Claimed>, sqlx::Error> {
    claim_with(CLAIM_SQL, conn, worker_id, batch, lease).await
}

/// [`claim`] with the `fifo-by-batch` flaw's statement ([`CLAIM_FIFO_SQL`]).
pub async fn claim_fifo(
    conn: &mut PgConnection,
    worker_id: &str,
    batch: i64,
    lease: Duration,
) -> Result<Vec<Claimed>, sqlx::Error> {
    claim_with(CLAIM_FIFO_SQL, conn, worker_id, batch, lease).await
}

async fn claim_with(
    sql: &'static str,
    conn: &mut PgConnection,
    worker_id: &str,
    batch: i64,
    lease: Duration,
) -> Result<Vec<Claimed>, sqlx::Error> {
    let rows = sqlx::query(&for_batch(sql, batch))
        .bind(worker_id)
        .bind(lease.as_millis() as f64)
        .fetch_all(conn)
        .await?;
    Row::decode_all(&rows)?
        .into_iter()
        .map(Claimed::try_from)
        .collect()
}

/// The `racy-claim` flaw: read ready rows, then take them without locking or re-checking.
/// Two workers can claim the same row. Never used unless the flaw is switched on.
pub async fn claim_racy(
    conn: &mut PgConnection,
    worker_id: &str,
    batch: i64,
    lease: Duration,
) -> Result<Vec<Claimed>, sqlx::Error> {
    let ids: Vec<(i64, String)> = sqlx::query_as(
        "SELECT id, state FROM delivery_state WHERE state IN ('pending','retryable') \
         AND next_attempt_at <= now() ORDER BY next_attempt_at LIMIT $1",
    )
    .bind(batch)
    .fetch_all(&mut *conn)
    .await?;
    let (ids, states): (Vec<i64>, Vec<String>) = ids.into_iter().unzip();
    let sql = format!(
        "WITH s AS (UPDATE delivery_state d SET state = 'sending', lease_owner = $1, \
         lease_token = d.lease_token + 1, lease_expires_at = now() + $3 * interval '1 millisecond', \
         claimed_at = clock_timestamp(), claimed_from = picked.state, head_from = NULL, \
         head_source = NULL, head_detail = NULL, head_outcome_class = NULL, head_at = NULL, \
         head_claimed_by = NULL \
         FROM UNNEST($2::bigint[], $4::text[]) AS picked(id, state) WHERE d.id = picked.id \
         RETURNING picked.state AS from_state, d.*) \
         SELECT s.from_state, {} FROM s JOIN delivery_items i ON i.id = s.id",
        returning!()
    );
    let rows = sqlx::query(&sql)
        .bind(worker_id)
        .bind(&ids)
        .bind(lease.as_millis() as f64)
        .bind(&states)
        .fetch_all(conn)
        .await?;
    Row::decode_all(&rows)?
        .into_iter()
        .map(Claimed::try_from)
        .collect()
}

/// Records the start of an attempt (attempts + 1) if `d` is still leased to its owner under
/// its token with at least `margin` left. `None`: the lease is lost and the caller must not send.
/// The time left is judged with `clock_timestamp()`, re-evaluated when the row changed while
/// the start waited for its lock; a start that waited behind a lock that changed nothing is *not*
/// re-judged by PostgreSQL, so the caller must check its own local deadline after this returns
/// (the worker does, and takes the start back).
pub async fn start_attempt<'e>(
    ex: impl PgExecutor<'e>,
    d: &Claimed,
    margin: Duration,
) -> Result<Option<i32>, sqlx::Error> {
    let row: Option<(i32,)> = sqlx::query_as(
        "UPDATE delivery_state SET attempts = attempts + 1, attempt_started_at = now(), \
         attempt_lease_token = lease_token, updated_at = now() \
         WHERE id = $1 AND state = 'sending' AND lease_owner = $2 AND lease_token = $3 \
         AND lease_expires_at > clock_timestamp() + $4 * interval '1 millisecond' RETURNING attempts",
    )
    .bind(d.id)
    .bind(&d.lease_owner)
    .bind(d.lease_token)
    .bind(margin.as_millis() as f64)
    .fetch_optional(ex)
    .await?;
    Ok(row.map(|(a,)| a))
}

/// Records, fenced on `d`'s lease and its started attempt, that the attempt's e-mail body is about
/// to go out: from here on the message may be committed by the provider. `false`: the lease or the
/// start is no longer ours, and the caller must not send the body.
pub async fn mark_body<'e>(ex: impl PgExecutor<'e>, d: &Claimed) -> Result<bool, sqlx::Error> {
    let r = sqlx::query(
        "UPDATE delivery_state SET body_lease_token = lease_token \
         WHERE id = $1 AND state = 'sending' AND lease_owner = $2 AND lease_token = $3 \
         AND attempt_lease_token = lease_token AND lease_expires_at > clock_timestamp()",
    )
    .bind(d.id)
    .bind(&d.lease_owner)
    .bind(d.lease_token)
    .execute(ex)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Takes back a start recorded by [`start_attempt`] whose send was never made (the process
/// stalled past its local lease deadline in between): the attempt is not counted and the row no
/// longer reads as started under this lease, so a rescuer releases it instead of reconciling.
pub async fn undo_start<'e>(ex: impl PgExecutor<'e>, d: &Claimed) -> Result<bool, sqlx::Error> {
    let r = sqlx::query(
        "UPDATE delivery_state SET attempts = attempts - 1, attempt_lease_token = NULL \
         WHERE id = $1 AND state = 'sending' AND lease_owner = $2 AND lease_token = $3 \
         AND attempt_lease_token = lease_token",
    )
    .bind(d.id)
    .bind(&d.lease_owner)
    .bind(d.lease_token)
    .execute(ex)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Gives an unstarted claim back at once, attempt count untouched.
pub async fn release(
    conn: &mut PgConnection,
    d: &Claimed,
    source: Source,
    why: &str,
) -> Result<bool, state::TransitionError> {
    let to = if d.attempts == 0 {
        State::Pending
    } else {
        State::Retryable
    };
    let t = Transition {
        delivery_id: d.id,
        from: &[State::Sending],
        to,
        source,
        detail: Some(why.to_string()),
        fence: Fence::Unstarted {
            owner: d.lease_owner.clone(),
            token: d.lease_token,
        },
        set: Updates {
            retry_in: Some(Duration::ZERO),
            ..Updates::default()
        },
    };
    Ok(state::transition(conn, &t).await?.is_some())
}

/// Marks a claimed row finished (`to`), fenced on its lease. Used by the claim benchmark.
pub async fn complete(
    conn: &mut PgConnection,
    d: &Claimed,
    to: State,
) -> Result<bool, state::TransitionError> {
    let t = Transition {
        delivery_id: d.id,
        from: &[State::Sending],
        to,
        source: Source::Worker,
        detail: None,
        fence: Fence::Lease {
            owner: d.lease_owner.clone(),
            token: d.lease_token,
        },
        set: Updates::default(),
    };
    Ok(state::transition(conn, &t).await?.is_some())
}

/// Extends the unexpired leases `worker_id` holds among `held` (delivery id, lease token) and
/// stamps its heartbeat. Returns the claims whose lease was extended: an expired lease is never revived (it belongs to the
/// rescuer), so a caller must not assume every held row was. The new expiry counts from the
/// statement's start (`now()`), never from when a lock it waited for was released, so a renewal
/// stuck behind a lock cannot push a lease past what its caller recorded locally.
pub async fn renew(
    conn: &mut PgConnection,
    worker_id: &str,
    lease: Duration,
    held: &[(i64, i64)],
) -> Result<Vec<(i64, i64)>, sqlx::Error> {
    sqlx::query("UPDATE workers SET heartbeat_at = now() WHERE id = $1")
        .bind(worker_id)
        .execute(&mut *conn)
        .await?;
    // Only the rows a live task is working on: a row whose task died (say, on a dropped database
    // connection) must lapse and be rescued, not be kept alive by a healthy heartbeat forever.
    let (ids, tokens): (Vec<i64>, Vec<i64>) = held.iter().copied().unzip();
    let renewed: Vec<(i64, i64)> = sqlx::query_as(
        "UPDATE delivery_state d SET lease_expires_at = now() + $2 * interval '1 millisecond' \
         FROM UNNEST($3::bigint[], $4::bigint[]) AS held(id, token) \
         WHERE d.id = held.id AND d.lease_token = held.token AND d.state = 'sending' \
         AND d.lease_owner = $1 AND d.lease_expires_at > clock_timestamp() \
         RETURNING d.id, d.lease_token",
    )
    .bind(worker_id)
    .bind(lease.as_millis() as f64)
    .bind(&ids)
    .bind(&tokens)
    .fetch_all(conn)
    .await?;
    Ok(renewed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(channel: &str, from_state: &str) -> Row {
        Row {
            from_state: from_state.into(),
            id: 7,
            key: "k".into(),
            channel: channel.into(),
            address: "a".into(),
            payload: sqlx::types::Json(Payload::default()),
            payload_sha256: String::new(),
            correlation_id: String::new(),
            attempts: 0,
            lease_owner: Some("w".into()),
            lease_token: 1,
            created_at: Utc::now(),
            last_error_class: None,
            attempt_started_at: None,
        }
    }

    #[test]
    fn an_unknown_channel_or_state_is_a_decode_error_never_a_guess() {
        let ok = Claimed::try_from(row("sms", "retryable")).unwrap();
        assert_eq!(
            (ok.channel, ok.from_state),
            (Channel::Sms, State::Retryable)
        );
        let err = Claimed::try_from(row("whatsapp", "pending")).unwrap_err();
        assert!(
            err.to_string().contains("unknown channel \"whatsapp\""),
            "{err}"
        );
        let err = Claimed::try_from(row("line", "limbo")).unwrap_err();
        assert!(err.to_string().contains("unknown state \"limbo\""), "{err}");
    }

    #[test]
    fn claim_rows_are_decoded_only_in_the_expected_column_order() {
        assert!(check_columns(COLUMNS.iter().copied()).is_ok());
        let mut swapped = COLUMNS;
        swapped.swap(2, 3);
        let err = check_columns(swapped.iter().copied()).unwrap_err();
        assert!(err.to_string().contains("\"channel\", \"key\""), "{err}");
        assert!(check_columns(COLUMNS[..13].iter().copied()).is_err());
    }

    #[test]
    fn the_claim_statements_return_the_decoded_columns() {
        // `from_state` then `returning!()` must name COLUMNS in order: the decoder is positional.
        let returned: Vec<&str> = std::iter::once("from_state")
            .chain(
                returning!()
                    .split(',')
                    .map(|c| c.trim())
                    .map(|c| c.split_once('.').map_or(c, |(_, name)| name)),
            )
            .collect();
        assert_eq!(returned, COLUMNS);
        assert!(CLAIM_SQL.contains(returning!()));
    }
}
