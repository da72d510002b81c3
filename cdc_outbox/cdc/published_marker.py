"""CDC housekeeping: mark (or delete) outbox rows once Kafka has acknowledged their events.

Runs off the hot path, on its own thread and connection, in batches. It exists so that a later
polling pass (fallback mode) does not publish again what CDC already delivered.

Contract: an id is handed over only after Kafka acknowledged its event, so a row is never
marked before it is durable in Kafka. Ids still buffered when the process dies, or dropped
when the buffer is full (the database is down for long), leave their rows PENDING; a polling
pass or a catch-up would publish them again (duplicates, never losses). So that such rows
cannot pile up over crashes, nothing is treated as done before it is marked:

- :class:`~cdc_outbox.cdc.ledger.MarkedWatermark` holds the slot's confirmation back to the
  positions whose events are all marked (a crash re-streams, and so marks, whatever is
  unmarked);
- a catch-up waits for :attr:`PublishedMarker.unmarked` to stay small and for
  :meth:`PublishedMarker.settle` before it streams.

``handed`` counts ids accepted by :meth:`~PublishedMarker.add`, ``settled`` the longest
prefix of them marked (or given up on when marking is impossible: no id column, no privilege,
any error but a connection's, logged as an error, after which rows stay PENDING); both only
grow.

A row may not be visible yet when its id arrives: a transaction's commit record is in the WAL,
so decoded, published and acknowledged, before the committing backend has finished (it may
wait for a synchronous standby, or just not be scheduled). So when a statement matches fewer
rows than ids, the ids without a visible row are not settled at once: they wait
(``invisible``) until no transaction that was in progress just after the statement still is,
and are tried once more; then they settle, marked or not (not: their row was deleted). Ids
whose row is visible but was not matched (already PUBLISHED or FAILED) settle at once. After
:data:`_INVISIBLE_GIVE_UP_S` of waiting (a long-running transaction, a standby gone for long)
they are tried once more and settle anyway.

Where rows are marked is a :class:`MarkSink` per outbox table: that table's statements
(:class:`~cdc_outbox.store.published_marks.TableMarks`), or a test's fake. Each id is marked in
the table of the outbox it is handed with (:mod:`cdc_outbox.delivery.outcomes`), per that
outbox's ``cdc_mark_published``; ids of an outbox whose marking is off, and of table-less
events (no row), are not taken at all (neither handed nor dropped).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Protocol

import psycopg

from cdc_outbox.config.cdc import MarkerSection
from cdc_outbox.errors import CdcOutboxError
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.store.published_marks import UUID, TableMarks, table_marks_statement

logger = logging.getLogger(__name__)

#: Ids per statement. A small outbox table is scanned whole per statement (the planner's
#: choice for an id list that large a share of it): 20,000 ids cost PostgreSQL 0.59-0.62 s of
#: CPU per 100,000 rows marked against 0.64-0.86 s with 5,000 (PostgreSQL 15, 2026-12-04);
#: at 50,000 events/s one statement covers a 0.2 s flush interval.
_BATCH = 20_000
_MAX_BUFFERED = 1_000_000
#: How long an id whose row is not visible is tried again before it is settled unmarked.
_INVISIBLE_GIVE_UP_S = 120.0


class MarkSink(Protocol):
    """Where :class:`PublishedMarker` marks its batches. ``mark(ids)`` marks one batch and
    returns (rows changed, the ids without a visible row); ``in_progress()`` the ids of the
    transactions in progress now. A lost connection raises ``psycopg.OperationalError`` or
    ``InterfaceError`` (the batch is retried), any other ``psycopg.Error`` or
    ``CdcOutboxError`` stops marking. ``close()`` drops what it holds (it may be used again
    after)."""

    def mark(self, ids: list[bytes]) -> tuple[int, set[bytes]]: ...

    def in_progress(self) -> frozenset[str]: ...

    def close(self) -> None: ...


class PublishedMarker:
    """Buffers acknowledged event ids and marks their rows in batches (thread-safe ``add``)."""

    def __init__(
        self,
        section: MarkerSection,
        outboxes: Sequence[OutboxTable],
        *,
        flush_interval_s: float = 0.2,
        rows: MarkSink | Mapping[str, MarkSink] | None = None,
    ) -> None:
        """``outboxes``: every configured outbox table, in configuration order; ``rows``: where
        to mark, one sink for every outbox or one per ``schema.table`` (None: each outbox
        table's :class:`TableMarks`, in the database of ``section``)."""
        #: outbox index -> its sink, for the outboxes that mark (see the module doc)
        self._sinks: dict[int, MarkSink] = {}
        for n, table in enumerate(outboxes):
            if table_marks_statement(table, UUID) is None:
                continue
            if rows is None:
                self._sinks[n] = TableMarks(section, table)
            elif isinstance(rows, Mapping):
                self._sinks[n] = rows[table.name]
            else:
                self._sinks[n] = rows
        self._flush_interval_s = flush_interval_s
        # (ordinal, outbox, id), in handed order
        self._ids: deque[tuple[int, int, bytes]] = deque()
        # Ids the statement did not match: ordinal -> (outbox, id, xids in progress after it,
        # when).
        self._waiting: dict[int, tuple[int, bytes, frozenset[str], float]] = {}
        self._done = 0  # ids taken from _ids and settled or waiting
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.marked = 0
        self.dropped = 0
        self.failures = 0
        self.handed = 0  # ids accepted by add (relay thread)
        self.settled = 0  # of those, marked or given up on (marker thread)
        self._enabled = bool(self._sinks)

    @property
    def enabled(self) -> bool:
        return self._enabled

    def add(self, event_id: bytes, outbox: int = 0) -> None:
        """Hand over one acknowledged event id, as its UTF-8 text, of ``outbox`` (cheap;
        called per delivery report). An outbox that does not mark takes nothing."""
        if outbox not in self._sinks:
            return
        if len(self._ids) >= _MAX_BUFFERED or not self._enabled:
            self.dropped += 1
            return
        self._ids.append((self.handed, outbox, event_id))
        self.handed += 1

    @property
    def invisible(self) -> int:
        """Ids waiting for their row to become visible."""
        return len(self._waiting)

    @property
    def unmarked(self) -> int:
        """Ids handed over and not marked yet (0 once housekeeping has stopped)."""
        return self.handed - self.settled if self._thread is not None else 0

    def hurry(self) -> None:
        """Mark what is buffered now instead of at the next interval."""
        self._wake.set()

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s until every id handed over so far is marked; True if so
        (also when housekeeping is off or has stopped)."""
        target = self.handed
        deadline = time.monotonic() + timeout
        while self.settled < target and self._thread is not None and self._enabled:
            if time.monotonic() >= deadline:
                return False
            self._wake.set()
            time.sleep(0.005)
        return True

    def start(self) -> None:
        if not self._enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="published-marker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Mark what is buffered (within ``timeout``) and stop the thread."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _close_sinks(self) -> None:
        for sink in {id(s): s for s in self._sinks.values()}.values():
            sink.close()

    def _loop(self) -> None:
        while True:
            stopping = self._stop.is_set()
            try:
                if self._ids or self._waiting:
                    self._flush()
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:  # connection
                self.failures += 1
                logger.warning("marking published rows failed (will retry): %s", exc)
                self._close_sinks()
                if stopping:
                    break
            except (CdcOutboxError, psycopg.Error) as exc:
                # No id column, no privilege, a trigger refusing it: retrying cannot help, and
                # the slot must not wait for marks that never come (see the module contract).
                logger.error("marking published rows stopped (rows stay PENDING): %s", exc)
                self.dropped += len(self._ids) + len(self._waiting)
                self._done += len(self._ids)
                self._ids.clear()
                self._waiting.clear()
                self._settle_prefix()
                self._enabled = False
                break
            if stopping and not self._ids and not self._waiting:
                break  # (ids waiting for visibility are tried until stop's timeout)
            self._wake.wait(self._flush_interval_s)
            self._wake.clear()
        self._close_sinks()
        if self._ids or self._waiting:
            left = len(self._ids) + len(self._waiting)
            logger.info("%d acknowledged rows left unmarked at stop", left)

    def _flush(self) -> None:
        if self._waiting:
            self._retry_waiting()
        while self._ids:
            batch = [self._ids.popleft() for _ in range(min(_BATCH, len(self._ids)))]
            try:
                missed = self._mark([(outbox, event_id) for _, outbox, event_id in batch])
                running = self._in_progress() if missed else frozenset()
            except (CdcOutboxError, psycopg.Error):
                self._ids.extendleft(reversed(batch))
                raise
            self._done += len(batch)
            now = time.monotonic()
            for ordinal, outbox, event_id in batch:
                if (outbox, event_id) in missed:
                    self._waiting[ordinal] = (outbox, event_id, running, now)
            self._settle_prefix()

    def _in_progress(self) -> frozenset[str]:
        """The transactions in progress (every outbox table is in the one database)."""
        return next(iter(self._sinks.values())).in_progress()

    def _retry_waiting(self) -> None:
        """Try once more the waiting ids whose possibly invisible transactions all ended
        (or that waited too long); settle them."""
        running, now = self._in_progress(), time.monotonic()
        ready = {
            ordinal: (outbox, event_id)
            for ordinal, (outbox, event_id, xids, since) in self._waiting.items()
            if not (xids & running) or now - since >= _INVISIBLE_GIVE_UP_S
        }
        if not ready:
            return
        missed = self._mark(list(ready.values()))
        for ordinal, (outbox, event_id) in ready.items():
            since = self._waiting.pop(ordinal)[3]
            if (outbox, event_id) in missed and now - since >= _INVISIBLE_GIVE_UP_S:
                logger.warning(
                    "outbox row %s not marked: not visible %.0f s after Kafka acknowledged"
                    " its event (transactions still in progress)",
                    event_id.decode(errors="replace"),
                    now - since,
                )
        self._settle_prefix()

    def _mark(self, ids: list[tuple[int, bytes]]) -> set[tuple[int, bytes]]:
        """Mark ``(outbox, id)`` pairs, each in its outbox's sink: the pairs not visible."""
        by_outbox: dict[int, list[bytes]] = {}
        for outbox, event_id in ids:
            by_outbox.setdefault(outbox, []).append(event_id)
        missed: set[tuple[int, bytes]] = set()
        for outbox, batch in by_outbox.items():
            count, gone = self._sinks[outbox].mark(batch)
            self.marked += count
            missed.update((outbox, event_id) for event_id in gone)
        return missed

    def _settle_prefix(self) -> None:
        """``settled``: the ids before the first one still waiting (or all taken so far)."""
        self.settled = min(self._waiting, default=self._done)
