"""The delivery engine's Kafka producer, built from its section: transactional with a
``transactional.id`` (exactly-once), else idempotent and, under the halt policy, gapless
(:class:`~cdc_outbox.kafka.publisher.KafkaPublisher`); and how long a Kafka transaction call
may block."""

from __future__ import annotations

from cdc_outbox.config.delivery import DeliverySection
from cdc_outbox.kafka.producer_config import eos_config
from cdc_outbox.kafka.publisher import KafkaPublisher, ProducerFactory

__all__ = ["new_publisher", "txn_timeout_s"]


def new_publisher(
    section: DeliverySection, transactional_id: str | None, client: ProducerFactory | None
) -> KafkaPublisher:
    """A new producer for ``section`` (``client``: the librdkafka stand-in of a test)."""
    kafka = dict(section.kafka)
    if transactional_id is not None:
        config = eos_config(kafka, section.transaction_timeout_ms)
        return KafkaPublisher(config, transactional_id=transactional_id, client=client)
    return KafkaPublisher(kafka, gapless=section.halt_on_permanent_error, client=client)


def txn_timeout_s(section: DeliverySection) -> float:
    """How long a Kafka transaction call may block: the transaction timeout, within 30-60 s."""
    return min(60.0, max(30.0, section.transaction_timeout_ms / 1000))
