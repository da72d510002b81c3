"""Reading outbox topics back from Kafka, to verify delivery (demo, tests, benchmarks)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from cdc_outbox.kafka.delivery_failure import Headers

__all__ = ["ConsumedRecord", "count_records", "read_topics"]


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """One record read back from Kafka."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int = -1  # the record's timestamp (producer's create time), -1 if none


def read_topics(
    bootstrap_servers: str,
    topic_prefix: str,
    *,
    timeout: float = 60.0,
    extra_config: Mapping[str, Any] | None = None,
) -> list[ConsumedRecord]:
    """Everything currently in the topics whose names start with ``topic_prefix``.

    Reads each partition from its beginning up to the high watermark seen at the start, in
    offset order per partition. librdkafka's default ``isolation.level`` is ``read_committed``
    (aborted records and transaction markers are stepped over); pass
    ``extra_config={"isolation.level": "read_uncommitted"}`` to see aborted records too.
    Raises ``TimeoutError`` if that takes longer than ``timeout``.
    """
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"cdc-outbox-reader-{time.time_ns()}",
        "enable.auto.commit": "false",
        "enable.partition.eof": "false",
        **(extra_config or {}),
    }
    consumer = Consumer(config)
    try:
        ends = {
            tp: high
            for tp, (low, high) in _watermarks(consumer, topic_prefix, timeout).items()
            if high > low
        }
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for (t, p) in ends])
        records: list[ConsumedRecord] = []
        deadline = time.monotonic() + timeout
        while ends:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic_prefix}* did not finish in {timeout}s")
            for msg in consumer.consume(10_000, 0.5):
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                if msg.error() or topic is None or partition is None or offset is None:
                    continue
                end = ends.get((topic, partition))
                if end is None or offset >= end:
                    continue
                raw = msg.headers() or []
                pairs = raw.items() if isinstance(raw, dict) else raw
                headers = [(k, v) for k, v in pairs if isinstance(v, bytes)]
                stamp = msg.timestamp()[1]
                records.append(
                    ConsumedRecord(topic, partition, offset, msg.key(), msg.value(), headers, stamp)
                )
                if offset + 1 >= end:
                    del ends[(topic, partition)]
            # Transaction markers and (read_committed) aborted records are never delivered:
            # a partition is done once the consumer's position has passed its end.
            for tp in consumer.position([TopicPartition(t, p) for (t, p) in list(ends)]):
                if tp.offset >= ends[(tp.topic, tp.partition)]:
                    del ends[(tp.topic, tp.partition)]
        return records
    finally:
        consumer.close()


def count_records(bootstrap_servers: str, topic_prefix: str, *, timeout: float = 10.0) -> int:
    """How many records the topics starting with ``topic_prefix`` hold (from watermarks)."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "cdc-outbox-counter"})
    try:
        marks = _watermarks(consumer, topic_prefix, timeout)
        return sum(high - low for low, high in marks.values())
    finally:
        consumer.close()


def _watermarks(
    consumer: Consumer, topic_prefix: str, timeout: float
) -> dict[tuple[str, int], tuple[int, int]]:
    """(low, high) offsets of every partition of the topics starting with ``topic_prefix``."""
    marks: dict[tuple[str, int], tuple[int, int]] = {}
    for name, topic in consumer.list_topics(timeout=timeout).topics.items():
        if name.startswith(topic_prefix):
            for pid in topic.partitions:
                marks[(name, pid)] = _partition_marks(consumer, name, pid, timeout)
    return marks


#: Answers of a partition that was just created (its leader not elected yet): ask again.
_NOT_READY = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE)


def _partition_marks(
    consumer: Consumer, topic: str, partition: int, timeout: float
) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )
            return low, high
        except KafkaException as exc:
            if exc.args[0].code() not in _NOT_READY or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
