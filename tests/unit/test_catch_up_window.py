"""At least once, a catch-up that waits for its unmarked rows keeps the published-marker
marking (issue 38 item 2): it does not sit out the marker's flush interval.

``_bound_unmarked`` woke the marker once, before its wait; acknowledgements served during the
wait added ids the marker then left for its next interval (0.2 s by default), while the
catch-up read nothing. Measured in ``python -m benchmarks compare`` (100,000 events in 100-row
transactions, 2026-12-04): 2.4-3.8 s of a 3.6-5.0 s catch-up spent in that wait. Here the
marker's interval is an hour, so only a wake-up can end the wait.
"""

from __future__ import annotations

import threading

from pydantic import SecretStr

from cdc_outbox.cdc import catch_up
from cdc_outbox.cdc.published_marker import PublishedMarker
from cdc_outbox.config.cdc import marker_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.store.outbox_table import OutboxTable
from tests.support.helpers import wait_until


class _Rows:
    """A MarkSink that marks every id it is given."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def mark(self, ids: list[bytes]) -> tuple[int, set[bytes]]:
        self.batches.append(len(ids))
        return len(ids), set()

    def in_progress(self) -> frozenset[str]:
        return frozenset()

    def close(self) -> None:
        pass


class _Publisher:
    """Each poll serves the acknowledgement of ``per_poll`` of the backlog's records: their
    ids go to the marker, as the relay's listener hands them over."""

    def __init__(self, marker: PublishedMarker, backlog: catch_up._Backlog) -> None:
        self.marker, self.backlog, self.per_poll = marker, backlog, 500
        self.acked = 0

    def poll(self, timeout: float) -> int:
        for _ in range(min(self.per_poll, self.backlog.pending)):
            self.marker.add(f"id-{self.acked}".encode())
            self.acked += 1
            self.backlog.published("t")
        return 0


class _Stats:
    def beat(self) -> None:
        pass


class _Delivery:
    """What ``_bound_unmarked`` asks of the delivery engine."""

    halt_reason = None
    restart_reason = None

    def __init__(self, marker: PublishedMarker, backlog: catch_up._Backlog) -> None:
        self.marker = marker
        self.publisher = _Publisher(marker, backlog)
        self.stats = _Stats()

    def service(self) -> None:
        pass

    def interrupted(self) -> str | None:
        return None


def test_waiting_for_unmarked_rows_wakes_the_marker_until_they_are_marked() -> None:
    rows = _Rows()
    settings = Settings(dsn=SecretStr("host=db.example dbname=shop"))
    marker = PublishedMarker(
        marker_section(settings), OutboxTable.all_of(settings), flush_interval_s=3600.0, rows=rows
    )
    backlog = catch_up._Backlog()
    delivery = _Delivery(marker, backlog)
    window = catch_up.UNMARKED_WINDOW
    # The catch-up has submitted three windows of rows, none acknowledged yet: it must wait
    # until at most a window is unacknowledged and at most a window unmarked.
    backlog.pending = 3 * window
    marker.start()
    done = threading.Event()

    def wait() -> None:
        catch_up._bound_unmarked(delivery, backlog)  # type: ignore[arg-type]
        done.set()

    waiter = threading.Thread(target=wait, daemon=True)
    try:
        waiter.start()
        wait_until(
            done.is_set,
            timeout=30,
            message=lambda: (
                f"catch-up still waiting: {backlog.pending} unacknowledged,"
                f" {marker.unmarked} unmarked, marked in batches {rows.batches}"
            ),
        )
        assert backlog.pending <= window and marker.unmarked <= window
    finally:
        marker.stop()
        waiter.join(5)
