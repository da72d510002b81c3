"""The Kafka side of :mod:`cdc_outbox.consumer`: a manual-commit consumer and a dead-letter sender.

Contract:
- :class:`KafkaSource` subscribes with ``enable.auto.commit=false`` and
  ``enable.auto.offset.store=false``: offsets move only through :meth:`KafkaSource.done`
  (after the record's PostgreSQL transaction committed) and are committed by
  :meth:`KafkaSource.commit` (periodically, before partitions are revoked, and on close).
  ``isolation.level`` is ``read_committed`` (records of aborted Kafka transactions are never
  seen). User config (``kafka.config`` plus consumer overrides) cannot change these three;
  a user value that differs is overridden with one warning line.
- librdkafka's own log lines go through :mod:`logging` (logger ``cdc_outbox.librdkafka``)
  and, like the client's error callbacks and error events (logger
  ``cdc_outbox.kafka.consumer``), each distinct line at most once per 30 s: a broker that
  is down does not flood the log.
- Rebalances call ``on_revoke`` (after committing what is done) and ``on_assign`` on the
  caller's thread, inside :meth:`KafkaSource.poll`.
- :class:`DeadLetterSender.send` returns only once Kafka acknowledged the record
  (``acks=all``, idempotent producer); it raises :class:`DeadLetterError` otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from cdc_outbox.kafka.librdkafka_log import QuietLibrdkafkaLog

logger = logging.getLogger(__name__)

__all__ = ["DeadLetterError", "DeadLetterSender", "KafkaSource", "RawRecord"]

_FORCED = {
    "enable.auto.commit": "false",
    "enable.auto.offset.store": "false",
    "isolation.level": "read_committed",
}
_DEFAULTS = {
    "auto.offset.reset": "earliest",
    "enable.partition.eof": "false",
    # A ^regex subscription sees topics created later (the relay's first event of a new
    # aggregate type) at the next metadata refresh: 10 s instead of librdkafka's 5 min.
    "topic.metadata.refresh.interval.ms": "10000",
}


class RawRecord(NamedTuple):
    """One Kafka record, independent of the client library (immutable; a named tuple, built
    for every record read: a third of the time a frozen dataclass takes)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


class DeadLetterError(Exception):
    """A dead letter could not be written (retry later; the record is not done)."""


class KafkaSource:
    """A consumer-group member reading ``topics`` (names, or regexes starting with ``^``)."""

    def __init__(
        self,
        config: Mapping[str, str],
        group_id: str,
        topics: Sequence[str],
        on_assign: Callable[[list[tuple[str, int]]], None],
        on_revoke: Callable[[list[tuple[str, int]]], None],
    ) -> None:
        forced = {**_FORCED, "group.id": group_id}
        _warn_overridden(config, forced)
        self._errors = QuietLibrdkafkaLog(name=__name__)
        conf: dict[str, Any] = {**_DEFAULTS, **config, **forced, "error_cb": self._error}
        self._consumer = Consumer(conf, logger=QuietLibrdkafkaLog())
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._consumer.subscribe(list(topics), on_assign=self._assigned, on_revoke=self._revoked)
        self._dirty = False

    def _error(self, err: KafkaError) -> None:
        self._errors.log(logging.WARNING, "kafka consumer: %s", err.str())

    def _assigned(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        logger.info("assigned %d partition(s)", len(parts))
        self._on_assign([(p.topic, p.partition) for p in parts])

    def _revoked(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        logger.info("revoking %d partition(s): committing what is done first", len(parts))
        self.commit()
        self._on_revoke([(p.topic, p.partition) for p in parts])

    def poll(self, timeout_s: float, max_records: int = 500) -> list[RawRecord]:
        """Up to ``max_records`` records in partition order (may serve rebalance callbacks):
        waits up to ``timeout_s`` for the first one, then takes only what is already fetched.
        (``consume(n, timeout)`` alone waits for ``n`` records or the whole timeout: at
        moderate load every batch sat out the timeout, issue 38.)"""
        out: list[RawRecord] = []
        first = self._consumer.poll(timeout_s)
        if first is None:
            return out
        more = self._consumer.consume(max_records - 1, 0) if max_records > 1 else []
        for msg in (first, *more):
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                self._error(err)
                continue
            out.append(_raw(msg))
        return out

    def done(self, records: Sequence[RawRecord]) -> None:
        """Mark ``records`` finished (each partition up to its last one there): the next
        offsets are committed by the next :meth:`commit`."""
        last = {(r.topic, r.partition): r.offset for r in records}  # the last one wins
        self._consumer.store_offsets(
            offsets=[TopicPartition(t, p, offset + 1) for (t, p), offset in last.items()]
        )
        self._dirty = True

    def commit(self) -> None:
        """Synchronously commit the stored offsets (a no-op when nothing new is done)."""
        if not self._dirty:
            return
        try:
            self._consumer.commit(asynchronous=False)
            self._dirty = False
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError._NO_OFFSET:
                self._dirty = False
                return
            logger.warning("offset commit failed (records will be re-read, then skipped): %s", exc)

    def lag(self) -> dict[tuple[str, int], int]:
        """Records between the position and the high watermark, per assigned partition
        that has both. The high watermark is the one the last fetch response brought (no
        request to the broker: asking it cost up to 0.5 s per partition on the consuming
        thread); a partition not fetched from yet is left out."""
        out: dict[tuple[str, int], int] = {}
        parts = self._consumer.assignment()
        if not parts:
            return out
        for tp in self._consumer.position(parts):
            try:
                _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                continue
            if tp.offset >= 0 and high >= 0:
                out[(tp.topic, tp.partition)] = max(0, high - tp.offset)
        return out

    def close(self) -> None:
        """Commit what is done and leave the group."""
        self.commit()
        self._consumer.close()


def _warn_overridden(
    config: Mapping[str, str], forced: Mapping[str, str], client: str = "consumer"
) -> None:
    """One warning line per user setting that ``forced`` overrides."""
    for key, value in forced.items():
        if key in config and str(config[key]).lower() != value.lower():
            logger.warning("kafka %s setting %s=%s overridden to %s (the consumer's guarantee"
                           " needs it)", client, key, config[key], value)  # fmt: skip


def _raw(msg: Message) -> RawRecord:
    """``msg`` as a :class:`RawRecord`: without deserializers, confluent-kafka hands out
    bytes (key, value, header values) and str header names already."""
    headers: Any = msg.headers()
    return RawRecord(
        msg.topic() or "",
        msg.partition() or 0,
        msg.offset() or 0,
        msg.key(),
        msg.value(),
        tuple(headers) if headers else (),
    )


class DeadLetterSender:
    """Writes dead letters synchronously (each ``send`` waits for Kafka's acknowledgement)."""

    def __init__(self, config: Mapping[str, str], timeout_s: float = 30.0) -> None:
        consumer_only = ("group.", "session.timeout", "auto.offset", "isolation.level",
                         "enable.auto", "max.poll", "heartbeat", "partition.assignment",
                         "fetch.", "enable.partition.eof")  # fmt: skip
        conf = {k: v for k, v in config.items() if not k.startswith(consumer_only)}
        forced = {"acks": "all", "enable.idempotence": "true"}
        _warn_overridden(conf, forced, "dead-letter producer")
        errors = QuietLibrdkafkaLog(name=__name__)

        def on_error(err: KafkaError) -> None:
            errors.log(logging.WARNING, "kafka dead-letter producer: %s", err.str())

        self._producer = Producer(
            {**conf, **forced, "error_cb": on_error}, logger=QuietLibrdkafkaLog()
        )
        self._timeout_s = timeout_s

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]],
    ) -> None:
        errors: list[KafkaError] = []

        def report(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(err)

        try:
            self._producer.produce(topic, value, key, headers=headers, on_delivery=report)
        except (KafkaException, BufferError) as exc:
            raise DeadLetterError(f"cannot produce to {topic}: {exc}") from None
        if self._producer.flush(self._timeout_s) > 0:
            raise DeadLetterError(f"no acknowledgement from {topic} in {self._timeout_s:.0f}s")
        if errors:
            raise DeadLetterError(f"cannot write to {topic}: {errors[0]}")

    def close(self) -> None:
        self._producer.flush(self._timeout_s)
