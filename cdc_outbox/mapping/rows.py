"""Map an inserted outbox row (pgoutput TupleData) to a Kafka record (pure, no I/O).

Contract of :meth:`OutboxMapper.map_insert`:

* topic = ``topic_template`` with ``{aggregate_type}`` / ``{event_type}`` filled in; it must be
  a legal Kafka topic name (``[A-Za-z0-9._-]``, 1..249 chars, not ``.`` or ``..``);
* key = the aggregate id bytes as stored; value = the payload bytes exactly as PostgreSQL sent
  them (for jsonb: its normalised text form), or ``None`` for a NULL payload when the mapper
  was built with ``tombstones=True`` (a Kafka tombstone: the key must still be present);
* headers = ``id``, ``event_type``, ``aggregate_type``, then one per configured
  ``header_columns`` entry (the column's text as PostgreSQL sends it, under its header name;
  omitted when the column is NULL), then every entry of the row's headers JSON object in
  order (string values as UTF-8, other values as compact JSON text);
* a NULL or unchanged-TOAST placeholder in id, aggregate_type, aggregate_id, event_type or
  payload (except a NULL payload with ``tombstones``), an illegal topic, invalid UTF-8 where
  text is needed, a headers value that is not a JSON object, or one using a reserved header
  name (``id``, ``event_type``, ``aggregate_type``, ``cdc_outbox.*``, a ``header_columns``
  name), or an unchanged-TOAST placeholder in a ``header_columns`` column gives a
  :class:`DeadLetter` (never a record with a null key, nor one with a null value without
  ``tombstones``) that keeps whatever key/value/headers are known. A NULL headers column
  means "no extra headers";
* with a ``tracing_span_context`` column configured, its W3C trace context becomes the
  ``traceparent`` (and ``tracestate``) headers after those (NULL or malformed: none, never a
  dead letter; :func:`cdc_outbox.telemetry.tracing.span_context_headers`).
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from cdc_outbox.config.columns import DEBEZIUM_COLUMNS, DEFAULT_COLUMNS, ColumnNames
from cdc_outbox.errors import ConfigError, DecodeError
from cdc_outbox.mapping.headers import parse_headers_json
from cdc_outbox.names import is_legal_topic
from cdc_outbox.pgwire.pgoutput import (
    UNCHANGED_TOAST,
    ColumnValue,
    Relation,
    RelationColumn,
    TupleData,
)
from cdc_outbox.records import DeadLetter, OutboxRecord
from cdc_outbox.telemetry.tracing import span_context_headers

__all__ = [
    "DEBEZIUM_COLUMNS",
    "DEFAULT_COLUMNS",
    "ColumnNames",
    "OutboxMapper",
    "is_legal_topic",
]


_PLACEHOLDERS = frozenset({"aggregate_type", "event_type"})
_TOPIC_CACHE_MAX = 4096


def _problem(name: str, value: ColumnValue) -> str:
    if value is None:
        return f"column {name!r} is null"
    if value is UNCHANGED_TOAST:
        return f"column {name!r} is an unchanged TOAST placeholder"
    return f"column {name!r} is not valid UTF-8"


class _Positions:
    """Indexes of the configured columns in one Relation (resolved once per Relation object)."""

    __slots__ = (
        "agg_id", "agg_type", "event_type", "extra", "headers", "id", "ncols", "payload", "plain",
        "rel", "tracing",
    )  # fmt: skip

    def __init__(self, rel: Relation, columns: ColumnNames) -> None:
        index = {c.name: i for i, c in enumerate(rel.columns)}

        def pos(name: str) -> int:
            try:
                return index[name]
            except KeyError:
                raise ConfigError(
                    f"outbox table {rel.namespace}.{rel.name} has no column {name!r}"
                    f" (columns: {', '.join(index)})"
                ) from None

        self.rel = rel
        self.ncols = len(rel.columns)
        self.id = pos(columns.id)
        self.agg_type = pos(columns.aggregate_type)
        self.agg_id = pos(columns.aggregate_id)
        self.event_type = pos(columns.event_type)
        self.payload = pos(columns.payload)
        self.headers = None if columns.headers is None else pos(columns.headers)
        tsc = columns.tracing_span_context
        self.tracing = None if tsc is None else pos(tsc)
        #: (header name, position, column) of each ``header_columns`` entry
        self.extra = tuple((h, pos(c), c) for h, c in columns.header_columns)
        #: no tracing and no header columns: the fast path of ``map_insert`` applies
        self.plain = self.tracing is None and not self.extra


class OutboxMapper:
    """Turns outbox-table inserts into :class:`OutboxRecord` or :class:`DeadLetter`.

    Raises :class:`ConfigError` for a template with unknown placeholders or a constant illegal
    topic (at construction) and for an outbox relation lacking a configured column (on first
    use of that Relation). Column positions are cached per relation OID and re-resolved when a
    new Relation object arrives for it (schema change). ``tombstones=True`` (setting
    ``null_payload = "tombstone"``) maps a NULL payload to a record with value ``None``.
    ``reserved_topics`` (the relay's own: dead letters, exactly-once checkpoints) are never a
    row's topic: such a row is a dead letter (a constant template naming one: ConfigError).
    """

    __slots__ = (
        "_cols",
        "_headers_name",
        "_positions",
        "_reserved",
        "_row_relation",
        "_taken",
        "_template",
        "_tombstones",
        "_topics",
        "_use_at",
        "_use_et",
        "schema",
        "table",
    )

    def __init__(
        self,
        schema: str,
        table: str,
        columns: ColumnNames,
        topic_template: str = "outbox.event.{aggregate_type}",
        *,
        tombstones: bool = False,
        reserved_topics: frozenset[str] = frozenset(),
    ) -> None:
        try:
            fields = list(string.Formatter().parse(topic_template))
        except ValueError as e:
            raise ConfigError(f"bad topic template {topic_template!r}: {e}") from None
        used = set()
        for _, name, spec, conv in fields:
            if name is None:
                continue
            if name not in _PLACEHOLDERS or spec or conv:
                raise ConfigError(
                    f"bad topic template {topic_template!r}: unknown placeholder {{{name}}}"
                    f" (allowed: {{aggregate_type}}, {{event_type}})"
                )
            used.add(name)
        if not used and not is_legal_topic(topic_template):
            raise ConfigError(f"topic template {topic_template!r} is not a legal topic name")
        if not used and topic_template in reserved_topics:
            raise ConfigError(f"topic template {topic_template!r} names a topic of the relay's own")
        self._reserved = reserved_topics
        self.schema = schema
        self.table = table
        self._cols = columns
        self._row_relation = Relation(
            0, schema, table, "d", tuple(RelationColumn(0, n, 0, -1) for n in self.row_columns)
        )
        self._headers_name = columns.headers or "headers"
        self._taken = frozenset(h for h, _ in columns.header_columns)  # checked by the settings
        self._template = topic_template
        self._tombstones = tombstones
        self._use_at = "aggregate_type" in used
        self._use_et = "event_type" in used
        self._positions: dict[int, _Positions] = {}
        self._topics: dict[tuple[bytes | None, bytes | None], tuple[str, bool]] = {}

    @property
    def row_columns(self) -> list[str]:
        """The columns :meth:`map_row` takes, in order (:meth:`ColumnNames.row_columns`)."""
        return self._cols.row_columns()

    def map_row(self, values: Sequence[str | None]) -> OutboxRecord | DeadLetter:
        """Map a row read by SQL as text (``row_columns`` order, ``::text`` casts), with the
        same rules as :meth:`map_insert`: used by polling and the snapshot catch-up."""
        row = tuple(None if v is None else v.encode() for v in values)
        return self.map_insert(self._row_relation, row)

    def is_outbox(self, rel: Relation) -> bool:
        """Whether ``rel`` is the configured outbox table (exact schema and name match)."""
        return rel.name == self.table and rel.namespace == self.schema

    def _topic(self, agg_type: bytes, event_type: bytes) -> tuple[str, bool]:
        """(topic, legal) for these values, cached; illegal topics carry the reason instead."""
        key = (agg_type if self._use_at else None, event_type if self._use_et else None)
        hit = self._topics.get(key)
        if hit is not None:
            return hit
        name = self._cols.aggregate_type
        try:
            at = agg_type.decode() if self._use_at else ""
            name = self._cols.event_type
            et = event_type.decode() if self._use_et else ""
        except UnicodeDecodeError:
            result = (f"column {name!r} is not valid UTF-8", False)
        else:
            topic = self._template.format(aggregate_type=at, event_type=et)
            if topic in self._reserved:
                result = (f"topic {topic!r} is reserved for the relay's own records", False)
            elif is_legal_topic(topic):
                result = (topic, True)
            else:
                why = f"invalid topic name {topic[:300]!r} (allowed: [A-Za-z0-9._-], 1..249 chars)"
                result = (why, False)
        if len(self._topics) >= _TOPIC_CACHE_MAX:
            self._topics.clear()
        self._topics[key] = result
        return result

    def map_insert(self, rel: Relation, row: TupleData) -> OutboxRecord | DeadLetter:
        """Map one inserted row of the outbox relation ``rel`` (see the module contract)."""
        pos = self._positions.get(rel.oid)
        if pos is None or pos.rel is not rel:
            pos = self._positions[rel.oid] = _Positions(rel, self._cols)
        if len(row) != pos.ncols:
            raise DecodeError(
                f"Insert: {len(row)} columns for relation {rel.name} with {pos.ncols} columns"
            )
        id_v = row[pos.id]
        at_v = row[pos.agg_type]
        key = row[pos.agg_id]
        et_v = row[pos.event_type]
        value = row[pos.payload]
        hv = None if pos.headers is None else row[pos.headers]
        if (
            type(id_v) is bytes
            and type(at_v) is bytes
            and type(et_v) is bytes
            and type(key) is bytes
            and type(value) is bytes
            and id_v.isascii()
            and pos.plain  # rows with tracing or header columns take the general path
        ):
            topic, ok = self._topic(at_v, et_v)
            if ok:
                if hv is None or hv == b"{}":  # the common case: no JSON parsing
                    headers = [("id", id_v), ("event_type", et_v), ("aggregate_type", at_v)]
                    return OutboxRecord(topic, key, value, headers, id_v.decode("ascii"))
                extra = (
                    parse_headers_json(self._headers_name, hv, self._taken)
                    if type(hv) is bytes
                    else None
                )
                if type(extra) is tuple:
                    headers = [("id", id_v), ("event_type", et_v), ("aggregate_type", at_v), *extra]
                    return OutboxRecord(topic, key, value, headers, id_v.decode("ascii"))
        record = self._slow(pos, row, id_v, at_v, key, et_v, value, hv)
        if pos.tracing is not None and type(trace := row[pos.tracing]) is bytes:
            record.headers.extend(span_context_headers(trace))
        return record

    def _slow(
        self,
        pos: _Positions,
        row: TupleData,
        id_v: ColumnValue,
        at_v: ColumnValue,
        key: ColumnValue,
        et_v: ColumnValue,
        value: ColumnValue,
        hv: ColumnValue,
    ) -> OutboxRecord | DeadLetter:
        cols = self._cols
        problems: list[str] = []
        headers: list[tuple[str, bytes]] = []
        event_id: str | None = None
        if type(id_v) is bytes:
            headers.append(("id", id_v))
            try:
                event_id = id_v.decode()
            except UnicodeDecodeError:
                problems.append(_problem(cols.id, id_v))
        else:
            problems.append(_problem(cols.id, id_v))
        for name, hname, v in (
            (cols.event_type, "event_type", et_v),
            (cols.aggregate_type, "aggregate_type", at_v),
        ):
            if type(v) is bytes:
                headers.append((hname, v))
            else:
                problems.append(_problem(name, v))
        for hname, i, name in pos.extra:
            v = row[i]
            if type(v) is bytes:
                headers.append((hname, v))
            elif v is not None:  # NULL: no such header
                problems.append(_problem(name, v))
        key_b = key if type(key) is bytes else None
        if key_b is None:
            problems.append(_problem(cols.aggregate_id, key))
        value_b = value if type(value) is bytes else None
        if value_b is None and not (value is None and self._tombstones):
            problems.append(_problem(cols.payload, value))
        topic: str | None = None
        if type(at_v) is bytes and type(et_v) is bytes:
            text, ok = self._topic(at_v, et_v)
            if ok:
                topic = text
            else:
                problems.append(text)
        if hv is not None and not (type(hv) is bytes and hv == b"{}"):
            extra = _parse_headers(self._headers_name, hv, self._taken)
            if isinstance(extra, str):
                problems.append(extra)
            else:
                headers.extend(extra)
        if problems or topic is None or key_b is None or event_id is None:
            return DeadLetter("; ".join(problems), event_id, key_b, value_b, headers, topic)
        return OutboxRecord(topic, key_b, value_b, headers, event_id)


def _parse_headers(
    name: str, hv: ColumnValue, taken: frozenset[str]
) -> tuple[tuple[str, bytes], ...] | str:
    """Extra headers from the headers column, or the dead-letter reason (``taken``: the
    ``header_columns`` names, reserved like the relay's own)."""
    if not isinstance(hv, bytes):
        return _problem(name, hv)
    return parse_headers_json(name, hv, taken)
