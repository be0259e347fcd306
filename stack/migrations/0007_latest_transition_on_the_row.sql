-- A delivery's latest transition lives on its state row; `delivery_events` holds the ones before
-- it (issue 14 item 5: an ended job's event row and its history index entry were ~190 of its
-- ~900 bytes of WAL, and most deliveries never change again after their last attempt).
--
-- This is the shape of a system-versioned table: the current version in the table, superseded
-- versions in a history table. Every change of state writes its own transition onto the row
-- (`head_*`: from which state, who, why, when, the attempt's outcome class, and for an attempt
-- the lease owner that claimed it), in the statement that makes the change; the trigger below
-- moves the one it replaces into `delivery_events` in that same statement. A claim clears it
-- (moving it), so while a row is `sending` its head is empty and the claim in flight is on the
-- row (`claimed_at`, `claimed_from`, since 0006). Nothing is lost and nothing is written twice: every transition is
-- durable when its statement commits, in exactly one place, and `delivery_transitions` reads all
-- of them back in order.

ALTER TABLE delivery_state
    ADD COLUMN head_from text,
    ADD COLUMN head_source text,
    ADD COLUMN head_detail text,
    ADD COLUMN head_outcome_class text,
    ADD COLUMN head_at timestamptz,
    ADD COLUMN head_claimed_by text;

-- The one writer of `delivery_events`: whenever an update replaces or clears a row's head, or
-- changes its state without writing a transition of its own (nothing in the state machine does;
-- the flaws that bypass it on purpose do), the head it supersedes becomes history in the same
-- statement, with the state it led to; in the second case the head is cleared, so it is never
-- moved twice nor read with a state it did not lead to. Writers only ever set the new head (a
-- change of state) or clear it (a claim); none can overwrite a transition unrecorded.
CREATE FUNCTION delivery_head_to_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO delivery_events
        (delivery_id, from_state, to_state, source, detail, at, channel, outcome_class,
         claimed_at, claimed_from, claimed_by)
    VALUES
        (OLD.id, OLD.head_from, OLD.state, OLD.head_source, OLD.head_detail, OLD.head_at,
         (SELECT channel FROM delivery_items WHERE id = OLD.id), OLD.head_outcome_class,
         CASE WHEN OLD.head_from = 'sending' THEN OLD.claimed_at END,
         CASE WHEN OLD.head_from = 'sending' THEN OLD.claimed_from END,
         CASE WHEN OLD.head_from = 'sending' AND OLD.claimed_at IS NOT NULL
              THEN OLD.head_claimed_by END);
    IF NEW.head_at IS NOT DISTINCT FROM OLD.head_at THEN
        NEW.head_from := NULL;
        NEW.head_source := NULL;
        NEW.head_detail := NULL;
        NEW.head_outcome_class := NULL;
        NEW.head_at := NULL;
        NEW.head_claimed_by := NULL;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER delivery_head_to_history BEFORE UPDATE ON delivery_state FOR EACH ROW
    WHEN (OLD.head_source IS NOT NULL AND (NEW.head_at IS DISTINCT FROM OLD.head_at
                                          OR NEW.state IS DISTINCT FROM OLD.state))
    EXECUTE FUNCTION delivery_head_to_history();

-- Every transition of every delivery, one row each, as the contract's status API reports them.
-- Order a delivery's transitions by (event_id NULLS LAST, part): the history first (an event row
-- that ended an attempt gives its claim, then its outcome), then the row's own (its head: the
-- claim of the attempt it ended, then the head; or the claim in flight).
CREATE OR REPLACE VIEW delivery_transitions AS
SELECT delivery_id, id AS event_id, 0 AS part, claimed_from AS from_state,
       'sending'::text AS to_state, 'worker'::text AS source, claimed_by AS detail,
       claimed_at AS at, NULL::text AS outcome_class
FROM delivery_events WHERE claimed_at IS NOT NULL
UNION ALL
SELECT delivery_id, id, 1, from_state, to_state, source, detail, at, outcome_class
FROM delivery_events
UNION ALL
SELECT id, NULL::bigint, 0, claimed_from, 'sending', 'worker',
       CASE WHEN state = 'sending' THEN lease_owner ELSE head_claimed_by END, claimed_at, NULL
FROM delivery_state
WHERE claimed_at IS NOT NULL AND (state = 'sending' OR head_from = 'sending')
UNION ALL
SELECT id, NULL::bigint, 1, head_from, state, head_source, head_detail, head_at,
       head_outcome_class
FROM delivery_state WHERE head_source IS NOT NULL;
