-- The trigger that moves a row's latest transition into `delivery_events` runs after the row is
-- written, not before (issue 14 item 5). PostgreSQL locks every row a BEFORE ROW UPDATE trigger
-- could see before it evaluates the trigger's WHEN, so the trigger of 0007 cost every update of
-- `delivery_state` one more row lock and one more WAL record (a heap LOCK, ~55 bytes), whether it
-- fired or not: the attempt start, the e-mail body mark, each heartbeat's renewal, every outcome
-- (56 of the claim benchmark's 778 bytes of WAL a job, all in the completion). An AFTER ROW
-- trigger locks nothing; one whose WHEN fails is not even queued.
--
-- What it moves is unchanged: when an update replaces a row's latest transition or changes its
-- state, the transition it supersedes becomes history, with the state it led to, in the same
-- statement. A change of state that writes no transition of its own (only the flaws that bypass
-- the state machine do that) still has its stale head cleared, now by the trigger's own update
-- of the row, which changes no state and sets no head, and so does not fire it again. The one
-- case the new WHEN leaves out, a head cleared with no change of state, is no writer's: a claim
-- clears the head as it moves the row to `sending`.

DROP TRIGGER delivery_head_to_history ON delivery_state;

CREATE OR REPLACE FUNCTION delivery_head_to_history() RETURNS trigger LANGUAGE plpgsql AS $$
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
        UPDATE delivery_state
        SET head_from = NULL, head_source = NULL, head_detail = NULL,
            head_outcome_class = NULL, head_at = NULL, head_claimed_by = NULL
        WHERE id = NEW.id;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER delivery_head_to_history AFTER UPDATE ON delivery_state FOR EACH ROW
    WHEN (OLD.head_source IS NOT NULL
          AND (NEW.state IS DISTINCT FROM OLD.state
               OR (NEW.head_source IS NOT NULL AND NEW.head_at IS DISTINCT FROM OLD.head_at)))
    EXECUTE FUNCTION delivery_head_to_history();
