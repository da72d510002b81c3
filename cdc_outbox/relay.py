"""The CDC relay: the one place where the pipeline is wired.

    replication stream -> pgoutput decoder -> outbox mapping -> Kafka publisher -> ack tracker
                                                                                    |
    standby status update (confirmed_flush_lsn)  <----------------------------------+

Delivery contract (at-least-once, per-aggregate order):
- Transactions arrive in commit order; their events are produced in that order, so events of
  one ``aggregate_id`` (one key, one partition) reach Kafka in commit order.
- The slot is confirmed only up to the end LSN of the newest commit whose events, and those
  of every earlier transaction, Kafka has acknowledged (or durably dead-lettered). A crash at
  any point re-sends the unconfirmed window; nothing is skipped.
- A transient Kafka failure never advances the slot: the relay drops the stream and the
  producer queue and re-streams from the confirmed position (duplicates, no gaps, no reorder).
- A permanent per-record failure goes to the dead-letter topic (or halts, by setting).
- Memory is bounded by ``max_in_flight`` unacknowledged events whatever the transaction size:
  past it the relay stops reading the slot and keeps the connection alive with status updates.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cdc_outbox import pgoutput
from cdc_outbox.ack_tracker import AckTracker
from cdc_outbox.checkpoint import Checkpointer
from cdc_outbox.config import Settings
from cdc_outbox.delivery_outcomes import DeadLetterListener, DeliveryOutcomes, TxnListener
from cdc_outbox.errors import CdcOutboxError, RelayHalted
from cdc_outbox.kafka_publisher import (
    Headers,
    KafkaPublisher,
    QueueFull,
)
from cdc_outbox.lsn import Lsn
from cdc_outbox.outbox_mapping import DeadLetter, OutboxMapper, OutboxRecord
from cdc_outbox.published_marker import PublishedMarker
from cdc_outbox.relay_stats import RelayStats
from cdc_outbox.replication_stream import ReplicationError, ReplicationStream
from cdc_outbox.walproto import XLOG_HEADER_SIZE, Keepalive, parse_copy_data

logger = logging.getLogger(__name__)

_BEGIN, _COMMIT, _INSERT, _RELATION = ord("B"), ord("C"), ord("I"), ord("R")
_XLOGDATA = ord("w")
_PG_EPOCH_UNIX = 946_684_800.0  # 2000-01-01 UTC: PostgreSQL timestamps count from here
_FRAMES_PER_TURN = 2000
_PROGRESS_LOG_INTERVAL_S = 30.0


class CdcUnavailable(CdcOutboxError):
    """Logical replication cannot be used right now (auto mode falls back to polling)."""


class _Restart(Exception):
    """Tear the stream down and re-stream from the confirmed position."""


class Relay:
    """Streams one slot into Kafka until :meth:`request_stop`; see the module contract."""

    def __init__(self, settings: Settings, stats: RelayStats | None = None) -> None:
        self.settings = settings
        self.stats = stats or RelayStats()
        self._stream = ReplicationStream(
            settings.postgres_dsn(), settings.slot_name, settings.publication_name
        )
        self._mapper = OutboxMapper(
            settings.outbox_schema,
            settings.outbox_table,
            settings.column_names(),
            settings.topic_template,
        )
        self._publisher: KafkaPublisher | None = None
        marker = PublishedMarker(settings)
        self.marker = marker if marker.enabled else None
        self._relations = pgoutput.RelationCache()
        self._outbox_relations: dict[int, pgoutput.Relation] = {}
        self._tracker = AckTracker(0)
        self._stop_requested = False
        self._session_opened = False
        self._outcomes = DeliveryOutcomes(settings, self.stats, self.marker)
        self._checkpoint: Checkpointer | None = None
        self._txn_listener = TxnListener(self._outcomes, self._tracker, -1)

    # -- lifecycle -------------------------------------------------------------------------

    def start_from_fresh_slot(self, catch_up: Callable[[str], object]) -> None:
        """Create the slot, exporting a snapshot, and run ``catch_up(snapshot_name)`` (publish
        what is unpublished in it) before :meth:`run` streams from the consistent point.
        On failure the slot is left for the caller to drop."""
        _, snapshot = self._stream.create_slot()
        if self.marker is not None:
            self.marker.start()
        try:
            catch_up(snapshot)
        except BaseException:
            self._stream.close()
            raise

    def request_stop(self) -> None:
        """Ask the relay to finish the current transaction, flush, confirm and return."""
        self._stop_requested = True

    def run(self) -> None:
        """Run until stopped.

        Raises RelayHalted on a permanent delivery failure with the halt policy. With
        ``mode="auto"`` raises :class:`CdcUnavailable` when streaming cannot work (a permanent
        replication error, or ``cdc_max_failures`` failed connections in a row); otherwise a
        permanent replication error is raised as is and transient ones are retried forever.
        """
        self._publisher = KafkaPublisher(self.settings.kafka_config())
        if self.marker is not None:
            self.marker.start()
        backoff = 0.5
        failures = 0
        try:
            while not self._stop_requested:
                self._session_opened = False
                try:
                    self._stream_session()
                    backoff = 0.5
                except (_Restart, ReplicationError) as exc:
                    failures = 0 if self._session_opened else failures + 1
                    if isinstance(exc, ReplicationError):
                        self._give_up_if_unusable(exc, failures)
                    self.stats.restarts += 1
                    logger.warning(
                        "relay restarting in %.1fs: %s",
                        backoff,
                        exc,
                        extra={"mode": "cdc", "lsn": str(Lsn(self._tracker.confirmed))},
                    )
                    # Kafka trouble: drop the queue. Database trouble: let Kafka finish first,
                    # so what it acknowledges moves the restart position forward.
                    self._teardown(flush_s=0.0 if isinstance(exc, _Restart) else 10.0)
                    self._sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
        finally:
            self._teardown()
            if self._publisher is not None:
                left = self._publisher.close(timeout=0.5)
                if left:
                    logger.warning("%d records were not acknowledged; they will be re-sent", left)
            if self.marker is not None:
                self.marker.stop()
        if self._outcomes.halt_reason is not None:
            raise RelayHalted(self._outcomes.halt_reason)

    def _give_up_if_unusable(self, exc: ReplicationError, failures: int) -> None:
        if self.settings.mode == "auto" and (
            exc.permanent or failures >= self.settings.cdc_max_failures
        ):
            raise CdcUnavailable(str(exc)) from exc
        if exc.permanent:
            raise exc

    # -- one streaming session -------------------------------------------------------------

    def _stream_session(self) -> None:
        publisher = self._require_publisher()
        start = self._stream.open(self._tracker.confirmed)
        self._session_opened = True
        self._tracker = AckTracker(start)
        self._checkpoint = checkpoint = Checkpointer(
            self._stream,
            self._tracker,
            self.stats,
            start=start,
            interval_s=self.settings.status_interval_s,
        )
        self._relations.clear()
        self._outbox_relations.clear()
        self._outcomes.new_session(self._tracker)
        outcomes = self._outcomes
        self.stats.confirmed_lsn = start
        grace_deadline: float | None = None
        last_log, last_count = time.monotonic(), self.stats.events_published
        while True:
            if outcomes.halt_reason is not None:
                self._finish(grace_deadline or time.monotonic() + self.settings.shutdown_grace_s)
                self._stop_requested = True
                return
            if outcomes.restart_reason is not None:
                raise _Restart(outcomes.restart_reason)
            if self._stop_requested:
                if grace_deadline is None:
                    grace_deadline = time.monotonic() + self.settings.shutdown_grace_s
                    logger.info("stop requested: finishing the current transaction")
                if self._tracker.open_txn is None or time.monotonic() > grace_deadline:
                    self._finish(grace_deadline)
                    return
            if self._tracker.in_flight < self.settings.max_in_flight:
                self._read_turn(publisher)
            else:
                publisher.poll(0.01)
            publisher.poll(0)
            self._drain_dead_letters(publisher)
            checkpoint.maybe_send()
            self.stats.in_flight = self._tracker.in_flight
            now = time.monotonic()
            if now - last_log >= _PROGRESS_LOG_INTERVAL_S:
                rate = (self.stats.events_published - last_count) / (now - last_log)
                logger.info(
                    "published %d events (%.0f/s), confirmed %s, in flight %d",
                    self.stats.events_published,
                    rate,
                    Lsn(self._tracker.confirmed),
                    self._tracker.in_flight,
                    extra={"mode": "cdc", "lsn": str(Lsn(self._tracker.confirmed))},
                )
                last_log, last_count = now, self.stats.events_published

    def _read_turn(self, publisher: KafkaPublisher) -> None:
        """Handle the frames available now (waiting briefly if there are none)."""
        wait = 0.0 if self._tracker.in_flight or len(publisher) else 0.1
        read, tracker = self._stream.read_raw, self._tracker
        limit = self.settings.max_in_flight
        for _ in range(_FRAMES_PER_TURN):
            data = read(wait)
            if data is None:
                if tracker.in_flight:
                    publisher.poll(0.002)
                return
            wait = 0.0
            if data[0] == _XLOGDATA:
                self._handle(bytes(data[XLOG_HEADER_SIZE:]), publisher)
                if tracker.in_flight >= limit or self._stop_requested:
                    return
                continue
            frame = parse_copy_data(data)
            assert isinstance(frame, Keepalive)
            self._require_checkpoint().note_written(frame.wal_end)
            tracker.keepalive(frame.wal_end)
            if frame.reply_requested:
                self._require_checkpoint().send()

    def _handle(self, payload: bytes, publisher: KafkaPublisher) -> None:
        kind = payload[0]
        tracker = self._tracker
        if kind == _INSERT:
            oid, row = pgoutput.decode_insert(payload)
            rel = self._outbox_relations.get(oid)
            if rel is None:
                self._relations.get(oid)  # raises for a relation never described
                self._count_ignored("insert_other_table")
                return
            self._txn_listener.add_event()
            result = self._mapper.map_insert(rel, row)
            if type(result) is OutboxRecord:
                self._produce(publisher, result.topic, result.key, result.value, result.headers)
                return
            assert isinstance(result, DeadLetter)
            self._outcomes.dead_letter(self._txn_listener, result)
        elif kind == _BEGIN:
            self._txn_listener = TxnListener(self._outcomes, tracker, tracker.begin())
        elif kind == _COMMIT:
            msg = pgoutput.decode(payload)
            assert isinstance(msg, pgoutput.Commit)
            tracker.commit(self._txn_listener.txn_id, msg.end_lsn)
            self._txn_listener.committed(msg.commit_time / 1e6 + _PG_EPOCH_UNIX)
            self._require_checkpoint().note_written(msg.end_lsn)
            self.stats.transactions += 1
        elif kind == _RELATION:
            rel_msg = pgoutput.decode(payload)
            assert isinstance(rel_msg, pgoutput.Relation)
            self._relations.put(rel_msg)
            if self._mapper.is_outbox(rel_msg):
                self._outbox_relations[rel_msg.oid] = rel_msg
            else:
                self._outbox_relations.pop(rel_msg.oid, None)
        else:
            other = pgoutput.decode(payload)
            self._count_ignored(type(other).__name__.lower())

    def _produce(
        self,
        publisher: KafkaPublisher,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        listener: TxnListener | DeadLetterListener | None = None,
    ) -> None:
        """Produce, waiting (with the connection kept alive) while the queue is full."""
        listener = listener or self._txn_listener
        while True:
            try:
                publisher.produce(topic, key, value, headers, listener)
                return
            except QueueFull:
                publisher.poll(0.05)
                self._require_checkpoint().maybe_send()
                if self._outcomes.restart_reason is not None:
                    raise _Restart(self._outcomes.restart_reason) from None

    def _drain_dead_letters(self, publisher: KafkaPublisher) -> None:
        while (dead := self._outcomes.next_dead_letter()) is not None:
            topic = self.settings.dead_letter_topic
            self._produce(publisher, topic, dead.key, dead.value, dead.headers, dead.listener)

    # -- confirmation ------------------------------------------------------------------------

    def _finish(self, deadline: float) -> None:
        """Flush Kafka until ``deadline``, confirm what is acknowledged, wait for the server."""
        publisher = self._require_publisher()
        flush_deadline = deadline - 1.0
        while time.monotonic() < flush_deadline and (
            len(publisher) or self._outcomes.has_dead_letters
        ):
            publisher.poll(0.05)
            self._drain_dead_letters(publisher)
            self._require_checkpoint().maybe_send()
        self._require_checkpoint().send(reply_requested=True)
        reply_deadline = time.monotonic() + max(0.2, min(1.0, deadline - time.monotonic()))
        while time.monotonic() < reply_deadline:
            frame = self._stream.read(reply_deadline - time.monotonic())
            if isinstance(frame, Keepalive) or frame is None:
                break
        confirmed = str(Lsn(self._require_checkpoint().sent_flush))
        logger.info("stopped; confirmed %s", confirmed, extra={"mode": "cdc", "lsn": confirmed})

    # -- helpers -----------------------------------------------------------------------------

    def _teardown(self, flush_s: float = 0.0) -> None:
        self._stream.close()
        if self._publisher is not None and flush_s > 0:
            self._publisher.flush(flush_s)
        if self._publisher is not None and len(self._publisher):
            self._publisher.purge()
            self._publisher.poll(0)
        if self._publisher is not None and self._publisher.fatal_error:
            self._publisher = KafkaPublisher(self.settings.kafka_config())
        self.stats.in_flight = 0

    def _require_checkpoint(self) -> Checkpointer:
        assert self._checkpoint is not None, "a streaming session creates the checkpointer"
        return self._checkpoint

    def _require_publisher(self) -> KafkaPublisher:
        assert self._publisher is not None, "run() creates the publisher"
        return self._publisher

    def _count_ignored(self, what: str) -> None:
        self.stats.ignored[what] = self.stats.ignored.get(what, 0) + 1

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop_requested and time.monotonic() < deadline:
            time.sleep(min(0.1, deadline - time.monotonic()))
