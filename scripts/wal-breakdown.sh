#!/usr/bin/env bash
# wal-breakdown.sh: what one job writes to the WAL in the reference stack's schema, by record type
# (B-tree insert, heap update, row lock, …), and how many of its updates are HOT — the figures
# behind issue 14's "WAL/job ≤ 900 B". Each job is the worker's three statements on one row, one
# transaction each: the claim (recorded on the row), the attempt start, the completion (recorded on
# the row as its latest transition: a LINE delivery accepted with a provider id).
#
# Usage: DATABASE_URL=postgres://… scripts/wal-breakdown.sh [JOBS]   (default 2000)
#        `target/release/ting-chaos db up` prints a URL to a throwaway server.
# Needs: psql, python3, PostgreSQL 15+ (pg_walinspect). Creates and drops database `wal_breakdown`.
# Record sizes exclude full-page images (reported apart): they depend on checkpoints, not on the
# schema. The three statements are written out here, shaped after `stack/src/claim.rs`
# (CLAIM_SQL, the attempt start) and `stack/src/state.rs` (CAS_ONE_SQL) with the columns they set,
# not called from them: when those change, change these (`bench claim` runs the real claim and
# the benchmark's completion and prints their WAL per row, without the breakdown).
set -euo pipefail

JOBS="${1:-2000}"
[[ "$JOBS" =~ ^[1-9][0-9]{0,6}$ ]] || { echo "error: JOBS must be a whole number from 1 to 9999999, got '$JOBS'" >&2; exit 2; }
URL="${DATABASE_URL:?set DATABASE_URL to a server (ting-chaos db up prints one)}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
DB=wal_breakdown
db_url="$(python3 -c 'import sys,urllib.parse as u; p=u.urlparse(sys.argv[1]); print(p._replace(path="/"+sys.argv[2]).geturl())' "$URL" "$DB")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"; psql "$URL" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true' EXIT

psql "$URL" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
for f in "$HERE"/stack/migrations/*.sql; do psql "$db_url" -q -v ON_ERROR_STOP=1 -f "$f" >/dev/null; done
psql "$db_url" -qc "CREATE EXTENSION IF NOT EXISTS pg_walinspect" >/dev/null

cat >"$tmp/seed.sql" <<SQL
TRUNCATE delivery_events, delivery_state, delivery_items, batches CASCADE;
INSERT INTO batches (id, template_id, template_version, deliveries) VALUES ('b1', 't', 1, $JOBS);
WITH items AS (
  INSERT INTO delivery_items (batch_id, key, recipient, channel, address, template_version, payload,
                              payload_sha256, correlation_id)
  SELECT 'b1', 'b1:r' || g || ':line', 'r' || g, 'line', 'U' || md5(g::text), 1,
         jsonb_build_object('text', 'Hello customer ' || g || ', your order #' || g
                            || ' has shipped. Track it at https://example.com/t/' || md5(g::text)),
         md5(g::text) || md5(g::text), md5('c' || g)
  FROM generate_series(1, $JOBS) g RETURNING id)
INSERT INTO delivery_state (id, next_attempt_at) SELECT id, now() - interval '1 hour' FROM items;
VACUUM ANALYZE delivery_items, delivery_state;
SQL

python3 - "$JOBS" >"$tmp/work.sql" <<'PY'
import sys
jobs = int(sys.argv[1])
claim = """WITH picked AS MATERIALIZED (SELECT id, state FROM delivery_state
  WHERE state IN ('pending', 'retryable') AND next_attempt_at <= now()
  ORDER BY priority, next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED),
s AS (UPDATE delivery_state d SET lease_owner = 'w-1234', lease_token = d.lease_token + 1,
  lease_expires_at = now() + interval '30 s', updated_at = now(), state = 'sending',
  claimed_at = clock_timestamp(), claimed_from = picked.state, head_from = NULL, head_source = NULL,
  head_detail = NULL, head_outcome_class = NULL, head_at = NULL, head_claimed_by = NULL
  FROM picked WHERE d.id = picked.id AND d.id = ANY (ARRAY(SELECT id FROM picked))
  RETURNING picked.state AS from_state, d.id, d.lease_token)
SELECT s.id, s.lease_token AS token, i.payload FROM s JOIN delivery_items i ON i.id = s.id
WHERE i.id = ANY (ARRAY(SELECT id FROM s)) \\gset
"""
start = """UPDATE delivery_state SET attempts = attempts + 1, attempt_started_at = now(),
  attempt_lease_token = lease_token, updated_at = now()
  WHERE id = :id AND state = 'sending' AND lease_owner = 'w-1234' AND lease_token = :token
  AND lease_expires_at > clock_timestamp();
"""
done = """WITH old AS (SELECT :id::bigint AS id, 'sending'::text AS state)
UPDATE delivery_state d SET state = 'delivered', updated_at = now(),
  provider_message_id = md5(d.id::text), last_error_class = NULL, last_error = NULL,
  uncertain_since = NULL, lease_owner = NULL, lease_expires_at = NULL, head_from = old.state,
  head_source = 'worker', head_detail = 'attempt 1 accepted', head_outcome_class = 'accepted',
  head_at = clock_timestamp(), head_claimed_by = d.lease_owner
  FROM old WHERE d.id = old.id AND d.state = old.state AND d.lease_owner = 'w-1234'
  AND d.lease_token = :token;
"""
print("SELECT pg_current_wal_lsn() AS l0, n_tup_upd AS u0, n_tup_hot_upd AS h0 FROM pg_stat_user_tables WHERE relname = 'delivery_state' \\gset")
for _ in range(jobs):
    print(claim + start + done, end="")
# The cumulative statistics reach pg_stat_user_tables at most a second after the last commit.
print(f"""SELECT pg_sleep(1) \\g /dev/null
SELECT "resource_manager/record_type" AS wal, count,
       round(count::numeric / {jobs}, 2) AS per_job,
       round(record_size::numeric / {jobs}) AS bytes_per_job,
       round(fpi_size::numeric / {jobs}) AS fpi_bytes_per_job
FROM pg_get_wal_stats(:'l0', pg_current_wal_lsn(), true) WHERE count > 0 ORDER BY record_size DESC;
SELECT round(sum(record_size)::numeric / {jobs}) AS record_bytes_per_job
FROM pg_get_wal_stats(:'l0', pg_current_wal_lsn(), false);
SELECT n_tup_upd - :u0 AS updates, n_tup_hot_upd - :h0 AS hot_updates
FROM pg_stat_user_tables WHERE relname = 'delivery_state';""")
PY

run() {
  echo "== $1"
  psql "$db_url" -q -v ON_ERROR_STOP=1 -f "$tmp/seed.sql" >/dev/null
  psql "$db_url" -q -v ON_ERROR_STOP=1 -f "$tmp/work.sql" | grep -v '^ *$'
}
echo "wal-breakdown: $JOBS jobs; $(psql "$db_url" -tAc 'SHOW server_version'); full_page_writes=$(psql "$db_url" -tAc 'SHOW full_page_writes'); load $(cut -d' ' -f1 /proc/loadavg)"
run "shipped schema"
