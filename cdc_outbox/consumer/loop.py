"""The idempotent consumer loop: Kafka -> PostgreSQL transaction -> Kafka offsets.

Contract of :class:`IdempotentConsumer`. Records are handled one at a time in partition order.
The records of one poll (at most ``poll_batch``) share one PostgreSQL transaction from the
pool, and each record runs in its own savepoint inside it, so per record:

1. insert ``(consumer_name, event_id)`` into ``processed_events`` (``ON CONFLICT DO
   NOTHING``); no row inserted -> a duplicate: skip it;
2. if the record's key is parked (an earlier event of that key on that topic was
   dead-lettered), dead-letter it with reason ``blocked_by <event id>``;
3. otherwise run ``handler(conn, event)``. Its changes and the ``processed_events`` row are
   kept or rolled back together: applied exactly once.

After the transaction commits, the records' offsets are stored; stored offsets are committed
to Kafka every ``commit_interval_s``, before partitions are revoked and on shutdown (manual
commits only). A crash re-reads at most what was not committed; step 1 skips it.

A handler exception rolls back the record's savepoint and is retried with doubling backoff up
to ``max_attempts`` attempts; then the record goes to ``dead_letter_topic`` (headers
``cdc_outbox.error`` = reason, ``cdc_outbox.consumer``, ``cdc_outbox.original_topic`` /
``_partition`` / ``_offset``), its ``processed_events`` row is written, its key is parked
(``consumer_parked_keys``, persisted) and the loop goes on. A record without a valid ``id``
header or with an undecodable value is dead-lettered at once. A dead letter is acknowledged by
Kafka before the transaction recording it commits (a crash in between re-sends it: dead
letters are at-least-once). Database, Kafka or schema registry trouble (a broken connection,
no pool connection, a dead letter not acknowledged, a value decoder raising
``DecodeUnavailable``) rolls the whole transaction back and redoes the batch after a backoff,
indefinitely; it never dead-letters anything.

:meth:`request_stop` (SIGTERM) ends the loop after the current record (an unfinished retry is
abandoned): what is done is committed, offsets are committed, the group is left.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from cdc_outbox.consumer.events import (
    BadRecord,
    DecodeUnavailable,
    Event,
    ValueDecoder,
    decoder_for,
    event_of,
)
from cdc_outbox.consumer.metrics import ConsumerMetrics
from cdc_outbox.consumer.settings import ConsumerSettings, backoff_delay
from cdc_outbox.consumer.store import ConsumerStore
from cdc_outbox.kafka.consumer import DeadLetterError, DeadLetterSender, KafkaSource, RawRecord

logger = logging.getLogger(__name__)

__all__ = ["Handler", "IdempotentConsumer"]

Handler = Callable[[psycopg.Connection[Any], Event], Any]
_INFRA_ERRORS = (psycopg.OperationalError, PoolTimeout, DeadLetterError, DecodeUnavailable)
_LAG_INTERVAL_S = 5.0


class _HandlerFailed(Exception):
    pass


class IdempotentConsumer:
    """Runs ``handler`` once per event (see the module contract). ``pool`` lends
    non-autocommit connections to the consumer's database."""

    def __init__(
        self,
        settings: ConsumerSettings,
        pool: ConnectionPool[Any],
        handler: Handler,
        *,
        decode: ValueDecoder | None = None,
        metrics: ConsumerMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.handler = handler
        self.decode = decode or decoder_for(settings.value_format, settings.schema_registry)
        self.metrics = metrics or ConsumerMetrics(settings.consumer_name)
        self.store = ConsumerStore(settings.consumer_name, settings.schema_name)
        self._stop = threading.Event()
        self._parked: dict[tuple[str, str], str] = {}
        #: (topic, partition) currently assigned to this member (for health checks and tests).
        self.assignment: frozenset[tuple[str, int]] = frozenset()
        self._dlq: DeadLetterSender | None = None

    def request_stop(self) -> None:
        """Finish the current record, commit offsets, leave the group (thread/signal safe)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        """Consume until :meth:`request_stop`."""
        s = self.settings
        if s.create_tables:
            with self.pool.connection() as conn:
                self.store.create_tables(conn)
        self._dlq = DeadLetterSender(s.kafka_consumer_config())
        source = KafkaSource(
            s.kafka_consumer_config(), s.group_id, s.topics, self._assigned, self._revoked
        )
        logger.info("consumer %s started (group %s, topics %s)", s.consumer_name, s.group_id,
                    ", ".join(s.topics))  # fmt: skip
        next_commit = next_lag = time.monotonic()
        try:
            while not self._stop.is_set():
                records = source.poll(0.5, s.poll_batch)
                if records:
                    for record in records[: self._run_batch(records)]:
                        source.done(record)
                now = time.monotonic()
                if now >= next_commit:
                    source.commit()
                    next_commit = now + s.commit_interval_s
                if now >= next_lag:
                    self.metrics.lag(source.lag())
                    next_lag = now + _LAG_INTERVAL_S
        finally:
            source.close()
            self._dlq.close()
            logger.info("consumer %s stopped: %s", s.consumer_name, self.metrics.counts)

    # -- rebalances ------------------------------------------------------------------------
    def _assigned(self, parts: list[tuple[str, int]]) -> None:
        self.assignment = self.assignment | frozenset(parts)
        while True:  # the parked keys of every partition this member may now own
            try:
                with self.pool.connection() as conn:
                    self._parked = self.store.parked(conn)
                return
            except _INFRA_ERRORS as exc:
                logger.warning("consumer: cannot read parked keys: %s; retrying", exc)
                if self._stop.wait(self.settings.retry_backoff_s):
                    return

    def _revoked(self, parts: list[tuple[str, int]]) -> None:
        self.assignment = self.assignment - frozenset(parts)
        self.metrics.forget(parts)

    # -- one batch, one record -------------------------------------------------------------
    def _run_batch(self, records: list[RawRecord]) -> int:
        """Handle a prefix of ``records`` in one transaction; return its length (all of them
        unless stopping)."""
        while True:
            outcomes: list[tuple[str, str]] = []
            parked: dict[tuple[str, str], str] = {}
            try:
                with self.pool.connection() as conn, conn.transaction():
                    for record in records:
                        if self._stop.is_set():
                            break
                        done = self._one(conn, record, parked)
                        if done is None:
                            break
                        outcomes.append(done)
            except _INFRA_ERRORS as exc:
                logger.warning("consumer: %s; redoing the batch", exc)
                if self._stop.wait(self.settings.retry_backoff_s):
                    return 0
                continue
            self._parked.update(parked)
            for outcome, reason in outcomes:
                self.metrics.outcome(outcome, reason)
            return len(outcomes)

    def _one(
        self, conn: psycopg.Connection[Any], record: RawRecord, parked: dict[tuple[str, str], str]
    ) -> tuple[str, str] | None:
        """Finish ``record`` in a savepoint: (outcome, reason); None when stopping first."""
        try:
            event = event_of(record, self.decode)
        except BadRecord as exc:
            return self._give_up(conn, record, None, str(exc), parked)
        attempt = 0
        while True:
            try:
                with conn.transaction():
                    if self.settings.dedupe and not self.store.mark_processed(conn, event.event_id):
                        return "duplicate", ""
                    blocker = self._blocker(record, parked)
                    if blocker is not None:
                        self._dead_letter(record, f"blocked_by {blocker}")
                        return "dead_lettered", f"blocked_by {blocker}"
                    try:
                        self.handler(conn, event)
                    except Exception as exc:
                        if isinstance(exc, _INFRA_ERRORS) and conn.broken:
                            raise
                        raise _HandlerFailed() from exc
                    return "processed", ""
            except _HandlerFailed as exc:
                attempt += 1
                cause = exc.__cause__
                why = f"handler failed after {attempt} attempt(s): {type(cause).__name__}: {cause}"
                if attempt >= self.settings.max_attempts:
                    logger.error("%s; dead-lettering", why, extra={"event_id": event.event_id})
                    return self._give_up(conn, record, event, why, parked)
                self.metrics.retried()
                logger.warning("%s; retrying", why, extra={"event_id": event.event_id})
                s = self.settings
                if self._stop.wait(
                    backoff_delay(attempt, s.retry_backoff_s, s.retry_backoff_max_s)
                ):
                    return None

    def _blocker(self, record: RawRecord, parked: dict[tuple[str, str], str]) -> str | None:
        if record.key is None:
            return None
        key = (record.topic, record.key.decode(errors="replace"))
        return parked.get(key) or self._parked.get(key)

    def _give_up(
        self,
        conn: psycopg.Connection[Any],
        record: RawRecord,
        event: Event | None,
        reason: str,
        parked: dict[tuple[str, str], str],
    ) -> tuple[str, str]:
        """Dead-letter ``record`` (acknowledged by Kafka) and park its key, in a savepoint."""
        key = None if record.key is None else record.key.decode(errors="replace")
        with conn.transaction():
            if (
                event is not None
                and self.settings.dedupe
                and not self.store.mark_processed(conn, event.event_id)
            ):
                return "duplicate", ""
            blocker = self._blocker(record, parked)
            if blocker is not None:
                reason = f"blocked_by {blocker}"
            self._dead_letter(record, reason)
            if key is not None and blocker is None:
                event_id = event.event_id if event else None
                self.store.park(conn, record.topic, key, event_id, reason)
                parked[(record.topic, key)] = str(event_id) if event_id else "unknown"
        return "dead_lettered", reason

    def _dead_letter(self, record: RawRecord, reason: str) -> None:
        assert self._dlq is not None
        headers: list[tuple[str, str | bytes | None]] = list(record.headers)
        headers += [
            ("cdc_outbox.error", reason.encode()),
            ("cdc_outbox.consumer", self.settings.consumer_name.encode()),
            ("cdc_outbox.original_topic", record.topic.encode()),
            ("cdc_outbox.original_partition", str(record.partition).encode()),
            ("cdc_outbox.original_offset", str(record.offset).encode()),
        ]
        self._dlq.send(self.settings.dead_letter_topic, record.key, record.value, headers)
        logger.warning("dead-lettered %s[%d]@%d: %s", record.topic, record.partition,
                       record.offset, reason)  # fmt: skip
