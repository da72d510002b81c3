-- cdc-outbox: how an application writes an event (default preset).
-- The business change and the outbox row commit or roll back together: either both
-- exist and the event is published, or neither does. Nothing else is needed -- no
-- message-broker call inside the transaction.

CREATE TABLE IF NOT EXISTS public.orders (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id text    NOT NULL,
    total_cents bigint  NOT NULL
);

BEGIN;

WITH new_order AS (
    INSERT INTO public.orders (customer_id, total_cents)
    VALUES ('c-42', 1999)
    RETURNING id, customer_id, total_cents
)
INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
SELECT 'order',                                         -- topic outbox.event.order
       new_order.id::text,                              -- key: all events of one order in order
       'OrderCreated',
       jsonb_build_object('orderId', new_order.id,
                          'customerId', new_order.customer_id,
                          'totalCents', new_order.total_cents),
       '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'
FROM new_order;

COMMIT;
