-- A delivery's mutable half moves to a narrow table of its own, so a claim, an attempt start and a
-- completion rewrite ~100 bytes instead of the whole row and add index entries only where the
-- claim and the rescuer need them (issue 14 item 5: 2,758 bytes of WAL per job before).
--
--   delivery_items  what the API accepted: recipient, address, rendered payload, keys. Never
--                   updated after enqueue; holds the unique and lookup indexes (key,
--                   correlation_id, batch).
--   delivery_state  one row per item, same id: state, lease, attempts, provider outcome. Only
--                   its primary key and partial indexes the claim, the rescuer, the SMS poller and
--                   the callbacks read; none of them keys on a column the attempt start, its undo
--                   or the e-mail body mark changes, so those updates stay HOT (fillfactor
--                   leaves room on the page). The claim and every state change are
--                   not HOT (`state` is in the partial indexes' predicates) but add only the
--                   primary key's entry and the new state's partial index entry.
--   deliveries      a view joining the two: the read model (status API, /metrics, rescuer
--                   scans). Writes go to the tables; the view is not updatable.
--
-- Column order matters: when an update's new version lands on the same page, PostgreSQL logs only
-- the bytes between the first and the last changed byte, so the columns the attempt start changes
-- (attempts, its start, its lease token, updated_at) sit together, followed by those the claim and
-- a completion change (updated_at, the lease, state, owner).

CREATE TABLE delivery_state (
    id                  bigint PRIMARY KEY REFERENCES deliveries (id),
    priority            smallint NOT NULL DEFAULT 1,
    next_attempt_at     timestamptz NOT NULL DEFAULT now(),
    body_lease_token    bigint,
    submitted_at        timestamptz,
    next_poll_at        timestamptz,
    uncertain_since     timestamptz,
    provider_message_id text,
    last_error_class    text,
    last_error          text,
    attempts            integer NOT NULL DEFAULT 0,
    attempt_started_at  timestamptz,
    attempt_lease_token bigint,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    lease_token         bigint NOT NULL DEFAULT 0,
    lease_expires_at    timestamptz,
    state               text NOT NULL DEFAULT 'pending' CHECK (state IN
                          ('pending', 'sending', 'retryable', 'submitted', 'delivered',
                           'permanent_failure', 'failed', 'unknown')),
    lease_owner         text
) WITH (fillfactor = 60);

INSERT INTO delivery_state
SELECT id, priority, next_attempt_at, body_lease_token, submitted_at, next_poll_at,
       uncertain_since, provider_message_id, last_error_class, last_error, attempts,
       attempt_started_at, attempt_lease_token, updated_at, lease_token, lease_expires_at, state,
       lease_owner
FROM deliveries;

DROP INDEX deliveries_ready, deliveries_leased, deliveries_submitted, deliveries_unknown,
           deliveries_provider_id;
ALTER TABLE deliveries
    DROP COLUMN priority, DROP COLUMN attempts, DROP COLUMN next_attempt_at,
    DROP COLUMN attempt_started_at, DROP COLUMN attempt_lease_token, DROP COLUMN body_lease_token,
    DROP COLUMN submitted_at, DROP COLUMN next_poll_at, DROP COLUMN uncertain_since,
    DROP COLUMN provider_message_id, DROP COLUMN last_error_class, DROP COLUMN last_error,
    DROP COLUMN lease_token, DROP COLUMN updated_at, DROP COLUMN lease_expires_at,
    DROP COLUMN state, DROP COLUMN lease_owner;
ALTER TABLE deliveries RENAME TO delivery_items;
ALTER INDEX deliveries_pkey RENAME TO delivery_items_pkey;
ALTER INDEX deliveries_key_key RENAME TO delivery_items_key_key;
ALTER INDEX deliveries_correlation RENAME TO delivery_items_correlation;
ALTER INDEX deliveries_batch RENAME TO delivery_items_batch;

-- The claim: ready rows in (priority, due) order.
CREATE INDEX delivery_state_ready ON delivery_state (priority, next_attempt_at)
    WHERE state IN ('pending', 'retryable');
-- The rescuer: expired leases.
CREATE INDEX delivery_state_leased ON delivery_state (lease_expires_at) WHERE state = 'sending';
-- The SMS poller.
CREATE INDEX delivery_state_submitted ON delivery_state (next_poll_at) WHERE state = 'submitted';
-- The e-mail unknown horizon: keyed on the id, not on `updated_at` (which the attempt start
-- changes), so the start stays HOT; the few unknown rows are filtered on their `updated_at`.
CREATE INDEX delivery_state_unknown ON delivery_state (id) WHERE state = 'unknown';
-- Callbacks and the SMS adoption find a delivery by its provider message id.
CREATE INDEX delivery_state_provider_id ON delivery_state (provider_message_id)
    WHERE provider_message_id IS NOT NULL;

CREATE VIEW deliveries AS
SELECT i.id, i.batch_id, i.key, i.recipient, i.channel, i.address, i.template_version, i.payload,
       i.payload_sha256, i.correlation_id, i.created_at,
       s.priority, s.state, s.attempts, s.next_attempt_at, s.updated_at, s.lease_owner,
       s.lease_token, s.lease_expires_at, s.attempt_started_at, s.attempt_lease_token,
       s.body_lease_token, s.submitted_at, s.next_poll_at, s.uncertain_since,
       s.provider_message_id, s.last_error_class, s.last_error
FROM delivery_items i JOIN delivery_state s ON s.id = i.id;

-- The audit trail stays append-only, one row per transition written by the statement that makes
-- it, but carries only the index its readers need (a delivery's history, in order): no primary
-- key (nothing looks an event up by id; `id` orders them), no foreign key (its check locked the
-- delivery row, one more WAL record per event; events are only ever written beside their
-- delivery's own update), no index on outcomes (/metrics counts them in one scan).
ALTER TABLE delivery_events DROP CONSTRAINT delivery_events_pkey,
    DROP CONSTRAINT delivery_events_delivery_id_fkey;
DROP INDEX delivery_events_outcomes;
