-- cdc-outbox: how an application writes a *table-less* event (message_prefix = 'app.outbox').
-- The event goes into the WAL as a transactional logical message, inside the business
-- transaction: it is relayed if and only if the transaction commits, and nothing is written
-- to (or later marked, vacuumed or deleted from) a table. The relay maps it to the same Kafka
-- record an outbox row with these values gives (docs/outboxes.md).
--
-- The content is one JSON object; payload and headers are the *text* of their jsonb values
-- (::jsonb::text), so the Kafka value is byte-identical to a jsonb payload column's. The
-- first argument must be true: a non-transactional message cannot be tied to a commit and is
-- dead-lettered, never published.

CREATE TABLE IF NOT EXISTS public.orders (
    id          text   PRIMARY KEY,
    customer    text   NOT NULL,
    status      text   NOT NULL,
    total_cents bigint NOT NULL,
    version     bigint NOT NULL DEFAULT 1
);

BEGIN;

WITH new_order AS (
    INSERT INTO public.orders (id, customer, status, total_cents)
    VALUES ('o-' || gen_random_uuid(), 'c-42', 'NEW', 1999)
    RETURNING id, customer, status, total_cents, version
)
SELECT pg_logical_emit_message(
           true,                                        -- transactional: required
           'app.outbox',                                -- the relay's message_prefix
           jsonb_build_object(
               'id', gen_random_uuid()::text,
               'aggregate_type', 'order',               -- topic outbox.event.order
               'aggregate_id', new_order.id,            -- key: all events of one order in order
               'event_type', 'OrderUpdated',
               'payload', to_jsonb(new_order)::text,    -- the row, as jsonb text
               'headers', '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'::jsonb::text
           )::text)
FROM new_order;

COMMIT;
