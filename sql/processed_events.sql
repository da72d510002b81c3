-- cdc-outbox: consumer-side de-duplication (used by cdc_outbox.consumer; docs/consumers.md).
-- Delivery is at-least-once, so a consumer may see an event twice. A consumer that writes
-- to PostgreSQL inserts (consumer_name, event_id) in the same transaction as its own
-- changes, and skips the event when the row already exists:
--
--   INSERT INTO processed_events (consumer_name, event_id) VALUES ($1, $2)
--   ON CONFLICT DO NOTHING;          -- 0 rows affected => already processed, skip
--
-- This table lives in the consumer's database; `cdc-outbox init` does not create it
-- (`cdc-outbox consume` creates both tables if they are missing).

CREATE TABLE IF NOT EXISTS public.processed_events (
    consumer_name  text        NOT NULL,
    event_id       uuid        NOT NULL,              -- the outbox row's id
    processed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, event_id)
);

-- Keys whose event was dead-lettered by a consumer: later events of the same key on the same
-- topic are dead-lettered too ("blocked_by <event id>"), so per-key order never breaks
-- silently. Delete the row to release the key (after replaying its dead letters).
CREATE TABLE IF NOT EXISTS public.consumer_parked_keys (
    consumer_name  text        NOT NULL,
    topic          text        NOT NULL,
    key            text        NOT NULL,
    event_id       uuid,                              -- the event that parked the key
    reason         text        NOT NULL,
    parked_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, topic, key)
);
