"""Sample order writer for docker/compose.yaml (and anyone trying the relay out).

Each transaction inserts an order and its ``OrderCreated`` outbox event, as
sql/example_write.sql does; every third one also marks an earlier order paid (``OrderPaid``,
same aggregate, so the key's events arrive in order). Connects with ``CDC_OUTBOX_DSN`` and
retries while the database is not there; writes every ``WRITER_INTERVAL_S`` seconds
(default 1) until SIGTERM, or ``WRITER_COUNT`` transactions when that is set (> 0).

Runs with nothing but psycopg: ``python docker/writer.py`` (the relay image has it).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

import psycopg

logger = logging.getLogger("writer")

CREATE_ORDERS = """
CREATE TABLE IF NOT EXISTS public.orders (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id text    NOT NULL,
    total_cents bigint  NOT NULL,
    paid        boolean NOT NULL DEFAULT false
)"""
NEW_ORDER = """
WITH new_order AS (
    INSERT INTO public.orders (customer_id, total_cents) VALUES (%(customer)s, %(total)s)
    RETURNING id, customer_id, total_cents
)
INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
SELECT 'order', new_order.id::text, 'OrderCreated',
       jsonb_build_object('orderId', new_order.id, 'customerId', new_order.customer_id,
                          'totalCents', new_order.total_cents),
       %(headers)s::jsonb
FROM new_order"""
PAY_ORDER = """
WITH paid AS (
    UPDATE public.orders SET paid = true
    WHERE id = (SELECT min(id) FROM public.orders WHERE NOT paid)
    RETURNING id
)
INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', paid.id::text, 'OrderPaid', jsonb_build_object('orderId', paid.id) FROM paid"""

_stop = False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _stop
    _stop = True


def connect(dsn: str) -> psycopg.Connection[Any]:
    """Connect, waiting (up to ~2 minutes) for the database and the outbox table."""
    for attempt in range(60):
        try:
            conn = psycopg.connect(dsn, autocommit=True, connect_timeout=5)
            conn.execute("SELECT 'public.outbox'::regclass")
            return conn
        except psycopg.Error as exc:
            if _stop or attempt == 59:
                raise
            logger.info("waiting for the database and the outbox table: %s", type(exc).__name__)
            time.sleep(2)
    raise AssertionError("unreachable")


def write(conn: psycopg.Connection[Any], n: int) -> None:
    """Transaction ``n``: a new order (and, every third, a payment) with its events."""
    with conn.transaction():
        conn.execute(
            NEW_ORDER,
            {
                "customer": f"c-{n % 17}",
                "total": 500 + (n * 37) % 9500,
                "headers": json.dumps({"source": "writer", "seq": str(n)}),
            },
        )
        if n % 3 == 2:
            conn.execute(PAY_ORDER)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s writer: %(message)s")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    dsn = os.environ["CDC_OUTBOX_DSN"]
    interval = float(os.environ.get("WRITER_INTERVAL_S", "1"))
    count = int(os.environ.get("WRITER_COUNT", "0"))
    conn = connect(dsn)
    conn.execute(CREATE_ORDERS)
    written = 0
    while not _stop and (count <= 0 or written < count):
        try:
            write(conn, written)
        except psycopg.OperationalError as exc:  # the database restarted: reconnect
            logger.warning("write failed (%s); reconnecting", type(exc).__name__)
            conn.close()
            conn = connect(dsn)
            continue
        written += 1
        if written % 50 == 0 or written == count:
            logger.info("%d transactions committed", written)
        deadline = time.monotonic() + interval
        while not _stop and time.monotonic() < deadline:
            time.sleep(min(0.2, interval))
    conn.close()
    logger.info("stopped after %d transactions", written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
