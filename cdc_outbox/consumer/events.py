"""How Kafka records become events (:class:`~cdc_outbox.consumer.event_types.Event`); pure.

The value decoder is a seam: :func:`decoder_for` maps the ``value_format`` setting to a
function ``RawRecord -> payload``: ``"json"`` (:func:`json_value`) or ``"avro"`` (the
Confluent wire format, writer schemas from the registry:
:class:`cdc_outbox.consumer.avro_values.AvroValues`). A decoder raises :class:`BadRecord` for a
value that can never be decoded (dead-lettered) and :class:`DecodeUnavailable` when what it
needs is down (the batch is retried after a backoff, nothing is dead-lettered).
"""

from __future__ import annotations

import functools
import json
import uuid
from typing import Any

from cdc_outbox.config.models import SchemaRegistrySettings
from cdc_outbox.consumer.event_types import BadRecord, Event, ValueDecoder, make_event, text_of
from cdc_outbox.errors import ConfigError
from cdc_outbox.kafka.consumer import RawRecord

__all__ = ["decoder_for", "event_of", "json_value"]


def json_value(record: RawRecord) -> Any:
    """The record value as JSON (``None`` for a tombstone)."""
    if record.value is None:
        return None
    try:
        return json.loads(record.value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRecord(f"value is not JSON: {exc}") from None


def decoder_for(value_format: str, registry: SchemaRegistrySettings | None = None) -> ValueDecoder:
    """The decoder of ``value_format`` (``registry``: where "avro" finds writer schemas);
    ``ConfigError`` for an unknown format or "avro" without a registry url."""
    if value_format == "json":
        return json_value
    if value_format == "avro":
        if registry is None or not registry.url:
            raise ConfigError("consumer: value_format 'avro' needs schema_registry.url")
        from cdc_outbox.consumer.avro_values import AvroValues

        return AvroValues(registry)
    raise ConfigError(f"consumer: value_format {value_format!r} is not supported")


def _event_id(headers: dict[str, bytes | None]) -> uuid.UUID:
    """The ``id`` header (set by the relay to the outbox row's id) as a UUID."""
    raw = text_of(headers.get("id"))
    if raw is None:
        raise BadRecord("record has no 'id' header (not an outbox event?)")
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise BadRecord(f"'id' header {raw[:80]!r} is not a UUID") from None


def event_of(record: RawRecord, decode: ValueDecoder) -> Event:
    """The :class:`Event` of ``record``; :class:`BadRecord` if it has none. CloudEvents
    records (binary or structured) are read by :mod:`cdc_outbox.consumer.cloudevents_records`."""
    headers = dict(record.headers)
    ce = _cloudevents()
    if ce.is_cloudevent(headers):
        return ce.cloud_event_of(record, headers, decode)  # type: ignore[no-any-return]
    get = headers.get
    return make_event(
        _event_id(headers),
        text_of(get("aggregate_type")),
        text_of(record.key),
        text_of(get("event_type")),
        decode(record),
        headers,
        record.topic,
        record.partition,
        record.offset,
    )


@functools.cache
def _cloudevents() -> Any:
    """:mod:`cdc_outbox.consumer.cloudevents_records`, imported on first use (it imports this
    module) and then found in one call instead of an import statement per record."""
    from cdc_outbox.consumer import cloudevents_records

    return cloudevents_records
