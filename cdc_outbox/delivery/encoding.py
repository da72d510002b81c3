"""One event's wire form: the key and value its record is produced with (Avro-encoded when
configured, :mod:`cdc_outbox.avro.serializer`), or why it cannot be produced. Pure, apart from
the serializer's schema registry look-ups."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc_outbox.config.delivery import AvroSection
from cdc_outbox.delivery.policy import precheck
from cdc_outbox.records import DeadLetter, OutboxRecord

if TYPE_CHECKING:
    from cdc_outbox.avro.serializer import AvroSerializer, EncodeProblem

__all__ = ["serializer", "wire_form"]

_VALUE_OMITTED = ("cdc_outbox.value_omitted", b"true")


def serializer(section: AvroSection | None) -> AvroSerializer | None:
    """The Avro serializer of ``section`` (None: no part of a record is Avro), its local
    schemas registered (with ``auto_register``; an outage only logs)."""
    if section is None:
        return None
    from cdc_outbox.avro.serializer import AvroSerializer  # only loaded when Avro is used

    avro = AvroSerializer(section)
    avro.register_all()
    return avro


def wire_form(
    avro: AvroSerializer | None, record: OutboxRecord, fast_bytes: int, max_bytes: int
) -> tuple[bytes | None, bytes | None] | EncodeProblem | DeadLetter:
    """``(key, value)`` to produce ``record`` with; the :class:`EncodeProblem` when Avro
    encoding failed (the policy decides: retry or dead letter); or, when the record cannot be
    produced (null key, larger than ``max_bytes``: only checked from ``fast_bytes`` of value
    on), its dead letter, without the value."""
    key: bytes | None = record.key
    value = record.value
    if avro is not None:
        encoded = avro.encode(record)
        if type(encoded) is not tuple:
            assert not isinstance(encoded, tuple)
            return encoded
        key, value = encoded
    if value is None or len(value) >= fast_bytes:
        problem = precheck(key, value, record.headers, max_bytes)
        if problem is not None:
            headers = [*record.headers, _VALUE_OMITTED]
            return DeadLetter(problem, record.event_id, record.key, None, headers, record.topic)
    return key, value
