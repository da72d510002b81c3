"""The outbox table's FAILED rows, in memory: what the relay's delivery marks and reads
(:class:`~cdc_outbox.store.failed_rows.FailedRowsStore`, and the ``parked`` port).

Model: the events of a :class:`~tests.support.fakes.replication.FakePostgres` (its current history,
asked each time: a failover swaps it) are the rows, PENDING unless marked; an aggregate's
order is its events' ``seq`` (as ``created_at`` orders them in the table). A row
dead-lettered again keeps its first reason, as the real UPDATE does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tests.support.fakes.replication import Event, FakePostgres


@dataclass
class FakeOutbox:
    events: Callable[[], list[Event]]
    failed: dict[str, str] = field(default_factory=dict)  # event id -> first reason
    #: The server the rows are on now (FAILED rows are settled there for the slot's checks).
    server: Callable[[], FakePostgres] | None = None
    #: outbox index -> ids marked FAILED in that outbox table
    failed_in: dict[int, list[str]] = field(default_factory=dict)

    def _by_id(self) -> dict[str, Event]:
        return {e.id: e for e in self.events()}

    def mark(self, items: Sequence[tuple[str, str]], outbox: int = 0) -> None:
        self.failed_in.setdefault(outbox, []).extend(i for i, _ in items)
        for event_id, reason in items:
            self.failed.setdefault(event_id, reason)
            if self.server is not None:
                self.server().failed.add(event_id.encode())

    def precedes(self, event_id: str, blocker_id: str, outbox: int = 0) -> bool:
        rows = self._by_id()
        blocker = rows.get(blocker_id)
        if blocker is None:
            return False
        event = rows.get(event_id)
        return event is None or event.seq < blocker.seq

    def close(self) -> None:
        pass

    def parked(self) -> list[tuple[str, str]]:
        """``(aggregate_id, first FAILED event id)`` per parked aggregate (as
        :func:`~cdc_outbox.store.failed_rows.parked_aggregates`)."""
        first: dict[str, Event] = {}
        for event in self.events():
            if event.id in self.failed:
                known = first.get(event.aggregate_id)
                if known is None or event.seq < known.seq:
                    first[event.aggregate_id] = event
        return [(agg, e.id) for agg, e in sorted(first.items())]
