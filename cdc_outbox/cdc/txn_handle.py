"""The outcome handle of one streamed transaction (a
:class:`~cdc_outbox.delivery.outcomes.EventHandle`).

Every event of the transaction reports to the :class:`~cdc_outbox.cdc.ack_tracker.AckTracker` of
its streaming session when it is published or durably dead-lettered; the handle also times
the transaction, from its commit timestamp to its last outcome (the commit-to-ack latency).
"""

from __future__ import annotations

import time

from cdc_outbox.cdc.ack_tracker import AckTracker
from cdc_outbox.telemetry.relay_stats import RelayStats


class TxnHandle:
    """Outcomes of one transaction's events, reported to the tracker of its session; also
    times the transaction (commit timestamp to its last outcome)."""

    __slots__ = ("commit_unix", "events", "pending", "stats", "timed", "tracker", "txn_id")

    def __init__(
        self, tracker: AckTracker, stats: RelayStats, txn_id: int, *, timed: bool = True
    ) -> None:
        #: False (exactly-once): the relay times the transaction at its Kafka commit instead.
        self.timed = timed
        self.tracker = tracker
        self.stats = stats
        self.txn_id = txn_id
        self.pending = 0
        self.events = 0
        self.commit_unix = 0.0  # set at Commit

    def add_event(self) -> None:
        self.tracker.add_event(self.txn_id)
        self.pending += 1
        self.events += 1

    def published(self, topic: str) -> None:
        self.tracker.ack(self.txn_id)
        self.pending -= 1
        if self.pending == 0 and self.timed and self.commit_unix and self.stats.latency_observers:
            self.stats.observe_latency(time.time() - self.commit_unix, self.events)

    def dead_lettered(self) -> None:
        self.published("")

    def retry(self, reason: str) -> None:
        """Nothing to do: the session restarts and the transaction is streamed again."""
