"""The writer's value rules: validating an event (see :mod:`cdc_outbox.writer`'s contract)
and encoding its payload and headers as JSON text (:func:`default_dumps`). Pure, no I/O."""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from cdc_outbox.writer.table import OutboxTable, OutboxWriteError

__all__ = ["AggregateId", "Dumps", "default_dumps", "validate"]

_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
_RESERVED_HEADERS = frozenset({"id", "event_type", "aggregate_type"})
_MAX_AGGREGATE_ID = 1000


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
