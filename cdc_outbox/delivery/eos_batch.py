"""When to commit a Kafka transaction, and what it covers (pure, no I/O): exactly-once core.

The relay streams PostgreSQL transactions in commit order into one open Kafka transaction.
Contract of :class:`EosBatch`:

* **Never splits a PostgreSQL transaction**: :meth:`due` is false while one is open; a
  PostgreSQL transaction larger than ``max_events`` is committed whole, at its end.
* **Commits often enough**: at a boundary, :meth:`due` is true once the Kafka transaction
  holds ``max_events`` events or its first event is ``interval_s`` old.
* **Skips what Kafka already holds**: :meth:`skip` is true for a PostgreSQL transaction whose
  commit LSN (Begin's final LSN) is below ``committed_lsn`` (the end LSN of the last
  transaction committed to Kafka, from the checkpoint topic or this process): PostgreSQL
  re-sends from the slot's confirmed position, which may be behind the Kafka commit.
* **Confirms nothing uncommitted**: :meth:`ceiling` is the highest LSN the slot may be confirmed
  to: ``committed_lsn`` while the Kafka transaction holds events, unbounded (``None``)
  otherwise. ``committed_lsn`` never decreases.
"""

from __future__ import annotations

__all__ = ["EosBatch"]


class EosBatch:
    """The open Kafka transaction's PostgreSQL transactions (see the module contract)."""

    __slots__ = (
        "_in_txn",
        "_interval_s",
        "_max_events",
        "_started",
        "committed_lsn",
        "end_lsn",
        "events",
        "txns",
    )

    def __init__(self, interval_s: float, max_events: int, committed_lsn: int = 0) -> None:
        self._interval_s = interval_s
        self._max_events = max_events
        self.committed_lsn = committed_lsn
        self.events = 0  # events in the open Kafka transaction
        self.txns = 0  # PostgreSQL transactions with events in it
        self.end_lsn = committed_lsn  # end LSN of the last of them
        self._in_txn = False
        self._started = 0.0

    def skip(self, final_lsn: int) -> bool:
        """True if the PostgreSQL transaction committed at ``final_lsn`` is already in Kafka."""
        return final_lsn < self.committed_lsn

    def begin(self) -> None:
        """A PostgreSQL transaction (not skipped) begins."""
        if self._in_txn:
            raise ValueError("a PostgreSQL transaction is already open")
        self._in_txn = True

    def add_event(self, now: float) -> None:
        """One event of the open PostgreSQL transaction went into the Kafka transaction."""
        if not self._in_txn:
            raise ValueError("event outside a PostgreSQL transaction")
        if self.events == 0:
            self._started = now
        self.events += 1

    def end(self, end_lsn: int, had_events: bool) -> None:
        """The open PostgreSQL transaction committed at ``end_lsn``."""
        if not self._in_txn:
            raise ValueError("commit without a PostgreSQL transaction")
        self._in_txn = False
        if had_events:
            self.txns += 1
            self.end_lsn = max(self.end_lsn, end_lsn)

    @property
    def in_txn(self) -> bool:
        return self._in_txn

    def due(self, now: float) -> bool:
        """Commit the Kafka transaction now? (only at a PostgreSQL transaction boundary)"""
        if self._in_txn or self.events == 0:
            return False
        return self.events >= self._max_events or now - self._started >= self._interval_s

    def seconds_to_due(self, now: float) -> float | None:
        """How long until :meth:`due` by the interval (``None``: no event waiting)."""
        if self.events == 0:
            return None
        return max(0.0, self._started + self._interval_s - now)

    def ceiling(self) -> int | None:
        """Highest LSN the slot may be confirmed to (``None``: no bound)."""
        return self.committed_lsn if self.events else None

    def committed(self) -> int:
        """The Kafka transaction committed: its end LSN becomes ``committed_lsn``."""
        if self._in_txn:
            raise ValueError("committing inside a PostgreSQL transaction")
        self.committed_lsn = max(self.committed_lsn, self.end_lsn)
        self.events = self.txns = 0
        return self.committed_lsn

    def aborted(self) -> None:
        """The Kafka transaction was aborted: forget it (its transactions are re-streamed)."""
        self.events = self.txns = 0
        self.end_lsn = self.committed_lsn
        self._in_txn = False
