-- cdc-outbox: consumer-side de-duplication.
-- Delivery is at-least-once, so a consumer may see an event twice. A consumer that writes
-- to PostgreSQL inserts (consumer_name, event_id) in the same transaction as its own
-- changes, and skips the event when the row already exists:
--
--   INSERT INTO processed_events (consumer_name, event_id) VALUES ($1, $2)
--   ON CONFLICT DO NOTHING;          -- 0 rows affected => already processed, skip
--
-- This table lives in the consumer's database; `cdc-outbox init` does not create it.

CREATE TABLE IF NOT EXISTS public.processed_events (
    consumer_name  text        NOT NULL,
    event_id       uuid        NOT NULL,              -- the outbox row's id
    processed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, event_id)
);
