-- cdc-outbox: how an application writes an event (default preset).
-- The business change and the outbox row commit or roll back together: either both
-- exist and the event is published, or neither does. Nothing else is needed -- no
-- message-broker call inside the transaction.
--
-- The orders table is the one of examples/cache_invalidation (orders.py, ORDERS_DDL): this
-- script and that example work on the same database, in either order. The event is the one
-- create_order writes: OrderUpdated with the new row as its payload.

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
INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
SELECT 'order',                                         -- topic outbox.event.order
       new_order.id,                                    -- key: all events of one order in order
       'OrderUpdated',
       to_jsonb(new_order),                             -- the row: id, customer, status, ...
       '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'
FROM new_order;

COMMIT;
