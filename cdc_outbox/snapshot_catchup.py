"""Returning to CDC: publish the rows still unpublished in a new slot's exported snapshot.

When a slot is (re)created, rows committed before its consistent point will never be streamed.
Those still PENDING in the slot's exported snapshot are published here, all acknowledged,
before streaming starts from the consistent point, so nothing falls between polling and CDC
and per-aggregate order holds across the switch (snapshot rows go first, in ``created_at``
order, then the stream in commit order).

At-least-once: a row published here and not yet marked when the process dies stays PENDING and
may be published again by a later pass (duplicates, never losses).
"""

from __future__ import annotations

import logging
import time

import psycopg
from psycopg import sql

from cdc_outbox.config import Settings
from cdc_outbox.dead_letters import dead_letter_record
from cdc_outbox.errors import CdcOutboxError
from cdc_outbox.kafka_publisher import DeliveryFailure, Headers, KafkaPublisher, QueueFull
from cdc_outbox.outbox_mapping import DeadLetter, OutboxMapper
from cdc_outbox.published_marker import PublishedMarker
from cdc_outbox.relay_stats import RelayStats

logger = logging.getLogger(__name__)

_FETCH = 1_000


class CatchUpFailed(CdcOutboxError):
    """The backlog could not be published (Kafka trouble); the new slot must be dropped."""


class _Outcome:
    """Counts acknowledgements of backlog records; remembers the first transient failure."""

    def __init__(self, stats: RelayStats, marker: PublishedMarker | None) -> None:
        self.pending = 0
        self.error: str | None = None
        self.dead: list[DeliveryFailure] = []
        self._stats = stats
        self._marker = marker

    def delivered(self, topic: str, headers: Headers) -> None:
        self.pending -= 1
        self._stats.count_published(topic)
        if self._marker is not None:
            self._marker.add(headers[0][1])

    def failed(self, failure: DeliveryFailure) -> None:
        if failure.permanent:
            self.dead.append(failure)  # dead-lettered below; still counts as pending
        else:
            self.pending -= 1
            self.error = self.error or f"{failure.name}: {failure.reason}"


class _DeadLetterOutcome:
    """Outcome of a dead-letter record standing in for one backlog row."""

    def __init__(self, outcome: _Outcome, stats: RelayStats, intended_topic: str) -> None:
        self._outcome = outcome
        self._stats = stats
        self._topic = intended_topic

    def delivered(self, topic: str, headers: Headers) -> None:
        self._outcome.pending -= 1
        self._stats.count_dead_lettered(self._topic)

    def failed(self, failure: DeliveryFailure) -> None:
        self._outcome.pending -= 1
        self._outcome.error = self._outcome.error or f"dead-letter topic: {failure.reason}"


def publish_snapshot_backlog(
    settings: Settings,
    snapshot: str,
    stats: RelayStats,
    marker: PublishedMarker | None,
) -> int:
    """Publish every PENDING row visible in ``snapshot``; returns how many. Raises
    :class:`CatchUpFailed` unless all were acknowledged (or durably dead-lettered)."""
    mapper = OutboxMapper(
        settings.outbox_schema,
        settings.outbox_table,
        settings.column_names(),
        settings.topic_template,
    )
    # PROCESSING rows were claimed by a polling worker that has stopped: their outcome is
    # unknown, so they are published again (duplicates, never losses).
    query = sql.SQL(
        "SELECT {} FROM {} WHERE status IN ('PENDING', 'PROCESSING') ORDER BY created_at, ctid"
    ).format(
        sql.SQL(", ").join(
            sql.SQL("{}::text").format(sql.Identifier(n)) for n in mapper.row_columns
        ),
        sql.Identifier(settings.outbox_schema, settings.outbox_table),
    )
    publisher = KafkaPublisher(settings.kafka_config())
    outcome = _Outcome(stats, marker)
    count = 0
    with psycopg.connect(settings.postgres_dsn()) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
            with conn.cursor(name="cdc_outbox_backlog") as cur:
                cur.itersize = _FETCH
                cur.execute(query)
                for values in cur:
                    result = mapper.map_row(values)
                    if isinstance(result, DeadLetter):
                        _dead_letter(publisher, outcome, stats, settings, result)
                    else:
                        _produce(
                            publisher,
                            outcome,
                            outcome,
                            (result.topic, result.key, result.value, result.headers),
                        )
                    count += 1
    _wait(publisher, outcome, stats, settings)
    publisher.close(1.0)
    logger.info("published %d rows pending in the new slot's snapshot", count)
    return count


_Record = tuple[str, bytes | None, bytes | None, Headers]


def _produce(
    publisher: KafkaPublisher,
    outcome: _Outcome,
    listener: _Outcome | _DeadLetterOutcome,
    record: _Record,
) -> None:
    outcome.pending += 1
    while True:
        try:
            publisher.produce(*record, listener)
            return
        except QueueFull:
            publisher.poll(0.05)
        if outcome.error is not None:
            raise CatchUpFailed(f"publishing the snapshot backlog failed: {outcome.error}")


def _dead_letter(
    publisher: KafkaPublisher,
    outcome: _Outcome,
    stats: RelayStats,
    settings: Settings,
    problem: DeadLetter | DeliveryFailure,
) -> None:
    record = dead_letter_record(problem)
    listener = _DeadLetterOutcome(outcome, stats, record.intended_topic)
    dead = (settings.dead_letter_topic, record.key, record.value, record.headers)
    _produce(publisher, outcome, listener, dead)


def _wait(
    publisher: KafkaPublisher, outcome: _Outcome, stats: RelayStats, settings: Settings
) -> None:
    deadline = time.monotonic() + max(60.0, settings.shutdown_grace_s)
    while outcome.pending > 0 and outcome.error is None:
        if time.monotonic() > deadline:
            raise CatchUpFailed("the snapshot backlog was not acknowledged in time")
        publisher.poll(0.05)
        while outcome.dead:
            outcome.pending -= 1  # the original is settled once its dead letter is acked
            _dead_letter(publisher, outcome, stats, settings, outcome.dead.pop())
    if outcome.error is not None:
        raise CatchUpFailed(f"publishing the snapshot backlog failed: {outcome.error}")
