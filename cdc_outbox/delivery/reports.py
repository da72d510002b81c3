"""Kafka delivery reports, routed back to :class:`~cdc_outbox.delivery.engine.Delivery`.

- :class:`RecordReport`: an event's record on its topic. Acknowledged: its key leaves the
  in-flight set, it is counted, its id goes to the published-marker (exactly-once: only after
  the Kafka commit, with the other ids of the transaction; a report served after its
  transaction committed, even in a later session, hands its id at once) and
  ``handle.published``. Failed: :meth:`Delivery.record_failed` applies the policy.
- :class:`DeadLetterReport`: a dead-letter record. Acknowledged: queued to mark its row
  ``FAILED`` in its own outbox table (the event is dead-lettered only once that is durable).
  Failed: the dead-letter topic rejecting a record halts; anything else restarts and the
  event is retried.

A report from an earlier session (``epoch``) is ignored: those records are re-sent.
"""

from __future__ import annotations

from typing import Protocol

from cdc_outbox.delivery.outcomes import EventHandle, PublishListener
from cdc_outbox.delivery.policy import KeysInFlight
from cdc_outbox.errors import FailureClass
from cdc_outbox.kafka.delivery_failure import DeliveryFailure, Headers, ReportingListener
from cdc_outbox.telemetry.relay_stats import RelayStats

__all__ = ["DeadLetterReport", "RecordReport", "ReportSink", "rows_by_outbox"]


class ReportSink(Protocol):
    """What a report updates: the state of :class:`~cdc_outbox.delivery.engine.Delivery`."""

    epoch: int
    eos: bool
    keys: KeysInFlight
    stats: RelayStats
    marker: PublishListener | None
    marks: list[tuple[bytes, int]]
    dead_in_flight: int
    to_mark: list[DeadLetterReport]

    def record_failed(self, sent: RecordReport, failure: DeliveryFailure) -> None: ...

    def halt(self, reason: str) -> None: ...

    def restart(self, reason: str, failure: DeliveryFailure | None = None) -> None: ...


class RecordReport(ReportingListener):
    """Delivery listener of an event's record on its topic (its own delivery callback)."""

    __slots__ = ("delivery", "epoch", "event_id", "handle", "key", "outbox")

    def __init__(
        self,
        delivery: ReportSink,
        handle: EventHandle,
        key: bytes,
        event_id: str,
        outbox: int = 0,
    ) -> None:
        self.delivery = delivery
        self.handle = handle
        #: The parking key (:func:`~cdc_outbox.delivery.policy.parking_key`) of the record.
        self.key = key
        self.event_id = event_id
        self.outbox = outbox
        self.epoch = delivery.epoch
        self.txn = None  # stamped by the producer (through a tracing span that wraps this too)

    def delivered(self, topic: str, headers: Headers) -> None:
        d = self.delivery
        # Served after its Kafka transaction committed (the commit's wait for the last reports
        # ran out): the transaction no longer hands it to the marker, so this report does.
        late = self.txn is not None and self.txn.committed
        if self.epoch != d.epoch:
            if late and d.marker is not None:
                d.marker.add(headers[0][1], self.outbox)
            return
        d.keys.done(self.key)
        d.stats.count_published(topic)
        if d.marker is not None:
            if d.eos and not late:  # only once the Kafka transaction has committed
                d.marks.append((headers[0][1], self.outbox))
            else:
                d.marker.add(headers[0][1], self.outbox)  # the mapper puts the event id first
        self.handle.published(topic)

    def failed(self, failure: DeliveryFailure) -> None:
        d = self.delivery
        if self.epoch == d.epoch:
            d.record_failed(self, failure)


class DeadLetterReport:
    """Delivery listener of a dead-letter record."""

    __slots__ = ("delivery", "epoch", "event_id", "handle", "intended_topic", "outbox", "reason")

    def __init__(
        self,
        delivery: ReportSink,
        handle: EventHandle,
        event_id: str | None,
        reason: str,
        topic: str,
        outbox: int = 0,
    ) -> None:
        self.delivery = delivery
        self.outbox = outbox
        self.handle = handle
        self.event_id = event_id
        self.reason = reason
        self.intended_topic = topic
        self.epoch = delivery.epoch

    def delivered(self, topic: str, headers: Headers) -> None:
        d = self.delivery
        if self.epoch == d.epoch:
            d.dead_in_flight -= 1
            d.stats.count_dead_lettered(self.intended_topic)
            d.to_mark.append(self)

    def failed(self, failure: DeliveryFailure) -> None:
        d = self.delivery
        if self.epoch != d.epoch:
            return
        d.dead_in_flight -= 1
        if failure.kind is FailureClass.DEAD_LETTER:
            d.halt(f"the dead-letter topic rejected a record: {failure.reason}")
        else:
            d.restart(f"dead-letter record failed ({failure.name}): {failure.reason}", failure)
            self.handle.retry(failure.reason)


def rows_by_outbox(reports: list[DeadLetterReport]) -> dict[int, list[tuple[str, str]]]:
    """``(event id, reason)`` of acknowledged dead letters to mark FAILED, per outbox: each
    outbox's in its own table; table-less events (no row) and events without an id, none."""
    by_outbox: dict[int, list[tuple[str, str]]] = {}
    for d in reports:
        if d.event_id is not None and d.outbox >= 0:
            by_outbox.setdefault(d.outbox, []).append((d.event_id, d.reason))
    return by_outbox
