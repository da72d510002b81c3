"""The sections of the delivery side (issue 35: each component receives only what it reads):
:class:`DeliverySection` for :class:`~cdc_outbox.delivery.engine.Delivery`,
:class:`AvroSection` for :class:`~cdc_outbox.avro.serializer.AvroSerializer`,
:class:`DeadLetterSection` for :class:`~cdc_outbox.store.failed_rows.FailedRows`; each built
from the one ``Settings`` by the function beside it.

Secrets (the DSN, librdkafka passthrough keys such as ``sasl.password``) are left out of the
sections' ``repr``: a section may be logged, they never are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cdc_outbox.config.models import SchemaRegistrySettings
from cdc_outbox.config.settings import Settings

__all__ = [
    "AvroSection",
    "DeadLetterSection",
    "DeliverySection",
    "avro_section",
    "dead_letter_section",
    "delivery_section",
]


@dataclass(frozen=True, slots=True)
class AvroSection:
    """What the Avro serializer reads: the schema registry, and whether values and keys are
    Avro (``value_format``, ``key_format``)."""

    registry: SchemaRegistrySettings
    values: bool
    keys: bool


@dataclass(frozen=True, slots=True)
class DeadLetterSection:
    """Where dead-lettered rows are marked FAILED: the outbox database (the tables themselves
    are given beside it)."""

    dsn: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class DeliverySection:
    """What the delivery engine reads: the producer's librdkafka configuration, the policy on
    a permanent error, the record size bounds, the dead-letter topic, the Kafka transaction
    timeout (exactly-once), the relay span switch and the Avro encoding (None: no part of a
    record is Avro)."""

    kafka: Mapping[str, str] = field(repr=False)
    halt_on_permanent_error: bool
    max_record_bytes: int
    dead_letter_topic: str
    transaction_timeout_ms: int
    tracing_relay_span: bool
    avro: AvroSection | None


def avro_section(settings: Settings) -> AvroSection:
    """The Avro serializer's section of ``settings``."""
    return AvroSection(
        registry=settings.schema_registry,
        values=settings.value_format == "avro",
        keys=settings.key_format == "avro",
    )


def dead_letter_section(settings: Settings) -> DeadLetterSection:
    """Where ``settings`` mark dead-lettered rows FAILED."""
    return DeadLetterSection(dsn=settings.postgres_dsn())


def delivery_section(settings: Settings) -> DeliverySection:
    """The delivery engine's section of ``settings``."""
    avro = "avro" in (settings.value_format, settings.key_format)
    return DeliverySection(
        kafka=settings.kafka_config(),
        halt_on_permanent_error=settings.on_permanent_error == "halt",
        max_record_bytes=settings.max_record_bytes,
        dead_letter_topic=settings.dead_letter_topic,
        transaction_timeout_ms=settings.eos.transaction_timeout_ms,
        tracing_relay_span=settings.tracing_relay_span,
        avro=avro_section(settings) if avro else None,
    )
