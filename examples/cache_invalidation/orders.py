"""The order service's write side: the order row and its event change in one transaction."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from cdc_outbox.writer import write_event

#: The orders table; sql/example_write.sql creates the same one (a test compares them).
ORDERS_DDL = """
CREATE TABLE IF NOT EXISTS public.orders (
    id          text   PRIMARY KEY,
    customer    text   NOT NULL,
    status      text   NOT NULL,
    total_cents bigint NOT NULL,
    version     bigint NOT NULL DEFAULT 1
)
"""
COLUMNS = ("id", "customer", "status", "total_cents", "version")


def create_order(
    conn: psycopg.Connection[Any], order_id: str, customer: str, total_cents: int
) -> dict[str, Any]:
    """Insert an order and its ``OrderUpdated`` event; the caller commits."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            "INSERT INTO orders (id, customer, status, total_cents) VALUES (%s, %s, 'NEW', %s)"
            " RETURNING id, customer, status, total_cents, version",
            (order_id, customer, total_cents),
        )
        row = cur.fetchone()
    assert row is not None
    write_event(conn, "order", order_id, "OrderUpdated", row)
    return row


def update_order(
    conn: psycopg.Connection[Any],
    order_id: str,
    status: str | None = None,
    total_cents: int | None = None,
) -> dict[str, Any]:
    """Change an order (bumping its version) and write ``OrderUpdated`` with the new row."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            "UPDATE orders SET status = coalesce(%s, status),"
            " total_cents = coalesce(%s, total_cents), version = version + 1"
            " WHERE id = %s RETURNING id, customer, status, total_cents, version",
            (status, total_cents, order_id),
        )
        row = cur.fetchone()
    if row is None:
        raise KeyError(order_id)
    write_event(conn, "order", order_id, "OrderUpdated", row)
    return row


def load_order(conn: psycopg.Connection[Any], order_id: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            "SELECT id, customer, status, total_cents, version FROM orders WHERE id = %s",
            (order_id,),
        )
        return cur.fetchone()
