-- Attempt outcome classes on the audit trail (counted by /metrics), and the start of the earliest
-- attempt whose outcome is still unknown (the SMS lookup window). Both columns are nullable and
-- written in the same statement as the transition they belong to.

-- Start of the earliest attempt that may have reached the provider without an answer: set when an
-- attempt ends `ambiguous` (kept if already set), cleared by any other recorded error class.
ALTER TABLE deliveries ADD COLUMN uncertain_since timestamptz;

-- The delivery's channel and, on an edge leaving `sending` (one per attempt), the class of the
-- attempt's outcome: accepted, transient, ambiguous or permanent.
ALTER TABLE delivery_events ADD COLUMN channel text, ADD COLUMN outcome_class text;

-- /metrics: attempts by channel and class, and lease expirations, without a scan of every event.
CREATE INDEX delivery_events_outcomes ON delivery_events (channel, outcome_class)
    WHERE outcome_class IS NOT NULL;
CREATE INDEX delivery_events_rescues ON delivery_events (id)
    WHERE source = 'rescuer' AND from_state = 'sending';
