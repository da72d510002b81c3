"""What happens after Kafka answers: acknowledgements, dead letters, halt and restart decisions.

Contract:
- An event counts as handled (``AckTracker.ack``) only when Kafka acknowledged it, or
  acknowledged its dead-letter record.
- A permanent per-record failure becomes a dead-letter record, or halts the relay with the
  ``halt`` policy; a transient or fatal one asks the relay to restart from the confirmed LSN.
- Reports from a torn-down session are ignored: that window is streamed again anyway.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

from cdc_outbox.ack_tracker import AckTracker
from cdc_outbox.config import Settings
from cdc_outbox.dead_letters import dead_letter_record
from cdc_outbox.kafka_publisher import DeliveryFailure, Headers
from cdc_outbox.outbox_mapping import DeadLetter
from cdc_outbox.published_marker import PublishedMarker
from cdc_outbox.relay_stats import RelayStats

logger = logging.getLogger(__name__)


class TxnListener:
    """Delivery outcomes of one transaction's records, reported to the tracker of its session.

    Also times the transaction: commit timestamp to its last acknowledgement."""

    __slots__ = ("commit_unix", "events", "outcomes", "pending", "tracker", "txn_id")

    def __init__(self, outcomes: DeliveryOutcomes, tracker: AckTracker, txn_id: int) -> None:
        self.outcomes = outcomes
        self.tracker = tracker
        self.txn_id = txn_id
        self.pending = 0
        self.events = 0
        self.commit_unix = 0.0  # set at Commit

    def add_event(self) -> None:
        self.tracker.add_event(self.txn_id)
        self.pending += 1
        self.events += 1

    def delivered(self, topic: str, headers: Headers) -> None:
        outcomes = self.outcomes
        outcomes.stats.count_published(topic)
        if outcomes.marker is not None:
            outcomes.marker.add(headers[0][1])  # the mapper puts the event id first
        self.done()

    def done(self) -> None:
        self.tracker.ack(self.txn_id)
        self.pending -= 1
        if self.pending == 0 and self.commit_unix and self.outcomes.stats.latency_observers:
            self.outcomes.stats.observe_latency(time.time() - self.commit_unix, self.events)

    def committed(self, commit_unix: float) -> None:
        self.commit_unix = commit_unix

    def failed(self, failure: DeliveryFailure) -> None:
        self.outcomes.failed(self, failure)


class DeadLetterListener:
    """Outcome of the dead-letter record standing in for one event of a transaction."""

    __slots__ = ("intended_topic", "txn")

    def __init__(self, txn: TxnListener, intended_topic: str) -> None:
        self.txn = txn
        self.intended_topic = intended_topic

    def delivered(self, topic: str, headers: Headers) -> None:
        self.txn.outcomes.stats.count_dead_lettered(self.intended_topic)
        self.txn.done()

    def failed(self, failure: DeliveryFailure) -> None:
        if failure.permanent:
            self.txn.outcomes.halt(f"dead-letter topic rejected a record: {failure.reason}")
        else:
            self.txn.outcomes.failed(self.txn, failure)


@dataclass(frozen=True, slots=True)
class PendingDeadLetter:
    key: bytes | None
    value: bytes | None
    headers: Headers
    listener: DeadLetterListener


class DeliveryOutcomes:
    """Decisions after delivery reports; the relay polls ``restart_reason``/``halt_reason``."""

    def __init__(
        self, settings: Settings, stats: RelayStats, marker: PublishedMarker | None
    ) -> None:
        self.settings = settings
        self.stats = stats
        self.marker = marker
        self.tracker = AckTracker(0)
        self.restart_reason: str | None = None
        self.halt_reason: str | None = None
        self._dead: deque[tuple[TxnListener, DeliveryFailure | DeadLetter]] = deque()

    def new_session(self, tracker: AckTracker) -> None:
        """Start over for a new streaming session (forget queued dead letters of the old)."""
        self.tracker = tracker
        self.restart_reason = None
        self._dead.clear()

    @property
    def has_dead_letters(self) -> bool:
        return bool(self._dead)

    def dead_letter(self, txn: TxnListener, problem: DeadLetter) -> None:
        """An event the mapper cannot publish (NULL key, bad headers, ...)."""
        headers = dict(problem.headers)
        logger.warning(
            "event %s dead-lettered: %s",
            problem.event_id,
            problem.reason,
            extra={
                "event_id": problem.event_id,
                "aggregate_id": (problem.key or b"").decode(errors="replace"),
                "event_type": headers.get("event_type", b"").decode(errors="replace"),
                "topic": problem.intended_topic,
            },
        )
        self._dead.append((txn, problem))

    def failed(self, txn: TxnListener, failure: DeliveryFailure) -> None:
        """Kafka rejected a record: classify, then dead-letter, halt or restart."""
        if txn.tracker is not self.tracker:
            return
        self.stats.delivery_errors += 1
        if failure.permanent and not failure.fatal:
            if self.settings.on_permanent_error == "halt":
                self.halt(f"permanent delivery failure on {failure.topic}: {failure.reason}")
                return
            headers = dict(failure.headers)
            logger.warning(
                "record for %s rejected (%s); sending it to %s",
                failure.topic,
                failure.name,
                self.settings.dead_letter_topic,
                extra={
                    "topic": failure.topic,
                    "event_id": headers.get("id", b"").decode(errors="replace"),
                    "aggregate_id": (failure.key or b"").decode(errors="replace"),
                    "event_type": headers.get("event_type", b"").decode(errors="replace"),
                },
            )
            self._dead.append((txn, failure))
        elif self.restart_reason is None:
            self.restart_reason = f"delivery failed ({failure.name}): {failure.reason}"
            if failure.fatal:
                self.restart_reason += " [fatal: new producer]"

    def next_dead_letter(self) -> PendingDeadLetter | None:
        """The next dead-letter record to produce (None when none, or when halting)."""
        while self._dead and self.halt_reason is None:
            txn, problem = self._dead.popleft()
            if isinstance(problem, DeadLetter) and self.settings.on_permanent_error == "halt":
                self.halt(f"event {problem.event_id} cannot be published: {problem.reason}")
                return None
            record = dead_letter_record(problem)
            listener = DeadLetterListener(txn, record.intended_topic)
            return PendingDeadLetter(record.key, record.value, record.headers, listener)
        return None

    def halt(self, reason: str) -> None:
        if self.halt_reason is None:
            logger.error("halting: %s", reason, extra={"mode": self.stats.mode})
            self.halt_reason = reason
