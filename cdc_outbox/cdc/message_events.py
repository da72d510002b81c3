"""Table-less events: an outbox event carried by a logical decoding message (pure, no I/O).

Contract of :class:`MessageEvents`:

* the content of a message with the configured ``message_prefix`` is one JSON object (UTF-8)
  with the event's fields under their logical names: ``id``, ``aggregate_type``,
  ``aggregate_id``, ``event_type``, ``payload`` (the *text* PostgreSQL renders for the jsonb
  payload, so the Kafka value is byte-identical to a row's), ``headers`` (the jsonb text of the
  headers object), ``tracing_span_context``; each a string or null/absent (null: as a NULL
  column). :func:`cdc_outbox.writer.write_event` (``message_prefix``) and
  ``sql/example_emit_message.sql`` write it;
* :meth:`MessageEvents.map` hands these values, in ``row_columns`` order, to the relay's own
  :meth:`~cdc_outbox.mapping.rows.OutboxMapper.map_row`: the same record (or dead letter) a
  row with these values gives. ``headers``/``tracing_span_context`` count only when the outbox
  columns configure them (a message with headers and no headers column: a dead letter), and a
  ``header_columns`` source is read from the field of that column's name;
* content that is not a UTF-8 JSON object, a field that is neither string nor null, or an
  ``id`` that is not a UUID in its canonical text form (lower-case, 36 characters: what the
  writer sends) is a :class:`~cdc_outbox.records.DeadLetter` (reason given, no event id, the
  content as its value). The relay marks rows (published, FAILED) by event id cast to the id
  column's type: a message id must cast (a ``uuid`` or ``text`` id column), and one that
  matches no row changes nothing;
* :data:`NON_TRANSACTIONAL` is the reason a non-transactional message is refused with.
"""

from __future__ import annotations

import json
import re

from cdc_outbox.mapping.rows import ColumnNames, OutboxMapper
from cdc_outbox.records import DeadLetter, OutboxRecord

__all__ = ["NON_TRANSACTIONAL", "MessageEvents"]

NON_TRANSACTIONAL = "non-transactional message: cannot be tied to a commit"
_decode = json.JSONDecoder().decode
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class MessageEvents:
    """Maps the content of table-less event messages with the relay's mapper."""

    __slots__ = ("_fields", "_mapper", "prefix")

    def __init__(self, prefix: str, columns: ColumnNames, mapper: OutboxMapper) -> None:
        self.prefix = prefix
        self._mapper = mapper
        fields = ["id", "aggregate_type", "aggregate_id", "event_type", "payload"]
        fields += ["headers"] if columns.headers is not None else []
        fields += ["tracing_span_context"] if columns.tracing_span_context else []
        self._fields = fields + columns.header_sources()

    def map(self, content: bytes) -> OutboxRecord | DeadLetter:
        """The record (or dead letter) of one message's content (see the module contract)."""
        try:
            obj = _decode(content.decode())
        except (ValueError, RecursionError) as e:  # JSON and UTF-8 errors
            return self._poison(f"message content is not valid JSON: {e}", content)
        if not isinstance(obj, dict):
            return self._poison("message content is not a JSON object", content)
        if "headers" not in self._fields and obj.get("headers") not in (None, "{}"):
            return self._poison("message has headers: the outbox has no headers column", content)
        values: list[str | None] = []
        for name in self._fields:
            v = obj.get(name)
            if v is not None and not isinstance(v, str):
                return self._poison(f"message field {name!r} is not a string or null", content)
            values.append(v)
        if values[0] is not None and not _UUID.fullmatch(values[0]):
            return self._poison("message field 'id' is not a UUID (canonical text)", content)
        return self._mapper.map_row(values)

    @staticmethod
    def _poison(reason: str, content: bytes) -> DeadLetter:
        return DeadLetter(reason, None, None, content, [], None)
