"""Write outbox events as *table-less events*: transactional logical messages.

Contract of :func:`emit_event` / :func:`emit_event_async` / :func:`emit_event_sqlalchemy`: the
arguments are validated as by :func:`cdc_outbox.outbox.write_event` (same errors, same return
value, the caller's transaction, no commit), but instead of a row the event goes into the WAL
with ``pg_logical_emit_message(true, prefix, content)`` (:data:`EMIT_SQL`): relayed if and
only if the transaction commits, nothing is written to a table. ``prefix`` is the relay's
``message_prefix`` (not empty, not under ``cdc_outbox.``). The content is the JSON object of
:mod:`cdc_outbox.cdc.message_events`; the current span's W3C trace context goes with it
whenever there is one. ``table`` only decides whether headers are allowed (as for rows).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from cdc_outbox.outbox import (
    DEFAULT_TABLE,
    AggregateId,
    Dumps,
    OutboxTable,
    OutboxWriteError,
    default_dumps,
    execute_sqlalchemy,
    validate,
)
from cdc_outbox.tracing import current_span_context

__all__ = ["EMIT_SQL", "emit_event", "emit_event_async", "emit_event_sqlalchemy"]

#: The table-less event (:mod:`cdc_outbox.cdc.message_events`): payload and headers go as the
#: text of their jsonb value, so the relay publishes the bytes a jsonb row column gives.
EMIT_SQL = sql.SQL(
    "SELECT pg_logical_emit_message(true, %s, CAST(jsonb_build_object('id', CAST(%s AS text),"
    " 'aggregate_type', CAST(%s AS text), 'aggregate_id', CAST(%s AS text),"
    " 'event_type', CAST(%s AS text), 'payload', CAST(CAST(%s AS jsonb) AS text),"
    " 'headers', CAST(CAST(%s AS jsonb) AS text),"
    " 'tracing_span_context', CAST(%s AS text)) AS text))"
)  # CAST, not ``::``: SQLAlchemy's ``text()`` reads ``:p_1::jsonb`` as no bind at all


def prepare_message(
    table: OutboxTable,
    prefix: str,
    aggregate_type: str,
    aggregate_id: AggregateId,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None,
    event_id: uuid.UUID | str | None,
    dumps: Dumps = default_dumps,
) -> tuple[sql.Composed, tuple[Any, ...], uuid.UUID]:
    """Validate one event; return :data:`EMIT_SQL` as a statement, its parameters and the
    event id (no I/O). ``prefix`` is the relay's ``message_prefix``."""
    if not isinstance(prefix, str) or not prefix or prefix.startswith("cdc_outbox."):
        raise OutboxWriteError(f"prefix {prefix!r}: not empty, not under 'cdc_outbox.'")
    params, eid = validate(
        table, aggregate_type, aggregate_id, event_type, payload, headers, event_id, dumps
    )
    if len(params) == 5:
        params.append(None)
    params.append(current_span_context())
    return sql.Composed([EMIT_SQL]), (prefix, *params), eid


def emit_event(
    conn_or_cursor: psycopg.Connection[Any] | psycopg.Cursor[Any],
    aggregate_type: str,
    aggregate_id: AggregateId,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    event_id: uuid.UUID | str | None = None,
    *,
    prefix: str,
    table: OutboxTable = DEFAULT_TABLE,
    dumps: Dumps = default_dumps,
) -> uuid.UUID:
    """:func:`write_event` as a table-less event: a transactional logical message with
    ``prefix`` (the relay's ``message_prefix``) instead of a row; return its id."""
    query, params, eid = prepare_message(
        table, prefix, aggregate_type, aggregate_id, event_type, payload, headers, event_id, dumps
    )
    conn_or_cursor.execute(query, params)
    return eid


async def emit_event_async(
    conn_or_cursor: psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any],
    aggregate_type: str,
    aggregate_id: AggregateId,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    event_id: uuid.UUID | str | None = None,
    *,
    prefix: str,
    table: OutboxTable = DEFAULT_TABLE,
    dumps: Dumps = default_dumps,
) -> uuid.UUID:
    """:func:`emit_event` for ``psycopg.AsyncConnection`` / ``AsyncCursor``."""
    query, params, eid = prepare_message(
        table, prefix, aggregate_type, aggregate_id, event_type, payload, headers, event_id, dumps
    )
    await conn_or_cursor.execute(query, params)
    return eid


def emit_event_sqlalchemy(
    conn_or_session: Any,
    aggregate_type: str,
    aggregate_id: AggregateId,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    event_id: uuid.UUID | str | None = None,
    *,
    prefix: str,
    table: OutboxTable = DEFAULT_TABLE,
    dumps: Dumps = default_dumps,
) -> uuid.UUID:
    """:func:`emit_event` for an SQLAlchemy 2 ``Connection`` or ``Session``."""
    query, params, eid = prepare_message(
        table, prefix, aggregate_type, aggregate_id, event_type, payload, headers, event_id, dumps
    )
    execute_sqlalchemy(conn_or_session, query, params)
    return eid
