"""The checkpoint topic of exactly-once delivery: where the relay's Kafka position lives.

Every Kafka transaction of the relay also writes one checkpoint record (compacted topic, key
``<system id>/<database>/<slot>``) saying which PostgreSQL transactions it covers: the end LSN
of the last one (streaming), or the ids of the backlog rows (catch-up). The record is visible
exactly when the events are, so the last checkpoint read with ``read_committed`` is the truth
about what Kafka holds, whatever the slot says (the slot is confirmed after the commit and may
lag behind it).

Contract: :func:`ensure_topic` creates the topic (1 partition, ``cleanup.policy=compact``) if
it is missing and raises ``ConnectionError`` if Kafka cannot be asked; :func:`read_last`
returns the newest committed :class:`Checkpoint` for a key (``None`` if there is none) or
raises ``TimeoutError``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

logger = logging.getLogger(__name__)

TOPIC_CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"}


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What one committed Kafka transaction of the relay covered."""

    slot: str
    system_id: str
    database: str
    #: End LSN of the last PostgreSQL transaction whose events are committed in Kafka.
    end_lsn: int
    #: Backlog row ids published by this transaction (catch-up only), else empty.
    catch_up_ids: list[str] = field(default_factory=list)

    @property
    def key(self) -> bytes:
        return checkpoint_key(self.system_id, self.database, self.slot)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "slot": self.slot,
                "system_id": self.system_id,
                "database": self.database,
                "end_lsn": self.end_lsn,
                "catch_up_ids": self.catch_up_ids,
                "written_at": time.time(),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, value: bytes) -> Checkpoint:
        data = json.loads(value)
        return cls(
            slot=str(data["slot"]),
            system_id=str(data["system_id"]),
            database=str(data["database"]),
            end_lsn=int(data["end_lsn"]),
            catch_up_ids=[str(i) for i in data.get("catch_up_ids", [])],
        )


def _quiet(err: Any) -> None:
    """librdkafka errors are the caller's: they surface as exceptions."""


def checkpoint_key(system_id: str, database: str, slot: str) -> bytes:
    return f"{system_id}/{database}/{slot}".encode()


def ensure_topic(config: Mapping[str, Any], topic: str, timeout: float = 10.0) -> None:
    """Create the compacted checkpoint topic if it does not exist (see the module contract)."""
    admin_config: dict[str, Any] = {**config, "error_cb": _quiet}
    admin = AdminClient(admin_config)
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise ConnectionError(f"Kafka not reachable: {exc.args[0].str()}") from exc
    if topic in metadata.topics and metadata.topics[topic].error is None:
        return
    replication = min(3, len(metadata.brokers)) or 1
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=replication, config=TOPIC_CONFIG)],
        request_timeout=timeout,
    )
    try:
        futures[topic].result(timeout)
        logger.info("created checkpoint topic %s (compacted)", topic)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in exc.args[0].name():
            raise ConnectionError(f"creating topic {topic} failed: {exc.args[0].str()}") from exc


def read_last(
    config: Mapping[str, Any], topic: str, key: bytes, timeout: float = 30.0
) -> Checkpoint | None:
    """The newest committed checkpoint with ``key`` (read_committed), or ``None``."""
    consumer = Consumer(
        {
            **config,
            "group.id": "cdc-outbox-checkpoint-reader",
            "enable.auto.commit": "false",
            "enable.partition.eof": "false",
            "isolation.level": "read_committed",
            "error_cb": lambda err: None,
        }
    )
    try:
        deadline = time.monotonic() + timeout
        metadata = consumer.list_topics(topic, timeout=timeout)
        partitions = sorted(metadata.topics[topic].partitions) if topic in metadata.topics else []
        ends: dict[int, int] = {}
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        last: Checkpoint | None = None
        while ends:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading checkpoint topic {topic} took over {timeout}s")
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is None and msg.key() == key and msg.value():
                    last = Checkpoint.decode(msg.value() or b"")
            # Positions step over transaction markers and aborted records too.
            for tp in consumer.position([TopicPartition(topic, p) for p in list(ends)]):
                if tp.offset >= ends[tp.partition]:
                    del ends[tp.partition]
        return last
    finally:
        consumer.close()
