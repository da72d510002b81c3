"""Events from records in the CloudEvents Kafka binding (pure, no I/O).

A record is a CloudEvent when it has a ``ce_*`` header (binary mode) or its ``content-type``
header is ``application/cloudevents+json`` (structured mode); :func:`is_cloudevent` tells.
:func:`cloud_event_of` parses it with the ``cloudevents`` SDK (extra
``cdc-outbox[cloudevents]``, imported lazily) and gives the handler the same fields as a plain
record: event id = the CloudEvent ``id`` (a UUID), event type = ``type``, aggregate id = the
record key (else ``subject``), aggregate type = the relay's ``aggregate_type`` header, payload =
the value decoded by the consumer's decoder (binary) or the envelope's ``data`` (structured).
A record that is not a valid CloudEvent raises :class:`BadRecord`; a CloudEvent record read
without the SDK installed raises :class:`ConfigError` (one line: nothing can be handled).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from cdc_outbox.consumer.event_types import BadRecord, Event, ValueDecoder, text_of
from cdc_outbox.errors import ConfigError
from cdc_outbox.kafka.consumer import RawRecord

__all__ = ["STRUCTURED_CONTENT_TYPE", "cloud_event_of", "is_cloudevent"]

STRUCTURED_CONTENT_TYPE = "application/cloudevents"


_STRUCTURED = STRUCTURED_CONTENT_TYPE.encode()
_BINARY_PREFIXES = ("ce_", "CE_", "Ce_", "cE_")  # "ce_" in any case, without a new string


def is_cloudevent(headers: Mapping[str, bytes | None]) -> bool:
    """Whether a record with these headers is in the CloudEvents Kafka binding."""
    for name in headers:  # a loop, not any(<generator>): this runs for every record
        if name.startswith(_BINARY_PREFIXES):
            return True
    content_type = headers.get("content-type")
    return content_type is not None and content_type.startswith(_STRUCTURED)


def cloud_event_of(
    record: RawRecord, headers: dict[str, bytes | None], decode: ValueDecoder
) -> Event:
    """The :class:`Event` of a CloudEvents ``record`` (see the module contract)."""
    try:
        from cloudevents.core.bindings import kafka
        from cloudevents.core.exceptions import BaseCloudEventException
        from cloudevents.core.formats.json import JSONFormat
    except ImportError:
        raise ConfigError(
            "consumer: a CloudEvents record arrived but the cloudevents SDK is not installed:"
            " pip install 'cdc-outbox[cloudevents]'"
        ) from None
    binary = any(name[:3].lower() == "ce_" for name in headers)
    message = kafka.KafkaMessage(
        headers={k: v for k, v in headers.items() if v is not None},
        key=record.key,
        value=b"" if binary else (record.value or b""),  # binary: the decoder reads the value
    )
    try:
        event = kafka.from_kafka(message, JSONFormat())
    except (BaseCloudEventException, ValueError, TypeError, KeyError) as exc:
        raise BadRecord(f"not a valid CloudEvent: {exc}") from None
    try:
        event_id = uuid.UUID(event.get_id())
    except ValueError:
        raise BadRecord(f"CloudEvent id {event.get_id()[:80]!r} is not a UUID") from None
    return Event(
        event_id=event_id,
        aggregate_type=text_of(headers.get("aggregate_type")),
        aggregate_id=text_of(record.key) if record.key is not None else event.get_subject(),
        event_type=event.get_type(),
        payload=decode(record) if binary else event.get_data(),
        headers=headers,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
    )
