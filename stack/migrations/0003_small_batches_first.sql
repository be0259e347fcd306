-- Small batches (transactional orders) are claimed before large ones (campaigns): a customer's
-- order confirmation must not wait for a 5,000-recipient newsletter to drain. `priority` is set
-- once at enqueue (0 for a batch of at most `SMALL_BATCH` recipients, 1 otherwise) and the claim
-- takes ready rows in (priority, due time) order.
ALTER TABLE deliveries ADD COLUMN priority smallint NOT NULL DEFAULT 1;

DROP INDEX deliveries_ready;
CREATE INDEX deliveries_ready ON deliveries (priority, next_attempt_at)
    WHERE state IN ('pending', 'retryable');
