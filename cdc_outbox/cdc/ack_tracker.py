"""Which LSN may be confirmed to the replication slot (pure, no I/O): the correctness core.

Contract of :class:`AckTracker`:

* **Never confirms past an unacknowledged event**: ``confirmed`` only ever becomes a Commit's
  end LSN once that transaction *and every earlier one* has had all its events acked, or a
  keepalive's WAL end while no transaction is open and no event is unacknowledged.
* **Monotonic**: ``confirmed`` never decreases (lower values are ignored, never an error).
* **Live**: once every event has been acked, in any order, ``confirmed`` equals the end LSN of
  the last committed transaction (or more, after a keepalive).
* Memory is O(transactions in flight), not O(events): one small record per transaction.

Transactions are numbered by :meth:`begin` with consecutive ints. Misuse (begin while one is
open, events or commit for a transaction that is not the open one, more acks than events, an
unknown transaction id) raises ``ValueError``. A tracker serves one streaming session: after a
reconnect the relay starts a new one from the slot's position.
"""

from __future__ import annotations

__all__ = ["AckTracker"]

_OPEN = -1  # end LSN of a transaction that has not committed yet


class AckTracker:
    """Tracks unacknowledged events per transaction and the confirmable LSN."""

    __slots__ = (
        "_confirmed",
        "_head",
        "_in_flight",
        "_next",
        "_open",
        "_open_rec",
        "_txns",
    )

    def __init__(self, confirmed: int = 0) -> None:
        self._confirmed = confirmed
        # txn id -> [unacked events, end LSN or _OPEN]; ids _head.._next-1 are all present
        self._txns: dict[int, list[int]] = {}
        self._head = 0  # oldest unconfirmed txn id
        self._next = 0  # id the next begin() returns
        self._open: int | None = None
        self._open_rec: list[int] = [0, _OPEN]
        self._in_flight = 0

    @property
    def confirmed(self) -> int:
        """The highest LSN safe to report as flushed; never decreases."""
        return self._confirmed

    @property
    def in_flight(self) -> int:
        """Events handed out (:meth:`add_event`) and not yet acked."""
        return self._in_flight

    @property
    def open_txn(self) -> int | None:
        """Id of the transaction between :meth:`begin` and :meth:`commit`, if any."""
        return self._open

    @property
    def pending_txns(self) -> int:
        """Transactions begun whose end LSN is not confirmed yet (the open one included)."""
        return len(self._txns)

    def begin(self) -> int:
        """Open a transaction (a Begin message) and return its id."""
        if self._open is not None:
            raise ValueError(f"transaction {self._open} is still open")
        txn = self._next
        self._next = txn + 1
        rec = [0, _OPEN]
        self._txns[txn] = rec
        self._open = txn
        self._open_rec = rec
        return txn

    def add_event(self, txn_id: int) -> None:
        """Count one more unacknowledged event in the open transaction ``txn_id``."""
        if txn_id != self._open:
            raise ValueError(f"add_event for transaction {txn_id}, open is {self._open}")
        self._open_rec[0] += 1
        self._in_flight += 1

    def commit(self, txn_id: int, end_lsn: int) -> None:
        """Close the open transaction; ``end_lsn`` becomes confirmable once all is acked."""
        if txn_id != self._open:
            raise ValueError(f"commit of transaction {txn_id}, open is {self._open}")
        if end_lsn < 0:
            raise ValueError(f"negative end LSN {end_lsn}")
        self._open_rec[1] = end_lsn
        self._open = None
        if txn_id == self._head and self._open_rec[0] == 0:
            self._advance()

    def ack(self, txn_id: int) -> None:
        """One event of ``txn_id`` is durably handled (before or after its commit)."""
        rec = self._txns.get(txn_id)
        if rec is None:
            self._ack_unknown(txn_id)
            return
        left = rec[0] - 1
        if left < 0:
            raise ValueError(f"more acks than events for transaction {txn_id}")
        rec[0] = left
        self._in_flight -= 1
        if left == 0 and txn_id == self._head and rec[1] != _OPEN:
            self._advance()

    def keepalive(self, wal_end: int) -> None:
        """Server WAL end while idle: confirmable only if nothing is open or unacknowledged."""
        if not self._txns and wal_end > self._confirmed:
            self._confirmed = wal_end

    def _advance(self) -> None:
        """Pop fully acked, committed transactions from the head; confirm the last end LSN."""
        txns = self._txns
        head = self._head
        end = self._confirmed
        while True:
            rec = txns.get(head)
            if rec is None or rec[0] or rec[1] == _OPEN:
                break
            del txns[head]
            if rec[1] > end:
                end = rec[1]
            head += 1
        self._head = head
        self._confirmed = end

    def _ack_unknown(self, txn_id: int) -> None:
        if 0 <= txn_id < self._head:
            raise ValueError(f"more acks than events for transaction {txn_id} (confirmed)")
        raise ValueError(f"ack for unknown transaction {txn_id}")

    def __repr__(self) -> str:
        return (
            f"AckTracker(confirmed={self._confirmed}, in_flight={self._in_flight},"
            f" pending_txns={len(self._txns)}, open_txn={self._open})"
        )
