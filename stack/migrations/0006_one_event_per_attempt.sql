-- One audit row per attempt instead of one per claim and one per outcome (issue 14 item 5: the
-- claim's own event row and its history index entry were ~185 of a job's ~1,000 bytes of WAL).
--
-- The claim records itself on the delivery's state row (`claimed_at`, `claimed_from`, beside the
-- lease it already writes); the statement that ends the attempt — the worker's outcome, a release,
-- a rescue, a callback that overtakes the worker — copies the claim onto the one event row it
-- appends (`claimed_at`, `claimed_from`, `claimed_by` = the lease owner). No transition is lost: an
-- attempt still in flight is on its state row, an ended one in its event row, and the
-- `delivery_transitions` view below gives back every transition, claims included, one row each,
-- in order. Event rows written before this migration have no `claimed_at` (their claims have rows
-- of their own), and a row claimed before it has none either, so nothing is counted twice.

ALTER TABLE delivery_state ADD COLUMN claimed_at timestamptz, ADD COLUMN claimed_from text;
ALTER TABLE delivery_events ADD COLUMN claimed_at timestamptz, ADD COLUMN claimed_from text,
                            ADD COLUMN claimed_by text;

-- Every transition of every delivery, as the contract's status API reports them: an attempt's
-- event row as two (its claim, then its outcome), every other event row as itself, and a claim
-- still in flight from the state row. Order a delivery's transitions by
-- (event_id NULLS LAST, part).
CREATE VIEW delivery_transitions AS
SELECT delivery_id, id AS event_id, 0 AS part, claimed_from AS from_state,
       'sending'::text AS to_state, 'worker'::text AS source, claimed_by AS detail,
       claimed_at AS at, NULL::text AS outcome_class
FROM delivery_events WHERE claimed_at IS NOT NULL
UNION ALL
SELECT delivery_id, id, 1, from_state, to_state, source, detail, at, outcome_class
FROM delivery_events
UNION ALL
SELECT id, NULL::bigint, 0, claimed_from, 'sending', 'worker', lease_owner, claimed_at, NULL
FROM delivery_state WHERE state = 'sending' AND claimed_at IS NOT NULL;

-- A delivery's history is found by its id and ordered by the event id after: a handful of rows
-- each, so the index need not carry `id` (8 bytes less in every entry and its WAL record).
DROP INDEX delivery_events_delivery;
CREATE INDEX delivery_events_delivery ON delivery_events (delivery_id);
