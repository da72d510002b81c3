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
from collections import deque

from cdc_outbox import pgoutput
from cdc_outbox.ack_tracker import AckTracker
from cdc_outbox.config import Settings
from cdc_outbox.dead_letters import dead_letter_record
from cdc_outbox.errors import RelayHalted
from cdc_outbox.kafka_publisher import (
    DeliveryFailure,
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
_MIN_CONFIRM_INTERVAL_S = 1.0
_PROGRESS_LOG_INTERVAL_S = 30.0


class _Restart(Exception):
    """Tear the stream down and re-stream from the confirmed position."""


class _TxnListener:
    """Delivery outcomes of one transaction's records, reported to the tracker of its session.

    Also times the transaction: commit timestamp to its last acknowledgement."""

    __slots__ = ("commit_unix", "events", "pending", "relay", "tracker", "txn_id")

    def __init__(self, relay: Relay, tracker: AckTracker, txn_id: int) -> None:
        self.relay = relay
        self.tracker = tracker
        self.txn_id = txn_id
        self.pending = 0
        self.events = 0
        self.commit_unix = 0.0  # set at Commit

    def delivered(self, topic: str, headers: Headers) -> None:
        relay = self.relay
        relay.stats.count_published(topic)
        if relay.marker is not None:
            relay.marker.add(headers[0][1].decode())  # the mapper puts the event id first
        self.done()

    def done(self) -> None:
        self.tracker.ack(self.txn_id)
        self.pending -= 1
        if self.pending == 0 and self.commit_unix:
            self.relay._txn_acked(self)

    def failed(self, failure: DeliveryFailure) -> None:
        self.relay._on_delivery_failure(self, failure)


class _DeadLetterListener:
    """Outcome of the dead-letter record standing in for one event of a transaction."""

    __slots__ = ("intended_topic", "txn")

    def __init__(self, txn: _TxnListener, intended_topic: str) -> None:
        self.txn = txn
        self.intended_topic = intended_topic

    def delivered(self, topic: str, headers: Headers) -> None:
        self.txn.relay.stats.count_dead_lettered(self.intended_topic)
        self.txn.done()

    def failed(self, failure: DeliveryFailure) -> None:
        if failure.permanent:
            self.txn.relay._halt(f"dead-letter topic rejected a record: {failure.reason}")
        else:
            self.txn.relay._on_delivery_failure(self.txn, failure)


class Relay:
    """Streams one slot into Kafka until :meth:`request_stop`; see the module contract."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stats = RelayStats()
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
        self._restart_reason: str | None = None
        self._halt_reason: str | None = None
        self._dead_letters: deque[tuple[_TxnListener, DeliveryFailure | DeadLetter]] = deque()
        self._written = 0
        self._sent_flush = 0
        self._last_status = 0.0
        self._txn_id = -1
        self._txn_listener = _TxnListener(self, self._tracker, -1)

    # -- lifecycle -------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Ask the relay to finish the current transaction, flush, confirm and return."""
        self._stop_requested = True

    def run(self) -> None:
        """Run until stopped. Raises RelayHalted on a permanent failure with halt policy."""
        self._publisher = KafkaPublisher(self.settings.kafka_config())
        if self.marker is not None:
            self.marker.start()
        backoff = 0.5
        try:
            while not self._stop_requested:
                try:
                    self._stream_session()
                    backoff = 0.5
                except (_Restart, ReplicationError) as exc:
                    self.stats.restarts += 1
                    logger.warning("relay restarting in %.1fs: %s", backoff, exc)
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
        if self._halt_reason is not None:
            raise RelayHalted(self._halt_reason)

    # -- one streaming session -------------------------------------------------------------

    def _stream_session(self) -> None:
        publisher = self._require_publisher()
        start = self._stream.open(self._tracker.confirmed)
        self._tracker = AckTracker(start)
        self._sent_flush = self._written = start
        self._relations.clear()
        self._outbox_relations.clear()
        self._restart_reason = None
        self.stats.confirmed_lsn = start
        grace_deadline: float | None = None
        last_log, last_count = time.monotonic(), self.stats.events_published
        while True:
            if self._halt_reason is not None:
                self._finish(grace_deadline or time.monotonic() + self.settings.shutdown_grace_s)
                self._stop_requested = True
                return
            if self._restart_reason is not None:
                raise _Restart(self._restart_reason)
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
            self._maybe_send_status()
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
            if frame.wal_end > self._written:
                self._written = frame.wal_end
            tracker.keepalive(frame.wal_end)
            if frame.reply_requested:
                self._send_status()

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
            tracker.add_event(self._txn_id)
            listener = self._txn_listener
            listener.pending += 1
            listener.events += 1
            result = self._mapper.map_insert(rel, row)
            if type(result) is OutboxRecord:
                self._produce(publisher, result.topic, result.key, result.value, result.headers)
                return
            assert isinstance(result, DeadLetter)
            logger.warning("event %s dead-lettered: %s", result.event_id, result.reason)
            self._dead_letters.append((self._txn_listener, result))
        elif kind == _BEGIN:
            self._txn_id = tracker.begin()
            self._txn_listener = _TxnListener(self, tracker, self._txn_id)
        elif kind == _COMMIT:
            msg = pgoutput.decode(payload)
            assert isinstance(msg, pgoutput.Commit)
            tracker.commit(self._txn_id, msg.end_lsn)
            self._txn_listener.commit_unix = msg.commit_time / 1e6 + _PG_EPOCH_UNIX
            if msg.end_lsn > self._written:
                self._written = msg.end_lsn
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
        listener: _TxnListener | _DeadLetterListener | None = None,
    ) -> None:
        """Produce, waiting (with the connection kept alive) while the queue is full."""
        listener = listener or self._txn_listener
        while True:
            try:
                publisher.produce(topic, key, value, headers, listener)
                return
            except QueueFull:
                publisher.poll(0.05)
                self._maybe_send_status()
                if self._restart_reason is not None:
                    raise _Restart(self._restart_reason) from None

    # -- failures ---------------------------------------------------------------------------

    def _on_delivery_failure(self, listener: _TxnListener, failure: DeliveryFailure) -> None:
        """Called from a delivery report: classify, then dead-letter, halt or restart."""
        if listener.tracker is not self._tracker:
            return  # a report from a torn-down session: that window is re-streamed anyway
        self.stats.delivery_errors += 1
        if failure.permanent and not failure.fatal:
            if self.settings.on_permanent_error == "halt":
                self._halt(f"permanent delivery failure on {failure.topic}: {failure.reason}")
            else:
                logger.warning(
                    "record for %s rejected (%s); sending it to %s",
                    failure.topic,
                    failure.name,
                    self.settings.dead_letter_topic,
                )
                self._dead_letters.append((listener, failure))
        elif self._restart_reason is None:
            self._restart_reason = f"delivery failed ({failure.name}): {failure.reason}"
            if failure.fatal:
                self._restart_reason += " [fatal: new producer]"

    def _drain_dead_letters(self, publisher: KafkaPublisher) -> None:
        while self._dead_letters and self._halt_reason is None:
            listener, problem = self._dead_letters.popleft()
            if isinstance(problem, DeadLetter) and self.settings.on_permanent_error == "halt":
                self._halt(f"event {problem.event_id} cannot be published: {problem.reason}")
                return
            record = dead_letter_record(problem)
            self._produce(
                publisher,
                self.settings.dead_letter_topic,
                record.key,
                record.value,
                record.headers,
                _DeadLetterListener(listener, record.intended_topic),
            )

    def _txn_acked(self, txn: _TxnListener) -> None:
        """Every event of a committed transaction is acknowledged: record its latency."""
        if self.stats.latency_observers:
            self.stats.observe_latency(time.time() - txn.commit_unix, txn.events)

    def _halt(self, reason: str) -> None:
        if self._halt_reason is None:
            logger.error("halting: %s", reason)
            self._halt_reason = reason

    # -- confirmation ------------------------------------------------------------------------

    def _maybe_send_status(self) -> None:
        now = time.monotonic()
        since = now - self._last_status
        if since >= self.settings.status_interval_s or (
            self._tracker.confirmed > self._sent_flush and since >= _MIN_CONFIRM_INTERVAL_S
        ):
            self._send_status()

    def _send_status(self, *, reply_requested: bool = False) -> None:
        flushed = max(self._tracker.confirmed, self._sent_flush)
        self._stream.send_status(
            max(self._written, flushed), flushed, reply_requested=reply_requested
        )
        self._last_status = time.monotonic()
        if flushed > self._sent_flush:
            self._sent_flush = flushed
            self.stats.confirmed_lsn = flushed
            self.stats.last_confirm_unix = time.time()

    def _finish(self, deadline: float) -> None:
        """Flush Kafka until ``deadline``, confirm what is acknowledged, wait for the server."""
        publisher = self._require_publisher()
        flush_deadline = deadline - 1.0
        while time.monotonic() < flush_deadline and (len(publisher) or self._dead_letters):
            publisher.poll(0.05)
            self._drain_dead_letters(publisher)
            self._maybe_send_status()
        self._send_status(reply_requested=True)
        reply_deadline = time.monotonic() + max(0.2, min(1.0, deadline - time.monotonic()))
        while time.monotonic() < reply_deadline:
            frame = self._stream.read(reply_deadline - time.monotonic())
            if isinstance(frame, Keepalive) or frame is None:
                break
        logger.info("stopped; confirmed %s", Lsn(self._sent_flush))

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
        self._dead_letters.clear()
        self.stats.in_flight = 0

    def _require_publisher(self) -> KafkaPublisher:
        assert self._publisher is not None, "run() creates the publisher"
        return self._publisher

    def _count_ignored(self, what: str) -> None:
        self.stats.ignored[what] = self.stats.ignored.get(what, 0) + 1

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop_requested and time.monotonic() < deadline:
            time.sleep(min(0.1, deadline - time.monotonic()))

