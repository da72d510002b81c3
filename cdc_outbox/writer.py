"""Write outbox events from application code, inside the caller's transaction.

Importing this module imports no relay code (only psycopg); SQLAlchemy is imported lazily by
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
"""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import psycopg
from psycopg import sql

from cdc_outbox.names import IDENT_RE
from cdc_outbox.telemetry.tracing import current_span_context

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

#: Column names per preset; equal to ``cdc_outbox.config.models.COLUMN_PRESETS`` (a unit test
#: checks it) but kept here so that writing events does not import the relay.
PRESETS: dict[str, dict[str, str | None]] = {
    "default": {
        "id": "id",
        "aggregate_type": "aggregate_type",
        "aggregate_id": "aggregate_id",
        "event_type": "event_type",
        "payload": "payload",
        "headers": "headers",
        "tracing_span_context": None,
    },
    "debezium": {
        "id": "id",
        "aggregate_type": "aggregatetype",
        "aggregate_id": "aggregateid",
        "event_type": "type",
        "payload": "payload",
        "headers": None,
        "tracing_span_context": None,
    },
}
_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
_RESERVED_HEADERS = frozenset({"id", "event_type", "aggregate_type"})
_MAX_AGGREGATE_ID = 1000


class OutboxWriteError(ValueError):
    """The event cannot be written (raised before any SQL is sent)."""


@dataclass(frozen=True, slots=True)
class OutboxTable:
    """Where events go: ``schema.table`` and its column names (a preset plus overrides)."""

    schema: str = "public"
    table: str = "outbox"
    preset: str = "default"
    columns: Mapping[str, str | None] = field(default_factory=dict)

    def column(self, name: str) -> str | None:
        """The column for logical column ``name`` (``headers`` and ``tracing_span_context`` may
        be None: no such column)."""
        if self.preset not in PRESETS:
            raise OutboxWriteError(f"unknown column preset {self.preset!r}")
        return self.columns.get(name, PRESETS[self.preset][name])

    def insert_sql(self, with_headers: bool, with_tracing: bool = False) -> sql.Composed:
        """``INSERT INTO schema.table (id, aggregate_type, ...) VALUES (%s, ...)``."""
        names = ["id", "aggregate_type", "aggregate_id", "event_type", "payload"]
        if with_headers:
            names.append("headers")
        if with_tracing:
            names.append("tracing_span_context")
        for name in [self.schema, self.table, *(self.column(n) or "" for n in names)]:
            if not IDENT_RE.fullmatch(name):
                raise OutboxWriteError(f"{name!r} is not a valid SQL identifier")
        cols = [sql.Identifier(self.column(n) or "") for n in names]
        return sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            sql.Identifier(self.schema, self.table),
            sql.SQL(", ").join(cols),
            sql.SQL(", ").join(sql.Placeholder() * len(cols)),
        )


DEFAULT_TABLE = OutboxTable()


#: What ``dumps`` may be: any callable from a value to JSON text.
Dumps: TypeAlias = Callable[[Any], str | bytes]
#: The aggregate id types the writer accepts (stored as text).
AggregateId: TypeAlias = str | int | uuid.UUID


def _encode_extra(value: Any) -> Any:
    """``default=`` hook of :func:`default_dumps`: the types ``json`` does not know."""
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise ValueError(f"Decimal {value} is not a finite number")
        return str(value)
    if isinstance(value, datetime.date | datetime.time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_ENCODER = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_encode_extra
)


def default_dumps(value: Any) -> str:
    """Compact JSON of ``value``; also Decimal (string), date/time (ISO 8601), UUID, Enum."""
    return _ENCODER.encode(value)


def _json_text(what: str, value: Any, dumps: Dumps) -> str:
    try:
        text = dumps(value)
        text = text.decode() if isinstance(text, bytes) else text
    except (TypeError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise OutboxWriteError(f"{what} is not JSON-serialisable: {exc}") from None
    if not isinstance(text, str):
        raise OutboxWriteError(f"dumps returned {type(text).__name__}, not str or bytes")
    return text


def _aggregate_id_text(aggregate_id: Any) -> str:
    """The stored text of an aggregate id (see the module contract)."""
    if isinstance(aggregate_id, str):
        text = str.__str__(aggregate_id)  # a StrEnum member: its value
    elif isinstance(aggregate_id, int) and not isinstance(aggregate_id, bool):
        text = int.__repr__(aggregate_id)  # an IntEnum member: its digits
    elif isinstance(aggregate_id, uuid.UUID):
        text = str(aggregate_id)
    else:
        raise OutboxWriteError(
            f"aggregate_id must be a str, int or UUID; got {type(aggregate_id).__name__}"
        )
    if not text.strip():
        raise OutboxWriteError(f"aggregate_id must be a non-empty string; got {aggregate_id!r}")
    if len(text) > _MAX_AGGREGATE_ID or "\x00" in text:
        raise OutboxWriteError("aggregate_id must be at most 1000 characters, without NUL")
    return text


def validate(
    table: OutboxTable,
    aggregate_type: str,
    aggregate_id: AggregateId,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None,
    event_id: uuid.UUID | str | None,
    dumps: Dumps,
) -> tuple[list[Any], uuid.UUID]:
    """The event's text parameters (id, types, aggregate id, payload, then the headers if
    any) and its id; raises :class:`OutboxWriteError` (see the module contract)."""
    for what, name in (("aggregate_type", aggregate_type), ("event_type", event_type)):
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise OutboxWriteError(
                f"{what} must be 1..200 characters of letters, digits, '.', '_' or '-';"
                f" got {name!r}"
            )
    aggregate_text = _aggregate_id_text(aggregate_id)
    if event_id is None:
        eid = uuid.uuid4()
    elif isinstance(event_id, uuid.UUID):
        eid = event_id
    else:
        try:
            eid = uuid.UUID(str(event_id))
        except ValueError:
            raise OutboxWriteError(f"event_id {event_id!r} is not a UUID") from None
    payload_text = None if payload is None else _json_text("payload", payload, dumps)
    # Text parameters (psycopg sends str untyped): the server casts them to the column types.
    params: list[Any] = [str(eid), aggregate_type, aggregate_text, event_type, payload_text]
    if headers:
        if not isinstance(headers, Mapping) or not all(isinstance(k, str) for k in headers):
            raise OutboxWriteError("headers must be a mapping with string keys")
        bad = [k for k in headers if k in _RESERVED_HEADERS or k.startswith("cdc_outbox.")]
        if bad:
            raise OutboxWriteError(f"header name(s) {', '.join(map(repr, bad))} are reserved")
        if table.column("headers") is None:
            raise OutboxWriteError("this outbox table has no headers column")
        params.append(_json_text("headers", dict(headers), dumps))
    return params, eid


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
