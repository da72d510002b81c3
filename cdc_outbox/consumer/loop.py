"""The idempotent consumer loop: Kafka -> PostgreSQL transaction -> Kafka offsets.

Contract of :class:`IdempotentConsumer`. Records are finished in partition order. For each
event, its ``processed_events`` row ``(consumer_name, event_id)`` and the handler's changes
commit in one transaction, or neither does; offsets are stored only after that COMMIT, and
committed to Kafka every ``commit_interval_s``, before partitions are revoked and on shutdown
(manual commits only). A crash re-reads at most what was not committed; the row skips it.

The records of one poll (at most ``poll_batch``) take the fast path
(:meth:`cdc_outbox.consumer.apply.Applier.fast`): one transaction, the batch's rows inserted
by one statement (after a duplicate, ``ON CONFLICT DO NOTHING``: an id not inserted is a
duplicate, skipped),
then for each new event, in order: a record whose key is parked (an earlier event of that key
on that topic was dead-lettered) is dead-lettered with reason ``blocked_by <event id>``;
otherwise ``handler(conn, event)`` runs. Then COMMIT.

When a handler raises there, the transaction is rolled back; the records before it are redone
on the fast path, and that record on the slow path (:meth:`~cdc_outbox.consumer.apply.Applier.one`:
a transaction of its own, retried with doubling backoff, ``max_attempts`` handler calls in all
counting the batch's: ``retry_backoff_s`` after the batch's, twice that after the next, up to
``retry_backoff_max_s``; then the record
goes to ``dead_letter_topic`` with headers ``cdc_outbox.error`` = reason,
``cdc_outbox.consumer``, ``cdc_outbox.original_topic`` / ``_partition`` / ``_offset``, its
``processed_events`` row is written and its key parked in ``consumer_parked_keys``). When the
COMMIT fails (a deferred constraint, a serialization failure), the batch's records are redone
one transaction each, after ``retry_backoff_s``, until the one whose COMMIT fails has been
retried and finished the same way (the batch's COMMIT counted as its first attempt); then the
fast path goes on. A record without a valid ``id`` header or with an undecodable
value is dead-lettered at once. A dead letter is acknowledged by Kafka before the transaction
recording it commits (a crash in between re-sends it: dead letters are at-least-once).

Database, Kafka or schema registry trouble (a lost connection, no pool connection, a dead
letter not acknowledged, a value decoder raising ``DecodeUnavailable``) never dead-letters
anything: what is finished before it is committed when the transaction is intact, and the
rest is redone from the first unfinished record after ``retry_backoff_s``, indefinitely. A
lost connection loses its open transaction: the events handled in it are handled again
(docs/consumers.md lists every case in which a handler sees an event twice).

:meth:`request_stop` (SIGTERM) ends the loop after the current record (an unfinished retry is
abandoned): what is done is committed, offsets are committed, the group is left.
A handler raising a ``BaseException`` that is not an ``Exception`` (``SystemExit``...) ends
:meth:`~IdempotentConsumer.run` with :class:`~cdc_outbox.consumer.apply.HandlerAborted`
(``KeyboardInterrupt`` as is): its transaction rolled back, its offset not stored, what was
finished before it committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from cdc_outbox.consumer.apply import INFRA_ERRORS, Applier, CommitFailed, HandlerFailed, Item
from cdc_outbox.consumer.event_types import BadRecord, DecodeUnavailable, Event, ValueDecoder
from cdc_outbox.consumer.events import decoder_for, event_of
from cdc_outbox.consumer.metrics import ConsumerMetrics
from cdc_outbox.consumer.settings import ConsumerSettings
from cdc_outbox.kafka.consumer import DeadLetterSender, KafkaSource, RawRecord
from cdc_outbox.store.processed_events import ConsumerStore

logger = logging.getLogger(__name__)

__all__ = ["Handler", "IdempotentConsumer"]

Handler = Callable[[psycopg.Connection[Any], Event], Any]
_LAG_INTERVAL_S = 5.0


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
        dead_letters = DeadLetterSender(s.kafka_consumer_config())
        applier = Applier(s, self.pool, self.handler, self.store, dead_letters, self._parked,
                          self._stop, self.metrics)  # fmt: skip
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
                    self._consume(records, applier, source)
                now = time.monotonic()
                if now >= next_commit:
                    source.commit()
                    next_commit = now + s.commit_interval_s
                if now >= next_lag:
                    self.metrics.lag(source.lag())
                    next_lag = now + _LAG_INTERVAL_S
        finally:
            source.close()
            dead_letters.close()
            logger.info("consumer %s stopped: %s", s.consumer_name, self.metrics.counts)

    # -- rebalances ------------------------------------------------------------------------
    def _assigned(self, parts: list[tuple[str, int]]) -> None:
        self.assignment = self.assignment | frozenset(parts)
        while True:  # the parked keys of every partition this member may now own
            try:
                with self.pool.connection() as conn:
                    parked = self.store.parked(conn)
                self._parked.clear()
                self._parked.update(parked)
                return
            except INFRA_ERRORS as exc:
                logger.warning("consumer: cannot read parked keys: %s; retrying", exc)
                if self._stop.wait(self.settings.retry_backoff_s):
                    return

    def _revoked(self, parts: list[tuple[str, int]]) -> None:
        self.assignment = self.assignment - frozenset(parts)
        self.metrics.forget(parts)

    # -- one poll --------------------------------------------------------------------------
    def _consume(self, records: list[RawRecord], applier: Applier, source: KafkaSource) -> None:
        """Finish ``records`` in order (all of them unless stopping); the offsets of each
        committed part are stored at once."""
        items: list[Item] = []  # items[i] is records[i], decoded
        pos = 0
        suspect: int | None = None  # its handler raised on the fast path: goes alone
        failure: HandlerFailed | None = None  # the suspect's (its first attempt)
        alone_until = 0  # a COMMIT failed: records before this index go one by one
        s = self.settings
        while pos < len(records) and not self._stop.is_set():
            if len(items) == pos:
                try:
                    self._decode(records, items)
                except DecodeUnavailable as exc:
                    if len(items) == pos:
                        self._trouble(exc, records[pos])
                        continue
            try:
                if pos == suspect or pos < alone_until:
                    if pos == suspect:  # the batch made its first attempt
                        result = applier.one(items[pos], tried=1, failure=failure)
                    else:  # the batch's COMMIT was its first attempt (waited for below)
                        result = applier.one(items[pos], tried=1)
                    if result is None:
                        return
                    outcomes, trouble = [result[0]], None
                    if result[1] or pos == suspect:
                        suspect, alone_until = None, 0
                else:
                    end = len(items) if suspect is None else suspect
                    outcomes, trouble = applier.fast(items[pos:end])
            except HandlerFailed as exc:
                suspect, failure = pos + exc.index, exc
                continue
            except CommitFailed as exc:
                logger.warning("consumer: COMMIT failed: %s; redoing %d record(s) one by one",
                               exc.__cause__, exc.count)  # fmt: skip
                alone_until = pos + exc.count
                self.metrics.retried()
                self._stop.wait(s.retry_backoff.delay(1))
                continue
            except INFRA_ERRORS as exc:
                self._trouble(exc, records[pos])
                continue
            self.metrics.record(outcomes)
            if outcomes:
                source.done(records[pos : pos + len(outcomes)])
                pos += len(outcomes)
            if trouble is not None:
                self._trouble(trouble, records[pos])

    def _decode(self, records: list[RawRecord], items: list[Item]) -> None:
        """Extend ``items`` with the events of the records after them (the reason, for a
        record that has none); stops at :class:`DecodeUnavailable`, which it raises."""
        for record in records[len(items) :]:
            try:
                items.append((record, event_of(record, self.decode)))
            except BadRecord as exc:
                items.append((record, str(exc)))

    def _trouble(self, exc: BaseException, record: RawRecord) -> None:
        logger.warning("consumer: %s; redoing the batch from %s[%d]@%d", exc, record.topic,
                       record.partition, record.offset)  # fmt: skip
        self._stop.wait(self.settings.retry_backoff_s)
