"""What a handler receives (:class:`Event`) and the two ways decoding a record fails.

Plain types shared by the decoders (:mod:`cdc_outbox.consumer.events`,
:mod:`cdc_outbox.consumer.avro_values`, :mod:`cdc_outbox.consumer.cloudevents_records`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc_outbox.kafka.consumer import RawRecord

__all__ = ["BadRecord", "DecodeUnavailable", "Event", "ValueDecoder", "text_of"]

ValueDecoder = Callable[[RawRecord], Any]


class BadRecord(Exception):
    """The record cannot be handled, ever (no event id, undecodable value)."""


class DecodeUnavailable(Exception):
    """The decoder cannot work now (e.g. the schema registry is down): try again later."""


@dataclass(frozen=True, slots=True)
class Event:
    """One outbox event as read from Kafka; ``payload`` is the decoded value (None for a
    tombstone), ``aggregate_id`` the record key."""

    event_id: uuid.UUID
    aggregate_type: str | None
    aggregate_id: str | None
    event_type: str | None
    payload: Any
    headers: dict[str, bytes | None]
    topic: str
    partition: int
    offset: int


def text_of(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None
