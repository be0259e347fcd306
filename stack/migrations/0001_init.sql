-- The reference stack's queue. Nothing here is ever deleted by the stack: deliveries keep their
-- rendered payload and delivery_events is an append-only audit of every state change.

CREATE TABLE batches (
    id               text PRIMARY KEY,
    template_id      text NOT NULL,
    template_version integer NOT NULL,
    deliveries       integer NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE deliveries (
    id                  bigserial PRIMARY KEY,
    batch_id            text NOT NULL REFERENCES batches (id),
    key                 text NOT NULL UNIQUE,          -- batch:recipient:channel
    recipient           text NOT NULL,
    channel             text NOT NULL CHECK (channel IN ('line', 'email', 'sms')),
    address             text NOT NULL,
    template_version    integer NOT NULL,
    payload             jsonb NOT NULL,                -- rendered once at enqueue
    payload_sha256      text NOT NULL,
    correlation_id      text NOT NULL,                 -- LINE retry key / e-mail Message-ID / SMS key
    state               text NOT NULL DEFAULT 'pending' CHECK (state IN
                          ('pending', 'sending', 'retryable', 'submitted', 'delivered',
                           'permanent_failure', 'failed', 'unknown')),
    attempts            integer NOT NULL DEFAULT 0,
    next_attempt_at     timestamptz NOT NULL DEFAULT now(),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    lease_owner         text,
    lease_token         bigint NOT NULL DEFAULT 0,
    lease_expires_at    timestamptz,
    attempt_started_at  timestamptz,                   -- start of the latest attempt
    attempt_lease_token bigint,                        -- lease_token under which it started
    submitted_at        timestamptz,
    next_poll_at        timestamptz,
    provider_message_id text,
    last_error_class    text,
    last_error          text
);

-- The claim: ready rows in due order. Partial, so finished rows cost nothing.
CREATE INDEX deliveries_ready ON deliveries (next_attempt_at) WHERE state IN ('pending', 'retryable');
-- The rescuer: expired leases.
CREATE INDEX deliveries_leased ON deliveries (lease_expires_at) WHERE state = 'sending';
-- The SMS poller and the e-mail unknown horizon.
CREATE INDEX deliveries_submitted ON deliveries (next_poll_at) WHERE state = 'submitted';
CREATE INDEX deliveries_unknown ON deliveries (updated_at) WHERE state = 'unknown';
CREATE INDEX deliveries_batch ON deliveries (batch_id, id);
CREATE INDEX deliveries_provider_id ON deliveries (provider_message_id) WHERE provider_message_id IS NOT NULL;
CREATE UNIQUE INDEX deliveries_correlation ON deliveries (correlation_id);

CREATE TABLE delivery_events (
    id          bigserial PRIMARY KEY,
    delivery_id bigint NOT NULL REFERENCES deliveries (id),
    from_state  text NOT NULL,
    to_state    text NOT NULL,
    source      text NOT NULL CHECK (source IN ('worker', 'callback', 'poll', 'rescuer', 'api')),
    detail      text,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX delivery_events_delivery ON delivery_events (delivery_id, id);

CREATE TABLE workers (
    id           text PRIMARY KEY,
    pid          integer NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    stopped_at   timestamptz
);

-- Callback idempotency tokens already applied (SMS I-Twilio-Idempotency-Token, e-mail event id).
CREATE TABLE callback_receipts (
    provider    text NOT NULL,
    token       text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, token)
);
