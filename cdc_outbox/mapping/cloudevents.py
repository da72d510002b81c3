"""Publish outbox records in the CloudEvents Kafka protocol binding (pure, no I/O).

:class:`CloudEventsMapper` is an :class:`~cdc_outbox.mapping.rows.OutboxMapper` (setting
``cloudevents = "binary"`` or ``"structured"``) whose records carry a CloudEvents 1.0 event
built with the ``cloudevents`` SDK (extra ``cdc-outbox[cloudevents]``, imported only here):

* id = the event id, source = ``source``, type = the event type, subject = the aggregate id,
  time = the row's ``created_at`` when the relation carries it (CDC streaming), else the
  moment of mapping (polling, catch-up), datacontenttype = ``datacontenttype``;
* binary mode: the SDK's ``ce_*`` headers and ``content-type`` are appended to the record's
  headers, the value stays the payload (a tombstone stays a tombstone);
* structured mode: the value is the JSON envelope (``data`` = the parsed payload) and the
  ``content-type`` header is ``application/cloudevents+json``; a payload that is not JSON is
  a :class:`~cdc_outbox.mapping.rows.DeadLetter`.

Key, topic and the relay's own headers (``id``, ``event_type``, ``aggregate_type``, extras)
are those of the plain mapping; dead letters are never wrapped.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from cdc_outbox.errors import ConfigError
from cdc_outbox.mapping.rows import OutboxMapper
from cdc_outbox.pgwire.pgoutput import Relation, TupleData
from cdc_outbox.records import DeadLetter, OutboxRecord

__all__ = ["TIME_COLUMN", "CloudEventsMapper", "default_source", "load_sdk"]

#: The column whose value becomes the CloudEvents ``time`` when the relation has it.
TIME_COLUMN = "created_at"
_INSTALL_HINT = "the cloudevents SDK is not installed: pip install 'cdc-outbox[cloudevents]'"


def load_sdk() -> Any:
    """The SDK's Kafka binding module; ``ConfigError`` (one line) when it is not installed."""
    try:
        from cloudevents.core.bindings import kafka
    except ImportError:
        raise ConfigError(f"config: cloudevents: {_INSTALL_HINT}") from None
    return kafka


def default_source(dbname: str | None, schema: str, table: str) -> str:
    """``cdc-outbox/<database>/<schema>.<table>`` (without the database when unknown)."""
    return "/".join(p for p in ("cdc-outbox", dbname, f"{schema}.{table}") if p)


def _no_key(_event: Any) -> None:
    return None  # the record keeps its own key (the aggregate id)


class CloudEventsMapper(OutboxMapper):
    """An :class:`OutboxMapper` whose records are CloudEvents (see the module contract)."""

    __slots__ = ("_content_type", "_event_cls", "_format", "_kafka", "_mode", "_source", "_times")

    def __init__(
        self,
        *args: Any,
        mode: Literal["binary", "structured"],
        source: str,
        datacontenttype: str = "application/json",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._kafka = load_sdk()
        from cloudevents.core.formats.json import JSONFormat
        from cloudevents.core.v1.event import CloudEvent

        self._event_cls = CloudEvent
        self._format = JSONFormat()
        self._mode = mode
        self._source = source
        self._content_type = datacontenttype
        self._times: dict[int, tuple[Relation, int | None]] = {}

    def map_insert(self, rel: Relation, row: TupleData) -> OutboxRecord | DeadLetter:
        """The plain mapping of ``row``, its record turned into a CloudEvent."""
        out = super().map_insert(rel, row)
        if type(out) is not OutboxRecord:
            return out
        return self._wrap(out, self._time(rel, row))

    def _time(self, rel: Relation, row: TupleData) -> datetime | None:
        cached = self._times.get(rel.oid)
        if cached is None or cached[0] is not rel:
            names = [c.name for c in rel.columns]
            cached = (rel, names.index(TIME_COLUMN) if TIME_COLUMN in names else None)
            self._times[rel.oid] = cached
        pos = cached[1]
        raw = None if pos is None else row[pos]
        if type(raw) is not bytes:
            return None
        try:
            return datetime.fromisoformat(raw.decode())
        except (ValueError, UnicodeDecodeError):
            return None  # not a timestamp: the SDK's default (now)

    def _wrap(self, record: OutboxRecord, time: datetime | None) -> OutboxRecord | DeadLetter:
        headers = dict(record.headers)
        attributes: dict[str, Any] = {
            "id": record.event_id,
            "source": self._source,
            "type": headers["event_type"].decode(),
            "subject": record.key.decode(errors="replace"),
            "datacontenttype": self._content_type,
        }
        if time is not None:
            attributes["time"] = time
        if self._mode == "binary":
            event = self._event_cls(attributes, record.value)
            message = self._kafka.to_binary(event, self._format, key_mapper=_no_key)
            record.headers.extend(message.headers.items())
            return record
        try:
            data = json.loads(record.value) if record.value is not None else None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            reason = f"cloudevents structured mode needs a JSON payload: {exc}"
            return DeadLetter(
                reason, record.event_id, record.key, record.value, record.headers, record.topic
            )
        event = self._event_cls(attributes, data)
        message = self._kafka.to_structured(event, self._format, key_mapper=_no_key)
        record.value = message.value
        record.headers.extend(message.headers.items())
        return record
