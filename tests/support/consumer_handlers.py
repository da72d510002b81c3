"""Handlers run by ``cdc-outbox consume --handler tests.support.consumer_handlers:<name>``."""

from __future__ import annotations

from typing import Any

import psycopg

from cdc_outbox.consumer import Event


def count(conn: psycopg.Connection[Any], event: Event) -> None:
    """Record the application (a side effect in the consumer's transaction)."""
    conn.execute(
        "INSERT INTO applied (event_id, aggregate_id, n) VALUES (%s, %s, %s)",
        (event.event_id, event.aggregate_id, event.payload["n"]),
    )


def count_but_fail_poison(conn: psycopg.Connection[Any], event: Event) -> None:
    """Like :func:`count`, but an event with ``"poison": true`` always fails."""
    if event.payload.get("poison"):
        raise RuntimeError(f"cannot apply poison event n={event.payload['n']}")
    count(conn, event)


def noop(conn: psycopg.Connection[Any], event: Event) -> None:
    """Does nothing (throughput baseline)."""


def count_but_exit(conn: psycopg.Connection[Any], event: Event) -> None:
    """Like :func:`count`, but an event with ``"exit": true`` raises ``SystemExit(0)`` (what
    ``sys.exit()`` in a handler does)."""
    if event.payload.get("exit"):
        raise SystemExit(0)
    count(conn, event)
