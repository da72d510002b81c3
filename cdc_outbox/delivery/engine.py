"""Delivery: the one place where events meet the delivery policy, in every mode.

CDC streaming, the snapshot catch-up and the polling relay all hand their mapped events to
:meth:`Delivery.submit` with an :class:`EventHandle`, and call :meth:`Delivery.service` from
their loop. Contract (the interfaces are in :mod:`cdc_outbox.delivery.outcomes`):

- ``handle.published(topic)`` once Kafka acknowledged the event's record.
- ``handle.dead_lettered()`` once the event was dead-lettered *durably*: its dead-letter record
  acknowledged on ``dead_letter_topic`` and its outbox row marked ``FAILED`` with the reason
  (:class:`~cdc_outbox.store.failed_rows.FailedRows`), so ``redrive`` finds it in every mode.
- ``handle.retry(reason)`` when the record failed in a way that is retried (not authorised,
  producer fatal, ...): never a dead letter. ``restart_reason`` is set (and the alert in the
  stats): the caller drops the session and re-sends from its durable position.
- ``halt_reason`` is set instead of dead-lettering under ``on_permanent_error = "halt"``, and
  on a missing topic (``stats.fatal``: ``run`` ends, exit 7); the handle then never completes.
- Once an event waits for its schema (registry unreachable: a retry), nothing more is
  produced until :meth:`new_session`: later events get ``handle.retry`` at once, so none
  overtakes it.
- Events of a parked aggregate are dead-lettered with ``blocked_by <event id>`` (see
  :mod:`cdc_outbox.delivery.policy`); the mode loads the parked set from the table. Loaded
  with :meth:`~cdc_outbox.delivery.policy.Parking.load_from_position` (CDC streaming), an
  aggregate is parked only from its FAILED event on: events before it (re-streamed) are
  sent as the first time (``FailedRows.precedes``: one query per such event).
- Reports of records produced before :meth:`new_session` are ignored (they are re-sent).
- Each event is submitted with its *outbox* (:mod:`cdc_outbox.delivery.outcomes`): its id goes
  to the marker, and its dead letter is marked FAILED, in that outbox table; parking and the
  in-flight keys are per (outbox, aggregate) (:func:`~cdc_outbox.delivery.policy.parking_key`).
- With ``tracing_relay_span``, a record carrying a ``traceparent`` is produced inside a relay
  span (:class:`cdc_outbox.telemetry.tracing.RelaySpans`) whose context its headers then carry.
- The produce loop is the publisher's: it honours ``interrupted`` (stop, halt, restart) while
  the queue is full and calls ``idle`` (e.g. replication status updates) meanwhile.

Exactly-once (``delivery = "exactly_once"``): the producer is transactional and everything,
dead letters included, goes into the open Kafka transaction; outcomes then mean "written in
the transaction". The mode waits until nothing is :attr:`busy` (so dead-lettered rows are
already FAILED in PostgreSQL; with ``defer_failed``, the catch-up's wait in
``failed_after_commit`` for its checkpoint and marking), then commits
(:mod:`cdc_outbox.cdc.eos`) and calls :meth:`committed`: only then are ids handed to the
``marker`` (a ``PublishListener``). Any failure aborts (:meth:`abandon`): a record the
broker rejected is remembered and dead-lettered up front when it is re-sent.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import psycopg

from cdc_outbox.config.delivery import DeliverySection
from cdc_outbox.delivery.dead_letters import dead_letter_of, dead_letter_record, event_id_of
from cdc_outbox.delivery.encoding import serializer, wire_form
from cdc_outbox.delivery.outcomes import EventHandle, PublishListener
from cdc_outbox.delivery.policy import (
    FailureAction,
    KeysInFlight,
    Parking,
    blocked_reason,
    on_encode_failure,
    on_failure,
    parking_key,
)
from cdc_outbox.delivery.producer import new_publisher, txn_timeout_s
from cdc_outbox.delivery.reports import DeadLetterReport, RecordReport, rows_by_outbox
from cdc_outbox.errors import topic_missing
from cdc_outbox.kafka.delivery_failure import DeliveryFailure, DeliveryListener
from cdc_outbox.kafka.publisher import ProducerFactory
from cdc_outbox.records import DeadLetter, OutboxRecord
from cdc_outbox.store.failed_rows import FailedRowsStore
from cdc_outbox.telemetry.relay_stats import RelayStats
from cdc_outbox.telemetry.tracing import RelaySpans

logger = logging.getLogger(__name__)

_MARK_RETRY_S = 1.0


class Delivery:
    """The producer plus the delivery policy for one relay (see the module contract)."""

    def __init__(
        self,
        section: DeliverySection,
        stats: RelayStats,
        *,
        marker: PublishListener | None = None,
        failed_rows: FailedRowsStore | None = None,
        transactional_id: str | None = None,
        producer_client: ProducerFactory | None = None,
        interrupted: Callable[[], str | None] = lambda: None,
        idle: Callable[[], None] = lambda: None,
    ) -> None:
        self.section = section
        self._producer_client = producer_client
        self.transactional_id = transactional_id
        self.eos = transactional_id is not None
        #: exactly-once: acknowledged (id, outbox), marked after commit
        self.marks: list[tuple[bytes, int]] = []
        self.rejected: dict[str, DeliveryFailure] = {}  # exactly-once: broker rejections
        self._txn_ready = False
        self.stats = stats
        self.marker = marker
        self.failed_rows = failed_rows
        self.parking = Parking()
        self.keys = KeysInFlight()
        self.epoch = 0
        self.restart_reason: str | None = None
        self.halt_reason: str | None = None
        self.to_mark: list[DeadLetterReport] = []
        #: Exactly-once catch-up: ``(event id, reason, outbox)`` of acknowledged dead letters,
        #: marked FAILED by the catch-up only after the Kafka commit (the redo of an aborted
        #: batch dead-letters them again).
        self.defer_failed = False
        self.failed_after_commit: list[tuple[str, str, int]] = []
        self.interrupted = interrupted  # the produce loop's stop question (see the contract)
        self.idle = idle  # called while the producer queue is full
        self._halt_policy = section.halt_on_permanent_error
        self._max_bytes = section.max_record_bytes
        self._fast_bytes = section.max_record_bytes // 2
        self._dead: deque[tuple[EventHandle, DeadLetter | DeliveryFailure, str, int]] = deque()
        self.dead_in_flight = 0  # dead-letter records produced, not yet reported
        self._mark_after = 0.0
        self._replace_producer = False
        self._held: str | None = None
        self.publisher = new_publisher(section, transactional_id, producer_client)
        self.avro = serializer(section.avro)
        self._spans: RelaySpans | None = RelaySpans() if section.tracing_relay_span else None

    # -- sessions ------------------------------------------------------------------------

    def new_session(self) -> None:
        """Forget everything in flight (it will be sent again); a fatal producer is replaced."""
        self.epoch += 1
        self.restart_reason = None
        self._held = None
        self._dead.clear()
        self.dead_in_flight = 0
        self.to_mark.clear()
        self.failed_after_commit.clear()
        self.keys.clear()
        self.marks.clear()
        if self.publisher.fatal_error or self._replace_producer:
            reason = self.publisher.fatal_error or "produce raised a fatal error"
            logger.warning("new Kafka producer after a fatal error: %s", reason)
            self.publisher.close(timeout=0)
            self.publisher = new_publisher(
                self.section, self.transactional_id, self._producer_client
            )
            self._replace_producer = False
            self._txn_ready = False

    def ensure_transactions(self) -> None:
        """Exactly-once, once per producer and only as the leader: ``init_transactions`` fences
        any older producer with our transactional.id and aborts its open transaction. Raises
        ``TransactionFailed``."""
        if self.eos and not self._txn_ready:
            self.publisher.init_transactions(self.txn_timeout_s())
            self._txn_ready = True
            logger.info("Kafka transactions ready (transactional.id %s)", self.transactional_id)

    def committed(self) -> None:
        """Exactly-once: the Kafka transaction committed; acknowledged ids go to the marker."""
        self.stats.eos_commits += 1
        if self.marker is not None:
            for event_id, outbox in self.marks:
                self.marker.add(event_id, outbox)
        self.marks.clear()

    def txn_timeout_s(self) -> float:
        """How long a Kafka transaction call may block."""
        return txn_timeout_s(self.section)

    def abandon(self) -> None:
        """Drop what is queued in the producer (its reports are ignored), abort the open Kafka
        transaction (exactly-once) and start over."""
        from cdc_outbox.kafka.publisher import TransactionFailed

        self.epoch += 1
        if self.eos and self._txn_ready:
            if self.publisher.txn_records:
                self.stats.eos_aborts += 1
            try:
                self.publisher.abort(10.0)
            except TransactionFailed as exc:
                logger.warning("aborting the Kafka transaction failed (%s): new producer", exc)
                self._replace_producer = True
        elif len(self.publisher):
            self.publisher.purge()
        self.publisher.poll(0)
        self.new_session()

    def close(self, timeout: float = 0.5) -> int:
        """Flush up to ``timeout`` s, then drop the producer; returns records left unsent.
        Exactly-once: the open Kafka transaction is aborted (never left to time out)."""
        if self.eos and self._txn_ready:
            self.abandon()
            self._txn_ready = False
        left = self.publisher.close(timeout)
        if self.failed_rows is not None:
            self.failed_rows.close()
        return left

    @property
    def busy(self) -> bool:
        """Records queued or in flight, or dead letters not yet settled."""
        return bool(len(self.publisher) or self._dead or self.to_mark)

    @property
    def dead_letters_pending(self) -> bool:
        """Dead letters waiting, in flight or not yet marked ``FAILED``: exactly-once must
        settle them before the commit."""
        return bool(self._dead or self.dead_in_flight or self.to_mark)

    # -- events --------------------------------------------------------------------------

    def submit(
        self, result: OutboxRecord | DeadLetter, handle: EventHandle, outbox: int = 0
    ) -> None:
        """Publish one mapped event of ``outbox`` (see the module contract) or dead-letter/park
        it; outcome via ``handle``. Once halted, nothing more is produced (the handle never
        completes)."""
        if self.halt_reason is not None:
            return
        if self._held is not None:  # an event waits for its schema: nothing may overtake it
            handle.retry(self._held)
            return
        if self.rejected and type(result) is OutboxRecord and result.event_id in self.rejected:
            failure = self.rejected.pop(result.event_id)
            self._dead_letter_rejected(handle, result.event_id, failure, outbox)
            return
        if type(result) is OutboxRecord:
            key = result.key
            pkey = key if outbox <= 0 else parking_key(outbox, key)
            assert pkey is not None
            blocker = None
            if len(self.parking):  # the comparison may raise psycopg.Error: the mode restarts
                rows = self.failed_rows
                precedes = None
                if rows is not None:
                    table = max(outbox, 0)
                    precedes = lambda e, b: rows.precedes(e, b, table)  # noqa: E731
                blocker = self.parking.blocked_by(pkey, result.event_id, precedes)
            if blocker is None:
                wire = wire_form(self.avro, result, self._fast_bytes, self._max_bytes)
                if type(wire) is tuple:
                    self.keys.add(pkey)
                    headers = result.headers
                    report: DeliveryListener = RecordReport(
                        self, handle, pkey, result.event_id, outbox
                    )
                    if self._spans is not None:
                        headers, report = self._spans.start(
                            result.topic, result.event_id, headers, report
                        )
                    self.publisher.produce(
                        result.topic,
                        wire[0],
                        wire[1],
                        headers,
                        report,
                        interrupted=self.interrupted,
                        idle=self.idle,
                    )
                    return
                if not isinstance(wire, DeadLetter):  # Avro encoding failed: retry or dead letter
                    assert not isinstance(wire, tuple)
                    if on_encode_failure(wire.kind, self._halt_policy) is FailureAction.RETRY:
                        self._held = wire.reason
                        self.restart(wire.reason)
                        handle.retry(wire.reason)
                        return
                    wire = dead_letter_of(result, wire.reason)
                result = wire  # too large, null key: the dead letter carries no value
            else:
                result = dead_letter_of(result, blocked_reason(blocker, result.event_id))
        assert isinstance(result, DeadLetter)
        self.reject(handle, result, outbox)

    def reject(self, handle: EventHandle, problem: DeadLetter, outbox: int = 0) -> None:
        """An event of ``outbox`` that cannot be published: halt, or dead-letter it and park
        its aggregate."""
        blocked = problem.reason.startswith("blocked_by ")
        if self._halt_policy and not blocked:
            self.halt(f"event {problem.event_id} cannot be published: {problem.reason}")
            return
        if problem.event_id is not None:
            self.parking.park(parking_key(outbox, problem.key), problem.event_id)
        self._log_dead(problem.event_id, problem.key, problem.intended_topic, problem.reason)
        self._dead.append((handle, problem, problem.reason, outbox))

    def record_failed(self, sent: RecordReport, failure: DeliveryFailure) -> None:
        """Kafka refused ``sent``'s record: apply the policy (called from delivery reports)."""
        later = self.keys.done(sent.key)
        self.stats.delivery_errors += 1
        action = on_failure(failure, self._halt_policy)
        if failure.alert == "topic_missing":  # cannot heal: run ends; the handle never completes
            self.stats.count_retry("topic_missing")
            self.halt(self.stats.fail(topic_missing(failure.topic, failure.reason)))
        elif action is FailureAction.DEAD_LETTER and self.eos:
            # The transaction is now abortable: abort, re-send, dead-letter this one up front.
            self.rejected[sent.event_id] = failure
            self.restart(f"Kafka rejected event {sent.event_id} in a transaction", failure)
            sent.handle.retry(failure.reason)
        elif action is FailureAction.DEAD_LETTER:
            if later:
                self.stats.order_broken += 1
                logger.error(
                    "order broken for aggregate %s: %d later records were already sent when"
                    " Kafka rejected event %s (%s)",
                    sent.key.decode(errors="replace"),
                    later,
                    sent.event_id,
                    failure.name,
                )
            self.parking.park(sent.key, sent.event_id)
            reason = f"{failure.name}: {failure.reason}"
            self._log_dead(sent.event_id, failure.key, failure.topic, reason)
            self._dead.append((sent.handle, failure, reason, sent.outbox))
        elif action is FailureAction.HALT:
            self.halt(f"Kafka rejected event {sent.event_id} on {failure.topic}: {failure.reason}")
        else:
            self.restart(f"delivery failed ({failure.name}): {failure.reason}", failure)
            sent.handle.retry(f"{failure.name}: {failure.reason}")

    def _dead_letter_rejected(
        self, handle: EventHandle, event_id: str, failure: DeliveryFailure, outbox: int
    ) -> None:
        """Exactly-once: the re-sent event the broker rejected in an aborted transaction."""
        self.parking.park(parking_key(outbox, failure.key), event_id)
        reason = f"{failure.name}: {failure.reason}"
        self._log_dead(event_id, failure.key, failure.topic, reason)
        self._dead.append((handle, failure, reason, outbox))

    # -- the loop's turn ---------------------------------------------------------------------

    def service(self) -> None:
        """Serve reports, produce pending dead letters, mark acknowledged ones FAILED."""
        self.publisher.poll(0)
        while self._dead and self.halt_reason is None:
            handle, problem, reason, outbox = self._dead.popleft()
            record = dead_letter_record(problem)
            event_id = event_id_of(record.headers)
            self.dead_in_flight += 1
            self.publisher.produce(
                self.section.dead_letter_topic,
                record.key,
                record.value,
                record.headers,
                DeadLetterReport(self, handle, event_id, reason, record.intended_topic, outbox),
                interrupted=self.interrupted,
                idle=self.idle,
            )
        if self.to_mark and time.monotonic() >= self._mark_after:
            self._mark_failed()

    def _mark_failed(self) -> None:
        batch = self.to_mark
        by_outbox = rows_by_outbox(batch)
        if self.defer_failed:
            self.failed_after_commit += [
                (i, r, n) for n, rows in by_outbox.items() for i, r in rows
            ]
        elif self.failed_rows is not None:
            try:
                for outbox, rows in by_outbox.items():
                    self.failed_rows.mark(rows, outbox)
            except psycopg.Error as exc:
                self._mark_after = time.monotonic() + _MARK_RETRY_S
                count = sum(map(len, by_outbox.values()))
                logger.warning("marking %d dead-lettered rows FAILED failed: %s", count, exc)
                return
        self.to_mark = []
        for dead in batch:
            dead.handle.dead_lettered()

    def halt(self, reason: str) -> None:
        if self.halt_reason is None:
            logger.error("halting: %s", reason, extra={"mode": self.stats.mode})
            self.halt_reason = reason

    def restart(self, reason: str, failure: DeliveryFailure | None = None) -> None:
        if failure is not None and failure.alert is not None:
            self.stats.count_retry(failure.alert)
        if failure is not None and failure.producer_fatal:
            self._replace_producer = True
        if self.restart_reason is None:
            self.restart_reason = reason

    def _log_dead(
        self, event_id: str | None, key: bytes | None, topic: str | None, reason: str
    ) -> None:
        aggregate_id = (key or b"").decode(errors="replace")
        context = {"event_id": event_id, "aggregate_id": aggregate_id, "topic": topic}
        logger.warning("event %s dead-lettered: %s", event_id, reason, extra=context)
