"""Kafka readiness for the health endpoint (``/ready``): one long-lived, never-producing client."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, Producer

from cdc_outbox.kafka.librdkafka_log import QuietLibrdkafkaLog


class KafkaProbe:
    """Readiness: is the cluster reachable? One long-lived client (the configured security
    settings, never producing) whose metadata request is the check; errors go to the caller,
    librdkafka's own lines to DEBUG (the relay's producer already warns)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        merged = {**config, "error_cb": lambda err: None}
        try:
            self._producer = Producer(merged, logger=QuietLibrdkafkaLog(max_level=logging.DEBUG))
        except KafkaException as exc:
            raise ValueError(f"invalid Kafka configuration: {exc.args[0]}") from exc

    def check(self, timeout: float) -> int:
        """Number of brokers in fresh cluster metadata; ``ConnectionError`` if none arrives
        within ``timeout`` s."""
        try:
            metadata = self._producer.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise ConnectionError(f"Kafka not reachable: {exc.args[0].str()}") from exc
        return len(metadata.brokers)
