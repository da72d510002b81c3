"""When to commit a Kafka transaction, and what it covers (pure, no I/O): exactly-once core.

The relay streams PostgreSQL transactions in commit order into one open Kafka transaction.
Contract of :class:`EosBatch`:

* **Never splits a PostgreSQL transaction**: :meth:`due` is false while one is open; a
  PostgreSQL transaction larger than ``max_events`` is committed whole, at its end.
* **Commits at once when the relay caught up**: at a boundary, ``due(now, caught_up=True)``
  (the relay's last read found nothing: no more events would join) is true as soon as the
  Kafka transaction holds an event ``min_interval_s`` old (default 0); it then waits only for
  its acknowledgements and the commit. Under load (the relay never catches up) the rule
  below bounds it: transactions grow only while events keep coming, one commit at a time.
* **Commits often enough**: at a boundary, :meth:`due` is true once the Kafka transaction
  holds ``max_events`` events or its first event is ``interval_s - lead_s`` old, where
  ``lead_s`` is the recent time from :meth:`close` to :meth:`committed` (a moving average
  of the timed ones, at most ``interval_s / 4``): the commit then lands about ``interval_s``
  after the first event was read, not ``interval_s`` plus the time closing takes.
* **Skips what Kafka already holds**: :meth:`skip` is true for a PostgreSQL transaction whose
  commit LSN (Begin's final LSN) is below ``committed_lsn`` (the end LSN of the last
  transaction committed to Kafka, from the checkpoint topic or this process): PostgreSQL
  re-sends from the slot's confirmed position, which may be behind the Kafka commit.
* **Commits what it closed**: :meth:`close` (at a boundary) fixes what the commit covers
  (``closing_events`` up to ``closing_end_lsn``); events read meanwhile form the next
  transaction, which is not :meth:`due` before :meth:`committed` (one commit at a time).
  :meth:`committed` makes ``closing_end_lsn`` the new ``committed_lsn``.
* **Confirms nothing uncommitted**: :meth:`ceiling` is the highest LSN the slot may be confirmed
  to: ``committed_lsn`` while a Kafka transaction (open or closing) holds events, unbounded
  (``None``) otherwise. ``committed_lsn`` never decreases, except through :meth:`rebase`
  (a session start in a new history: only what holds there is still skipped).
"""

from __future__ import annotations

__all__ = ["EosBatch"]

#: Weight of the latest close duration in ``lead_s`` (an exponential moving average).
_LEAD_WEIGHT = 0.25


class EosBatch:
    """The open Kafka transaction's PostgreSQL transactions (see the module contract)."""

    __slots__ = (
        "_closed_at",
        "_closing",
        "_in_txn",
        "_interval_s",
        "_max_events",
        "_min_interval_s",
        "_started",
        "closing_end_lsn",
        "closing_events",
        "committed_lsn",
        "end_lsn",
        "events",
        "lead_s",
        "txns",
    )

    def __init__(
        self,
        interval_s: float,
        max_events: int,
        committed_lsn: int = 0,
        min_interval_s: float = 0.0,
    ) -> None:
        self._interval_s = interval_s
        self._min_interval_s = min_interval_s
        self._max_events = max_events
        self.committed_lsn = committed_lsn
        self.events = 0  # events in the open Kafka transaction
        self.txns = 0  # PostgreSQL transactions with events in it
        self.end_lsn = committed_lsn  # end LSN of the last of them
        self._in_txn = False
        self._started = 0.0
        self._closing = False
        self.closing_events = 0  # events of the closing transaction (see close)
        self.closing_end_lsn = committed_lsn
        self.lead_s = 0.0  # see the module contract
        self._closed_at: float | None = None

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

    @property
    def closing(self) -> bool:
        return self._closing

    def due(self, now: float, caught_up: bool = False) -> bool:
        """Close the Kafka transaction now? (only at a PostgreSQL transaction boundary, and
        not while the previous one is closing; at once if ``caught_up``)"""
        if self._in_txn or self.events == 0 or self._closing:
            return False
        age = now - self._started
        return (
            (caught_up and age >= self._min_interval_s)
            or self.events >= self._max_events
            or age >= self._interval_s - self.lead_s
        )

    def full(self) -> bool:
        """The previous transaction is closing and this one, at a boundary, holds
        ``max_events`` or more: read no further (a Kafka transaction never grows past
        ``max_events`` by more than one PostgreSQL transaction)."""
        return self._closing and not self._in_txn and self.events >= self._max_events

    def seconds_to_due(self, now: float) -> float | None:
        """How long until :meth:`due` by the interval, or by ``min_interval_s`` if the relay
        is caught up then (``None``: no event waiting)."""
        if self.events == 0:
            return None
        wait = min(self._interval_s - self.lead_s, self._min_interval_s)
        return max(0.0, self._started + wait - now)

    def ceiling(self) -> int | None:
        """Highest LSN the slot may be confirmed to (``None``: no bound)."""
        return self.committed_lsn if self.events or self._closing else None

    def close(self, now: float | None = None) -> int:
        """Fix what the commit covers (the events so far, up to ``end_lsn``); later events
        form the next transaction. Returns ``closing_end_lsn``. ``now`` (the clock of
        :meth:`due`) times the close for ``lead_s``."""
        if self._in_txn:
            raise ValueError("closing inside a PostgreSQL transaction")
        if self._closing:
            raise ValueError("the previous Kafka transaction is still closing")
        self._closing = True
        self._closed_at = now
        self.closing_events, self.closing_end_lsn = self.events, self.end_lsn
        self.events = self.txns = 0
        return self.closing_end_lsn

    def committed(self, now: float | None = None) -> int:
        """The closed Kafka transaction committed: ``closing_end_lsn`` becomes
        ``committed_lsn``. Returns the number of events it held. With ``now`` (and a timed
        :meth:`close`), the close's duration updates ``lead_s``."""
        if not self._closing:
            raise ValueError("nothing was closed")
        self._closing = False
        if now is not None and self._closed_at is not None:
            took = min(max(0.0, now - self._closed_at), self._interval_s / 4)
            self.lead_s += _LEAD_WEIGHT * (took - self.lead_s)
        self._closed_at = None
        self.committed_lsn = max(self.committed_lsn, self.closing_end_lsn)
        events, self.closing_events = self.closing_events, 0
        return events

    def rebase(self, committed_lsn: int) -> None:
        """A session starts (nothing open): ``committed_lsn`` is what Kafka holds of the
        current history, possibly lower than before (see :meth:`~cdc_outbox.cdc.eos.
        EosCommitter.load`)."""
        self.committed_lsn = self.end_lsn = self.closing_end_lsn = committed_lsn

    def aborted(self) -> None:
        """The Kafka transaction was aborted: forget it (its transactions are re-streamed)."""
        self.events = self.txns = self.closing_events = 0
        self.end_lsn = self.closing_end_lsn = self.committed_lsn
        self._in_txn = self._closing = False
        self._closed_at = None
