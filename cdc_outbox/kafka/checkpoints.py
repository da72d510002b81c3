"""The checkpoint topic of exactly-once delivery: where the relay's Kafka position lives.

Every Kafka transaction of the relay also writes one checkpoint record (compacted topic, key
``<system id>/<database>/<slot>``) saying which PostgreSQL transactions it covers: the end LSN
of the last one (streaming), or the ids of the backlog rows (catch-up). The record is visible
exactly when the events are, so the last checkpoint read with ``read_committed`` is the truth
about what Kafka holds, whatever the slot says (the slot is confirmed after the commit and may
lag behind it).

Contract: :func:`ensure_topic` creates the topic (1 partition, ``cleanup.policy=compact``) if
it is missing and raises ``ConnectionError`` if Kafka cannot be asked; :func:`read_last`
returns the newest committed :class:`Checkpoint` for a key (``None`` if there is none),
reading backwards from the end, or raises ``TimeoutError``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

logger = logging.getLogger(__name__)

#: Compacted; small segments so that compaction (which skips the active segment) keeps up.
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": "60000",
    "segment.ms": "3600000",
    "segment.bytes": "16777216",
}


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
    config: Mapping[str, Any],
    topic: str,
    key: bytes,
    timeout: float = 30.0,
    *,
    window: int = 1_000,
) -> Checkpoint | None:
    """The newest committed checkpoint with ``key`` (read_committed), or ``None``.

    Reads backwards from the end in growing windows (``window``, then 4x, ...), so the time
    does not grow with the topic's uncompacted history."""
    deadline = time.monotonic() + timeout
    consumer = _consumer(config)
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
        partitions = sorted(metadata.topics[topic].partitions) if topic in metadata.topics else []
        marks = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            for p in partitions
        }
    finally:
        consumer.close()
    for p, (low, end) in marks.items():  # our key's records are all in one partition
        size = window
        while end > low:
            start = max(low, end - size)
            found = _last_in_range(config, TopicPartition(topic, p, start), end, key, deadline)
            if found is not None:
                return found
            end, size = start, size * 4
    return None


def _consumer(config: Mapping[str, Any]) -> Consumer:
    return Consumer(
        {
            **config,
            "group.id": "cdc-outbox-checkpoint-reader",
            "enable.auto.commit": "false",
            "enable.partition.eof": "false",
            "isolation.level": "read_committed",
            "error_cb": _quiet,
        }
    )


def _last_in_range(
    config: Mapping[str, Any], first: TopicPartition, end: int, key: bytes, deadline: float
) -> Checkpoint | None:
    """The last committed record with ``key`` in ``[first.offset, end)``: a fresh consumer
    per range, so its position is never one left over from another range."""
    consumer = _consumer(config)
    try:
        consumer.assign([first])
        last: Checkpoint | None = None
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading checkpoint topic {first.topic} took too long")
            for msg in consumer.consume(1000, 0.2):
                offset = msg.offset()
                ours = msg.error() is None and msg.key() == key
                if ours and offset is not None and offset < end:
                    last = Checkpoint.decode(msg.value() or b"{}")
            # The position steps over transaction markers and aborted records too.
            [position] = consumer.position([TopicPartition(first.topic, first.partition)])
            if position.offset >= end:
                return last
    finally:
        consumer.close()
