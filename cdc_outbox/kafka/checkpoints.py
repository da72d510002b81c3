"""The checkpoint topic of exactly-once delivery: where the relay's Kafka position lives.

Every Kafka transaction of the relay also writes one checkpoint record (compacted topic, key
``<system id>/<database>/<slot>``) saying which PostgreSQL transactions it covers: the end LSN
of the last one (streaming), or the ids of the backlog rows (catch-up: those published, and
those dead-lettered with their reasons). The record is visible
exactly when the events are, so the last checkpoint read with ``read_committed`` is the truth
about what Kafka holds, whatever the slot says (the slot is confirmed after the commit and may
lag behind it).

A checkpoint also says which history its positions belong to (system identifier and
timeline, :mod:`cdc_outbox.cdc.history`) and which producer wrote it (``producer``: the
relay's ``transactional.id``). The topic belongs to the relay: outbox rows can never be routed
onto it (:func:`cdc_outbox.delivery.engine.Delivery.submit` rejects them), and a record under
our key that does not decode, or names another slot, database or producer, is ignored with an
error log, never trusted.

Contract: :func:`ensure_topic` creates the topic (1 partition, ``cleanup.policy=compact``) if
it is missing and raises ``ConnectionError`` if Kafka cannot be asked; :func:`read_last`
returns the newest committed, valid :class:`Checkpoint` for a key (``None`` if there is none),
reading backwards from the end, and never an older one hidden behind another producer's open
transaction (it waits for that to end); it raises ``ConnectionError`` when Kafka answers with
an error (a broker restarting: ``NOT_LEADER_FOR_PARTITION``, a timeout), which callers retry,
and ``TimeoutError`` when reading (or that wait) takes too long.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

logger = logging.getLogger(__name__)

T = TypeVar("T")

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
    #: Backlog rows dead-lettered by this transaction (catch-up only): ``[id, reason]``;
    #: their rows are marked FAILED only after the commit.
    dead_letters: list[tuple[str, str]] = field(default_factory=list)
    #: Timeline of ``end_lsn`` (``None``: written by a version that did not record it).
    timeline: int | None = None
    #: ``transactional.id`` of the producer that wrote it (``None``: an older version).
    producer: str | None = None

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
                "dead_letters": [list(d) for d in self.dead_letters],
                "timeline": self.timeline,
                "producer": self.producer,
                "written_at": time.time(),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, value: bytes) -> Checkpoint:
        """Raises ``ValueError`` (or ``TypeError``/``KeyError``) for anything but a checkpoint."""
        data = json.loads(value)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        timeline, producer = data.get("timeline"), data.get("producer")
        end_lsn = data["end_lsn"]
        if not isinstance(end_lsn, int) or isinstance(end_lsn, bool) or end_lsn < 0:
            raise ValueError(f"end_lsn {end_lsn!r} is not a position")
        if timeline is not None and (not isinstance(timeline, int) or timeline < 1):
            raise ValueError(f"timeline {timeline!r} is not a timeline")
        ids = data.get("catch_up_ids", [])
        if not isinstance(ids, list):
            raise ValueError("catch_up_ids is not a list")
        dead = data.get("dead_letters", [])
        if not isinstance(dead, list) or not all(isinstance(d, list) and len(d) == 2 for d in dead):
            raise ValueError("dead_letters is not a list of [id, reason]")
        return cls(
            slot=str(data["slot"]),
            system_id=str(data["system_id"]),
            database=str(data["database"]),
            end_lsn=end_lsn,
            catch_up_ids=[str(i) for i in ids],
            dead_letters=[(str(i), str(r)) for i, r in dead],
            timeline=timeline,
            producer=None if producer is None else str(producer),
        )

    def written_by(self, slot: str, system_id: str, database: str, producer: str) -> bool:
        """Whether this record is one the relay ``producer`` of that slot wrote (an older
        version wrote no producer: the key and fields decide then)."""
        return (self.slot, self.system_id, self.database) == (slot, system_id, database) and (
            self.producer is None or self.producer == producer
        )


class CheckpointStore(Protocol):
    """Where the exactly-once relay reads its last checkpoint (a test passes a fake)."""

    def ensure(self) -> None:
        """Create the topic if missing; raises ``ConnectionError``."""

    def read_last(self, key: bytes, valid: Callable[[Checkpoint], bool]) -> Checkpoint | None:
        """:func:`read_last` on the store's topic."""


class KafkaCheckpoints:
    """The checkpoint topic ``topic`` of the cluster ``config`` names."""

    def __init__(self, config: Mapping[str, Any], topic: str) -> None:
        self.config = config
        self.topic = topic

    def ensure(self) -> None:
        ensure_topic(self.config, self.topic)

    def read_last(self, key: bytes, valid: Callable[[Checkpoint], bool]) -> Checkpoint | None:
        return read_last(self.config, self.topic, key, valid=valid)


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
    valid: Callable[[Checkpoint], bool] = lambda cp: True,
) -> Checkpoint | None:
    """The newest committed checkpoint with ``key`` (read_committed) that decodes and is
    ``valid``, or ``None`` (see the module contract for what is raised). Call it once our own
    transactions are settled (after ``init_transactions``).

    A read_committed read ends at the partition's last stable offset (LSO), the first offset
    of the oldest open transaction, and another producer's transaction may be open there (the
    topic is shared: every relay's transactions open with a checkpoint record). So it first
    looks (read_uncommitted) for records under ``key`` between the LSO and the high
    watermark: if there is one, committed or aborted (only read_committed can tell), it waits
    until the LSO has passed it, raising ``TimeoutError`` at the deadline; it never answers
    with a checkpoint older than one hidden there. Then it reads backwards from the LSO in
    growing windows (``window``, then 4x, ...), so the time does not grow with the topic's
    uncompacted history."""
    deadline = time.monotonic() + timeout
    try:
        for p in _partitions(config, topic, timeout):  # our key's records are all in one
            tp = TopicPartition(topic, p)
            low, end = _stable_end(config, tp, key, deadline, window)
            found = _scan_back(
                config,
                tp,
                low,
                end,
                deadline,
                window,
                committed=True,
                pick=lambda msg: _ours(msg, key, topic, valid),
            )
            if found is not None:
                return found
    except KafkaException as exc:
        raise ConnectionError(f"reading checkpoint topic {topic} failed: {_reason(exc)}") from exc
    return None


def _reason(exc: KafkaException) -> str:
    err: Any = exc.args[0] if exc.args else None
    return str(err.str()) if hasattr(err, "str") else str(exc)


def _partitions(config: Mapping[str, Any], topic: str, timeout: float) -> list[int]:
    consumer = _consumer(config)
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
        return sorted(metadata.topics[topic].partitions) if topic in metadata.topics else []
    finally:
        consumer.close()


def _marks(consumer: Consumer, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    """(low, end) of ``tp``: the end is the LSO for a read_committed ``consumer``, else the
    high watermark."""
    timeout = max(0.1, deadline - time.monotonic())
    low, end = consumer.get_watermark_offsets(tp, timeout=timeout)
    return int(low), int(end)


def _stable_end(
    config: Mapping[str, Any], tp: TopicPartition, key: bytes, deadline: float, window: int
) -> tuple[int, int]:
    """(low, end) of ``tp`` where ``end`` is a last stable offset past every record under
    ``key`` (see :func:`read_last`); raises ``TimeoutError`` at ``deadline``."""
    committed = _consumer(config)
    try:
        low, stable = _marks(committed, tp, deadline)
        uncommitted = _consumer(config, committed=False)
        try:
            high = _marks(uncommitted, tp, deadline)[1]
        finally:
            uncommitted.close()
        if stable >= high:
            return low, stable
        hidden = _scan_back(
            config,
            tp,
            stable,
            high,
            deadline,
            window,
            committed=False,
            pick=lambda msg: msg.offset() if msg.error() is None and msg.key() == key else None,
        )
        if hidden is None:
            return low, stable
        logger.info(
            "checkpoint topic %s: a record under our key at offset %d is behind an open"
            " transaction (last stable offset %d): waiting until it ends",
            tp.topic,
            hidden,
            stable,
        )
        while stable <= hidden:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"checkpoint topic {tp.topic}: our record at offset {hidden} is still"
                    f" behind another producer's open transaction (last stable offset"
                    f" {stable})"
                )
            time.sleep(_STABLE_POLL_S)
            low, stable = _marks(committed, tp, deadline)
        return low, stable
    finally:
        committed.close()


#: How often the last stable offset is asked for while an open transaction hides our record.
_STABLE_POLL_S = 0.1


def _consumer(config: Mapping[str, Any], *, committed: bool = True) -> Consumer:
    return Consumer(
        {
            **config,
            "group.id": "cdc-outbox-checkpoint-reader",
            "enable.auto.commit": "false",
            "enable.partition.eof": "false",
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "error_cb": _quiet,
        }
    )


def _scan_back(
    config: Mapping[str, Any],
    tp: TopicPartition,
    low: int,
    end: int,
    deadline: float,
    window: int,
    *,
    committed: bool,
    pick: Callable[[Any], T | None],
) -> T | None:
    """The last non-``None`` ``pick(record)`` in ``[low, end)``, read backwards in growing
    windows (``end`` must not be past what the consumer can read: the LSO if ``committed``)."""
    size = window
    while end > low:
        start = max(low, end - size)
        found = _last_in_range(config, tp, start, end, deadline, committed, pick)
        if found is not None:
            return found
        end, size = start, size * 4
    return None


def _last_in_range(
    config: Mapping[str, Any],
    tp: TopicPartition,
    start: int,
    end: int,
    deadline: float,
    committed: bool,
    pick: Callable[[Any], T | None],
) -> T | None:
    """The last non-``None`` ``pick(record)`` in ``[start, end)``: a fresh consumer per range,
    so its position is never one left over from another range."""
    consumer = _consumer(config, committed=committed)
    try:
        consumer.assign([TopicPartition(tp.topic, tp.partition, start)])
        last: T | None = None
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading checkpoint topic {tp.topic} took too long")
            for msg in consumer.consume(1000, 0.2):
                offset = msg.offset()
                if offset is not None and offset < end and (got := pick(msg)) is not None:
                    last = got
            # The position steps over transaction markers and aborted records too.
            [position] = consumer.position([TopicPartition(tp.topic, tp.partition)])
            if position.offset >= end:
                return last
    finally:
        consumer.close()


def _ours(
    msg: Any, key: bytes, topic: str, valid: Callable[[Checkpoint], bool]
) -> Checkpoint | None:
    """The checkpoint in a read_committed record under ``key``, or ``None``."""
    if msg.error() is not None or msg.key() != key:
        return None
    return _decoded(msg.value(), topic, msg.offset(), valid)


def _decoded(
    value: bytes | None, topic: str, offset: int, valid: Callable[[Checkpoint], bool]
) -> Checkpoint | None:
    """The checkpoint in a record under our key, or ``None`` (logged) if it is not one of ours."""
    try:
        checkpoint = Checkpoint.decode(value or b"")
    except (ValueError, TypeError, KeyError) as exc:
        logger.error(
            "ignoring a malformed record in checkpoint topic %s at offset %d: %s",
            topic,
            offset,
            exc,
        )
        return None
    if not valid(checkpoint):
        logger.error(
            "ignoring a record in checkpoint topic %s at offset %d: not written by this relay"
            " (slot %s, producer %s)",
            topic,
            offset,
            checkpoint.slot,
            checkpoint.producer,
        )
        return None
    return checkpoint
