"""Write outbox events from application code, inside the caller's transaction.

Importing this package imports no relay code (only psycopg); SQLAlchemy is imported lazily by
:func:`write_event_sqlalchemy`.

Contract of :func:`write_event` / :func:`write_event_async` / :func:`write_event_sqlalchemy`:

* everything is validated before any SQL is sent: ``aggregate_type`` and ``event_type`` must
  be 1..200 characters of ``[A-Za-z0-9._-]`` (they end up in topic names and headers),
  ``aggregate_id`` a ``str``, ``int`` (not ``bool``) or ``uuid.UUID``, stored as text
  (decimal digits; the 36-character UUID form), non-empty, at most 1000 characters, without
  NUL; ``payload`` serialisable by ``dumps`` (``None`` is a NULL payload: a tombstone only
  with ``null_payload = "tombstone"``), ``headers`` a JSON object whose names are not
  reserved (``id``, ``event_type``, ``aggregate_type``, ``cdc_outbox.*``), ``event_id`` a
  UUID; a violation raises :class:`OutboxWriteError` (a ``ValueError``);
* ``dumps`` turns payload and headers into JSON text (``str`` or UTF-8 ``bytes``, e.g.
  ``orjson.dumps``); the default, :func:`default_dumps`, is compact ``json.dumps`` that also
  writes ``Decimal`` as a string of its exact digits, ``datetime``/``date``/``time`` in ISO
  8601, ``UUID`` as its string and an ``Enum`` as its value; NaN and infinities are refused.
  A ``TypeError``/``ValueError`` of ``dumps`` becomes an ``OutboxWriteError``; PostgreSQL
  checks that what a custom ``dumps`` returns is JSON;
* one ``INSERT`` on the caller's connection/cursor, no commit: the event becomes visible
  (and is relayed) if and only if the caller's transaction commits;
* the return value is the event id (``event_id`` if given, else a new ``uuid4``);
* with ``message_prefix`` (the relay's setting of that name) the event is not inserted but
  emitted as a *table-less event*: a transactional logical message,
  ``pg_logical_emit_message(true, prefix, content)`` (:data:`EMIT_SQL`), relayed if and only
  if the transaction commits; same validation and return value, nothing written to a table
  (``table`` then only decides whether headers are allowed), the current span's W3C trace
  context sent whenever there is one (docs/outboxes.md);
* when the table names a ``tracing_span_context`` column (unset by default), OpenTelemetry
  (``opentelemetry-api``, the ``otel`` extra) is installed and a span is current, its W3C
  trace context is stored there (:mod:`cdc_outbox.telemetry.tracing`); otherwise the column is left
  to its default.

Table and column names come from an :class:`OutboxTable` (default: ``public.outbox`` with the
``default`` column preset); build it from your relay settings with
``OutboxTable(schema, table, preset="debezium")`` or explicit column names.

The package by job: :mod:`~cdc_outbox.writer.table` (the table, its columns, the error),
:mod:`~cdc_outbox.writer.values` (validation and JSON encoding), and here the statements and
the write functions; everything public is importable from ``cdc_outbox.writer``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from cdc_outbox.telemetry.tracing import current_span_context
from cdc_outbox.writer.table import DEFAULT_TABLE, PRESETS, OutboxTable, OutboxWriteError
from cdc_outbox.writer.values import AggregateId, Dumps, default_dumps, validate

__all__ = [
    "EMIT_SQL",
    "PRESETS",
    "AggregateId",
    "Dumps",
    "OutboxTable",
    "OutboxWriteError",
    "default_dumps",
    "prepare_message",
    "write_event",
    "write_event_async",
    "write_event_sqlalchemy",
]


#: The table-less event (:mod:`cdc_outbox.cdc.message_events`): payload and headers go as the
#: text of their jsonb value, so the relay publishes the bytes a jsonb row column gives.
EMIT_SQL = sql.SQL(
    "SELECT pg_logical_emit_message(true, %s, CAST(jsonb_build_object('id', CAST(%s AS text),"
    " 'aggregate_type', CAST(%s AS text), 'aggregate_id', CAST(%s AS text),"
    " 'event_type', CAST(%s AS text), 'payload', CAST(CAST(%s AS jsonb) AS text),"
    " 'headers', CAST(CAST(%s AS jsonb) AS text),"
    " 'tracing_span_context', CAST(%s AS text)) AS text))"
)  # CAST, not ``::``: SQLAlchemy's ``text()`` reads ``:p_1::jsonb`` as no bind at all


def prepare(
    table: OutboxTable,
    aggregate_type: str,
    aggregate_id: AggregateId,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None,
    event_id: uuid.UUID | str | None,
    dumps: Dumps = default_dumps,
    message_prefix: str | None = None,
) -> tuple[sql.Composed, tuple[Any, ...], uuid.UUID]:
    """Validate one event; return the INSERT (with ``message_prefix``: the logical message),
    its parameters and the event id (no I/O)."""
    if message_prefix is not None:
        return prepare_message(
            table,
            message_prefix,
            aggregate_type,
            aggregate_id,
            event_type,
            payload,
            headers,
            event_id,
            dumps,
        )
    params, eid = validate(
        table, aggregate_type, aggregate_id, event_type, payload, headers, event_id, dumps
    )
    tracing = table.column("tracing_span_context") and current_span_context()
    if tracing:
        params.append(tracing)
    query = table.insert_sql(with_headers=bool(headers), with_tracing=bool(tracing))
    return query, tuple(params), eid


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
    event id (no I/O). ``prefix`` is the relay's ``message_prefix``: not empty, not under
    ``cdc_outbox.`` (the relay's own messages)."""
    if not isinstance(prefix, str) or not prefix or prefix.startswith("cdc_outbox."):
        raise OutboxWriteError(f"prefix {prefix!r}: not empty, not under 'cdc_outbox.'")
    params, eid = validate(
        table, aggregate_type, aggregate_id, event_type, payload, headers, event_id, dumps
    )
    if len(params) == 5:
        params.append(None)  # no headers
    params.append(current_span_context())
    return sql.Composed([EMIT_SQL]), (prefix, *params), eid


def write_event(
    conn_or_cursor: psycopg.Connection[Any] | psycopg.Cursor[Any],
    aggregate_type: str,
    aggregate_id: AggregateId,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    event_id: uuid.UUID | str | None = None,
    *,
    table: OutboxTable = DEFAULT_TABLE,
    dumps: Dumps = default_dumps,
    message_prefix: str | None = None,
) -> uuid.UUID:
    """Insert one event in the caller's (psycopg 3, sync) transaction (with ``message_prefix``:
    emit it as a table-less event); return its id."""
    query, params, eid = prepare(
        table,
        aggregate_type,
        aggregate_id,
        event_type,
        payload,
        headers,
        event_id,
        dumps,
        message_prefix,
    )
    conn_or_cursor.execute(query, params)
    return eid


async def write_event_async(
    conn_or_cursor: psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any],
    aggregate_type: str,
    aggregate_id: AggregateId,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    event_id: uuid.UUID | str | None = None,
    *,
    table: OutboxTable = DEFAULT_TABLE,
    dumps: Dumps = default_dumps,
    message_prefix: str | None = None,
) -> uuid.UUID:
    """:func:`write_event` for ``psycopg.AsyncConnection`` / ``AsyncCursor``."""
    query, params, eid = prepare(
        table,
        aggregate_type,
        aggregate_id,
        event_type,
        payload,
        headers,
        event_id,
        dumps,
        message_prefix,
    )
    await conn_or_cursor.execute(query, params)
    return eid


def write_event_sqlalchemy(
    conn_or_session: Any,
    aggregate_type: str,
    aggregate_id: AggregateId,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    event_id: uuid.UUID | str | None = None,
    *,
    table: OutboxTable = DEFAULT_TABLE,
    dumps: Dumps = default_dumps,
    message_prefix: str | None = None,
) -> uuid.UUID:
    """:func:`write_event` for an SQLAlchemy 2 ``Connection`` or ``Session`` (any driver for
    PostgreSQL); runs in its current transaction (begun if none). Needs ``sqlalchemy``."""
    query, params, eid = prepare(
        table,
        aggregate_type,
        aggregate_id,
        event_type,
        payload,
        headers,
        event_id,
        dumps,
        message_prefix,
    )
    execute_sqlalchemy(conn_or_session, query, params)
    return eid


def execute_sqlalchemy(conn_or_session: Any, query: sql.Composed, params: tuple[Any, ...]) -> None:
    from sqlalchemy import text

    binds = {f"p_{i}": v for i, v in enumerate(params)}
    rendered = query.as_string(None)
    for name in binds:  # psycopg placeholders -> SQLAlchemy named binds, in order
        rendered = rendered.replace("%s", f":{name}", 1)
    conn_or_session.execute(text(rendered), binds)
