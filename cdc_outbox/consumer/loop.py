"""The idempotent consumer loop: Kafka -> one PostgreSQL transaction per record -> offsets.

Contract of :class:`IdempotentConsumer`, per record (in partition order, one at a time):

1. In one transaction from the pool: insert ``(consumer_name, event_id)`` into
   ``processed_events`` (``ON CONFLICT DO NOTHING``). No row inserted -> a duplicate: skip.
2. If the record's key is parked (an earlier event of that key on that topic was
   dead-lettered), dead-letter it with reason ``blocked_by <event id>``, commit, next record.
3. Otherwise run ``handler(conn, event)`` in that transaction and commit. The handler's
   changes and the ``processed_events`` row commit together: applied exactly once.
4. Only then is the record's offset stored; stored offsets are committed to Kafka every
   ``commit_interval_s``, before partitions are revoked and on shutdown (manual commits only).
   A crash re-reads at most what was not committed; step 1 skips it.

A handler exception rolls the transaction back and is retried with doubling backoff up to
``max_attempts`` attempts; then the record goes to ``dead_letter_topic`` (headers
``cdc_outbox.error`` = reason, ``cdc_outbox.consumer``, ``cdc_outbox.original_topic`` /
``_partition`` / ``_offset``) and its key is parked (persisted in ``consumer_parked_keys``),
its ``processed_events`` row written, and the loop goes on. A record without a valid ``id``
header or with an undecodable value is dead-lettered at once. The dead letter is acknowledged
by Kafka before the transaction that records it commits (a crash in between re-sends it: dead
letters are at-least-once). Database or Kafka trouble (not the handler's fault) is retried
with backoff indefinitely and never dead-letters anything.

:meth:`request_stop` (SIGTERM) ends the loop after the current record (an unfinished retry is
abandoned and rolled back); stored offsets are committed and the group is left.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from cdc_outbox.consumer.events import BadRecord, Event, ValueDecoder, decoder_for, event_of
from cdc_outbox.consumer.metrics import ConsumerMetrics
from cdc_outbox.consumer.settings import ConsumerSettings, backoff_delay
from cdc_outbox.consumer.store import ConsumerStore
from cdc_outbox.kafka.consumer import DeadLetterError, DeadLetterSender, KafkaSource, RawRecord

logger = logging.getLogger(__name__)

__all__ = ["Handler", "IdempotentConsumer"]

Handler = Callable[[psycopg.Connection[Any], Event], Any]
_INFRA_ERRORS = (psycopg.OperationalError, PoolTimeout, DeadLetterError)
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
        self.decode = decode or decoder_for(settings.value_format)
        self.metrics = metrics or ConsumerMetrics(settings.consumer_name)
        self.store = ConsumerStore(settings.consumer_name, settings.schema_name)
        self._stop = threading.Event()
        self._parked: dict[tuple[str, str], str] = {}
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
                for record in source.poll(0.5, s.poll_batch):
                    if not self._process(record):
                        break  # stopping: this record is not done
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
        self._parked = self._with_retry(self._load_parked) or {}

    def _load_parked(self) -> dict[tuple[str, str], str]:
        with self.pool.connection() as conn:
            return self.store.parked(conn)

    def _revoked(self, parts: list[tuple[str, int]]) -> None:
        self.metrics.forget(parts)

    # -- one record --------------------------------------------------------------------------
    def _process(self, record: RawRecord) -> bool:
        """Finish ``record``; False when stopping before it was finished."""
        try:
            event = event_of(record, self.decode)
        except BadRecord as exc:
            return self._finish_dead(record, None, str(exc))
        attempt = 0
        while True:
            try:
                outcome = self._attempt(record, event)
            except _HandlerFailed as exc:
                attempt += 1
                cause = exc.__cause__
                why = f"handler failed after {attempt} attempt(s): {type(cause).__name__}: {cause}"
                if attempt >= self.settings.max_attempts:
                    logger.error("%s; dead-lettering", why, extra={"event_id": event.event_id})
                    return self._finish_dead(record, event, why)
                self.metrics.retried()
                logger.warning("%s; retrying", why, extra={"event_id": event.event_id})
                s = self.settings
                if self._stop.wait(
                    backoff_delay(attempt, s.retry_backoff_s, s.retry_backoff_max_s)
                ):
                    return False
                continue
            except _INFRA_ERRORS as exc:
                logger.warning("consumer: %s; retrying", exc)
                if self._stop.wait(self.settings.retry_backoff_s):
                    return False
                continue
            self.metrics.outcome(outcome)
            return True

    def _finish_dead(self, record: RawRecord, event: Event | None, reason: str) -> bool:
        return self._with_retry(lambda: self._give_up(record, event, reason)) is not None

    def _attempt(self, record: RawRecord, event: Event) -> str:
        with self.pool.connection() as conn, conn.transaction():
            if self.settings.dedupe and not self.store.mark_processed(conn, event.event_id):
                return "duplicate"
            blocker = self._blocker(record)
            if blocker is not None:
                self._dead_letter(record, f"blocked_by {blocker}")
                return "dead_lettered"
            try:
                with conn.transaction():  # a savepoint: the handler's failure is its own
                    self.handler(conn, event)
            except Exception as exc:
                raise _HandlerFailed() from exc
            return "processed"

    def _blocker(self, record: RawRecord) -> str | None:
        if record.key is None:
            return None
        return self._parked.get((record.topic, record.key.decode(errors="replace")))

    def _give_up(self, record: RawRecord, event: Event | None, reason: str) -> str:
        """Dead-letter ``record`` and park its key, in one transaction (after Kafka's ack)."""
        key = None if record.key is None else record.key.decode(errors="replace")
        with self.pool.connection() as conn, conn.transaction():
            if (
                event is not None
                and self.settings.dedupe
                and not self.store.mark_processed(conn, event.event_id)
            ):
                self.metrics.outcome("duplicate")
                return "duplicate"
            blocker = self._blocker(record)
            if blocker is not None:
                reason = f"blocked_by {blocker}"
            self._dead_letter(record, reason)
            if key is not None and blocker is None:
                self.store.park(conn, record.topic, key, event.event_id if event else None, reason)
        if key is not None and blocker is None:
            self._parked[(record.topic, key)] = str(event.event_id) if event else "unknown"
        self.metrics.outcome("dead_lettered", reason)
        return "dead_lettered"

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

    def _with_retry(self, step: Callable[[], Any]) -> Any:
        """Run ``step`` until it gets past database/Kafka trouble; None when stopping first."""
        while True:
            try:
                return step()
            except _INFRA_ERRORS as exc:
                logger.warning("consumer: %s; retrying", exc)
                if self._stop.wait(self.settings.retry_backoff_s):
                    return None
