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

``handed`` counts ids accepted by :meth:`~PublishedMarker.add`, ``settled`` those marked (or
given up on when marking is impossible: no id column, no privilege, any error but a
connection's, logged as an error, after which rows stay PENDING); both only grow.

Ids are matched as the id column's own type, looked up once (first connection): uuid ids go
as one comma-joined text parameter split by the server (cheapest); any other type (text,
bigint, ...) as a real array parameter, so ids may contain commas.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Protocol

import psycopg
from psycopg import sql

from cdc_outbox import db_pool
from cdc_outbox.config import Settings
from cdc_outbox.errors import CdcOutboxError
from cdc_outbox.store.inspection import ColumnType, id_column_type
from cdc_outbox.store.mark_published import marking_statement
from cdc_outbox.store.outbox_table import OutboxTable

logger = logging.getLogger(__name__)

#: Ids per statement. A small outbox table is scanned whole per statement (the planner's
#: choice for an id list that large a share of it): 20,000 ids cost PostgreSQL 0.59-0.62 s of
#: CPU per 100,000 rows marked against 0.64-0.86 s with 5,000 (PostgreSQL 15, 2026-12-04);
#: at 50,000 events/s one statement covers a 0.2 s flush interval.
_BATCH = 20_000
_MAX_BUFFERED = 1_000_000


class PublishedMarker:
    """Buffers acknowledged event ids and marks their rows in batches (thread-safe ``add``)."""

    def __init__(
        self, settings: Settings, *, flush_interval_s: float = 0.2, rows: MarkSink | None = None
    ) -> None:
        self._settings = settings
        self._rows: MarkSink = rows or TableMarks(settings)
        self._flush_interval_s = flush_interval_s
        self._ids: deque[bytes] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.marked = 0
        self.dropped = 0
        self.failures = 0
        self.handed = 0  # ids accepted by add (relay thread)
        self.settled = 0  # of those, marked or given up on (marker thread)
        self._enabled = _statement(settings, _UUID) is not None

    @property
    def enabled(self) -> bool:
        return self._enabled

    def add(self, event_id: bytes) -> None:
        """Hand over one acknowledged event id, as its UTF-8 text (cheap; called per delivery
        report)."""
        if len(self._ids) >= _MAX_BUFFERED or not self._enabled:
            self.dropped += 1
            return
        self._ids.append(event_id)
        self.handed += 1

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

    def _loop(self) -> None:
        rows = self._rows
        while True:
            stopping = self._stop.is_set()
            try:
                if self._ids:
                    self._flush()
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:  # connection
                self.failures += 1
                logger.warning("marking published rows failed (will retry): %s", exc)
                rows.close()
                if stopping:
                    break
            except (CdcOutboxError, psycopg.Error) as exc:
                # No id column, no privilege, a trigger refusing it: retrying cannot help, and
                # the slot must not wait for marks that never come (see the module contract).
                logger.error("marking published rows stopped (rows stay PENDING): %s", exc)
                self.dropped += len(self._ids)
                self.settled += len(self._ids)
                self._ids.clear()
                self._enabled = False
                break
            if stopping and not self._ids:
                break
            self._wake.wait(self._flush_interval_s)
            self._wake.clear()
        rows.close()
        if self._ids:
            logger.info("%d acknowledged rows left unmarked at stop", len(self._ids))

    def _flush(self) -> None:
        while self._ids:
            batch = [self._ids.popleft() for _ in range(min(_BATCH, len(self._ids)))]
            try:
                marked = self._rows.mark(batch)
            except (CdcOutboxError, psycopg.Error):
                self._ids.extendleft(reversed(batch))
                raise
            self.marked += marked
            self.settled += len(batch)


class MarkSink(Protocol):
    """Where :class:`PublishedMarker` marks its batches (:class:`TableMarks`, or a test's
    fake). ``mark(ids)`` marks one batch and returns the rows it changed; a lost connection
    raises ``psycopg.OperationalError`` or ``InterfaceError`` (the batch is retried), any
    other ``psycopg.Error`` or ``CdcOutboxError`` stops marking. ``close()`` drops what it
    holds (``mark`` may be called again after it)."""

    def mark(self, ids: list[bytes]) -> int: ...

    def close(self) -> None: ...


class TableMarks:
    """The outbox table's marking statement, on a connection of its own made at first use."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._statement: sql.Composed | None = None  # for the id type; on first connection
        self._joined = True  # one comma-joined text parameter (uuid ids), else an array

    def mark(self, ids: list[bytes]) -> int:
        conn = self._conn
        if conn is None or conn.closed:
            conn = self._conn = db_pool.connect(self._settings.postgres_dsn(), autocommit=True)
        if self._statement is None:
            id_type = id_column_type(conn, self._settings)
            self._statement = _statement(self._settings, id_type)
            self._joined = id_type.is_uuid
            logger.debug("marking published rows by %s ids", id_type.name)
        assert self._statement is not None
        # uuid: one text parameter, split by the server, far cheaper than adapting a list
        # (a uuid has no comma); other types: a text array, cast by the statement.
        param = b",".join(ids).decode() if self._joined else [i.decode() for i in ids]
        cur = conn.execute(self._statement, (param,))
        return cur.rowcount if cur.rowcount > 0 else 0

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None


_UUID = ColumnType("uuid", "pg_catalog", "uuid")


def _statement(settings: Settings, id_type: ColumnType) -> sql.Composed | None:
    """The UPDATE/DELETE for a batch of ids of ``id_type``, or None when housekeeping is off.

    Its one parameter: for uuid ids the ids comma-joined in one text, else a list of texts."""
    if id_type.is_uuid:
        ids: sql.Composable = sql.SQL("string_to_array(%s, ',')::uuid[]")
    else:
        ids = sql.SQL("%s::text[]::{}").format(id_type.array())
    match = sql.SQL("{} = ANY({})").format(sql.Identifier(settings.column_names().id), ids)
    if settings.cdc_mark_published == "delete" or (
        settings.cdc_mark_published == "update" and OutboxTable.of(settings).has_status
    ):
        return marking_statement(settings, match)
    return None
