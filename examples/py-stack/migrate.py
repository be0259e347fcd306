"""`migrate`: creates the schema (idempotent) and exits 0."""
from common import connect, flaw

SCHEMA = """
CREATE TABLE IF NOT EXISTS py_batches (
    batch_id    text PRIMARY KEY,
    deliveries  integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE SEQUENCE IF NOT EXISTS py_lease_token;
CREATE TABLE IF NOT EXISTS py_deliveries (
    id                  bigserial PRIMARY KEY,
    key                 text NOT NULL UNIQUE,
    batch_id            text NOT NULL REFERENCES py_batches,
    recipient           text NOT NULL,
    channel             text NOT NULL CHECK (channel IN ('line', 'email', 'sms')),
    address             text NOT NULL,
    prio                smallint NOT NULL,
    subject             text,
    body_text           text NOT NULL,
    body_html           text,
    payload_sha256      text NOT NULL,
    retry_key           uuid NOT NULL,
    message_id          text NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    state               text NOT NULL DEFAULT 'pending',
    attempts            integer NOT NULL DEFAULT 0,
    next_at             timestamptz NOT NULL DEFAULT now(),
    lease_owner         text,
    lease_token         bigint,
    lease_until         timestamptz,
    inflight            boolean NOT NULL DEFAULT false,
    first_sent_at       timestamptz,
    provider_message_id text,
    last_error          text
);
CREATE INDEX IF NOT EXISTS py_deliveries_due ON py_deliveries (prio, next_at, id)
    WHERE state IN ('pending', 'retryable');
CREATE INDEX IF NOT EXISTS py_deliveries_leased ON py_deliveries (lease_until)
    WHERE state = 'sending';
CREATE INDEX IF NOT EXISTS py_deliveries_batch ON py_deliveries (batch_id);
CREATE INDEX IF NOT EXISTS py_deliveries_pmid ON py_deliveries (provider_message_id);
CREATE INDEX IF NOT EXISTS py_deliveries_msgid ON py_deliveries (message_id);
CREATE INDEX IF NOT EXISTS py_deliveries_sms_twins ON py_deliveries (address) WHERE channel = 'sms';
CREATE TABLE IF NOT EXISTS py_transitions (
    id          bigserial PRIMARY KEY,
    delivery_id bigint NOT NULL REFERENCES py_deliveries,
    from_state  text NOT NULL,
    to_state    text NOT NULL,
    source      text NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    detail      text
);
-- Delivery reports that arrived while their row was still `sending` (the worker had not recorded
-- the provider's answer yet): kept, acknowledged, and applied by the worker when it records it.
CREATE TABLE IF NOT EXISTS py_early_reports (
    id          bigserial PRIMARY KEY,
    delivery_id bigint NOT NULL REFERENCES py_deliveries,
    pmid        text NOT NULL,
    to_state    text NOT NULL,
    detail      text
);
CREATE INDEX IF NOT EXISTS py_early_reports_delivery ON py_early_reports (delivery_id);
CREATE INDEX IF NOT EXISTS py_transitions_delivery ON py_transitions (delivery_id, id);
"""

# flaw(batch-no-dedup): the deliveries table has no unique key.
NO_UNIQUE_KEY = "ALTER TABLE py_deliveries DROP CONSTRAINT IF EXISTS py_deliveries_key_key"
# flaw(template-by-id): templates kept by id (the latest POST wins), rows keep their context.
TEMPLATES_BY_ID = """
CREATE TABLE IF NOT EXISTS py_templates (id text PRIMARY KEY, body jsonb NOT NULL);
ALTER TABLE py_deliveries ADD COLUMN IF NOT EXISTS template_id text;
ALTER TABLE py_deliveries ADD COLUMN IF NOT EXISTS context jsonb;
"""

if __name__ == "__main__":
    with connect() as conn:
        conn.execute(SCHEMA)
        if flaw("batch-no-dedup"):
            conn.execute(NO_UNIQUE_KEY)
        if flaw("template-by-id"):
            conn.execute(TEMPLATES_BY_ID)
    print("py-stack: schema ready", flush=True)
