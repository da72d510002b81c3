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

Ids are matched as the id column's own type, looked up once (first connection): uuid ids go
as one comma-joined text parameter split by the server (cheapest); any other type (text,
bigint, ...) as a real array parameter, so ids may contain commas.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import psycopg
from psycopg import sql

from cdc_outbox.config import Settings
from cdc_outbox.errors import CdcOutboxError
from cdc_outbox.store.inspection import ColumnType, id_column_type
from cdc_outbox.store.mark_published import marking_statement
from cdc_outbox.store.schema import outbox_ident

logger = logging.getLogger(__name__)

#: Ids per statement. A small outbox table is scanned whole per statement (the planner's
#: choice for an id list that large a share of it): 20,000 ids cost PostgreSQL 0.59-0.62 s of
#: CPU per 100,000 rows marked against 0.64-0.86 s with 5,000 (PostgreSQL 15, 2026-12-04);
#: at 50,000 events/s one statement covers a 0.2 s flush interval.
_BATCH = 20_000
_MAX_BUFFERED = 1_000_000
#: How long an id whose row is not visible is tried again before it is settled unmarked.
_INVISIBLE_GIVE_UP_S = 120.0


class PublishedMarker:
    """Buffers acknowledged event ids and marks their rows in batches (thread-safe ``add``)."""

    def __init__(self, settings: Settings, *, flush_interval_s: float = 0.2) -> None:
        self._settings = settings
        self._flush_interval_s = flush_interval_s
        self._ids: deque[tuple[int, bytes]] = deque()  # (ordinal, id), in handed order
        # Ids the statement did not match: ordinal -> (id, xids in progress after it, when).
        self._waiting: dict[int, tuple[bytes, frozenset[str], float]] = {}
        self._done = 0  # ids taken from _ids and settled or waiting
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.marked = 0
        self.dropped = 0
        self.failures = 0
        self.handed = 0  # ids accepted by add (relay thread)
        self.settled = 0  # of those, marked or given up on (marker thread)
        self._enabled = _statement(settings, _UUID) is not None
        self._statement: sql.Composed | None = None  # for the id type; on first connection
        self._visible: sql.Composed | None = None  # which of some ids have a visible row
        self._joined = True  # one comma-joined text parameter (uuid ids), else an array

    @property
    def enabled(self) -> bool:
        return self._enabled

    def add(self, event_id: bytes) -> None:
        """Hand over one acknowledged event id, as its UTF-8 text (cheap; called per delivery
        report)."""
        if len(self._ids) >= _MAX_BUFFERED or not self._enabled:
            self.dropped += 1
            return
        self._ids.append((self.handed, event_id))
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

    def _loop(self) -> None:
        conn: psycopg.Connection[tuple[object, ...]] | None = None
        while True:
            stopping = self._stop.is_set()
            try:
                if self._ids or self._waiting:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self._settings.postgres_dsn(), autocommit=True)
                    if self._statement is None:
                        self._prepare(conn)
                    self._flush(conn)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:  # connection
                self.failures += 1
                logger.warning("marking published rows failed (will retry): %s", exc)
                if conn is not None:
                    conn.close()
                conn = None
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
        if conn is not None:
            conn.close()
        if self._ids or self._waiting:
            left = len(self._ids) + len(self._waiting)
            logger.info("%d acknowledged rows left unmarked at stop", left)

    def _prepare(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        id_type = id_column_type(conn, self._settings)
        self._statement = _statement(self._settings, id_type)
        self._visible = _visible_statement(self._settings, id_type)
        self._joined = id_type.is_uuid
        logger.debug("marking published rows by %s ids", id_type.name)

    def _flush(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        if self._waiting:
            self._retry_waiting(conn)
        while self._ids:
            batch = [self._ids.popleft() for _ in range(min(_BATCH, len(self._ids)))]
            try:
                missed = self._mark(conn, [event_id for _, event_id in batch])
                running = _in_progress(conn) if missed else frozenset()
            except psycopg.Error:
                self._ids.extendleft(reversed(batch))
                raise
            self._done += len(batch)
            now = time.monotonic()
            for ordinal, event_id in batch:
                if event_id in missed:
                    self._waiting[ordinal] = (event_id, running, now)
            self._settle_prefix()

    def _retry_waiting(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        """Try once more the waiting ids whose possibly invisible transactions all ended
        (or that waited too long); settle them."""
        running, now = _in_progress(conn), time.monotonic()
        ready = {
            ordinal: event_id
            for ordinal, (event_id, xids, since) in self._waiting.items()
            if not (xids & running) or now - since >= _INVISIBLE_GIVE_UP_S
        }
        if not ready:
            return
        missed = self._mark(conn, list(ready.values()))
        for ordinal, event_id in ready.items():
            since = self._waiting.pop(ordinal)[2]
            if event_id in missed and now - since >= _INVISIBLE_GIVE_UP_S:
                logger.warning(
                    "outbox row %s not marked: not visible %.0f s after Kafka acknowledged"
                    " its event (transactions still in progress)",
                    event_id.decode(errors="replace"),
                    now - since,
                )
        self._settle_prefix()

    def _mark(self, conn: psycopg.Connection[tuple[object, ...]], ids: list[bytes]) -> set[bytes]:
        """Mark ``ids``; return those without a visible row. Only when the statement matched
        fewer rows than ids are they looked up; a row that became visible since is marked by
        the statement again."""
        assert self._statement is not None and self._visible is not None
        count = max(conn.execute(self._statement, (self._param(ids),)).rowcount, 0)
        self.marked += count
        if count >= len(ids):
            return set()
        rows = conn.execute(self._visible, (self._param(ids),)).fetchall()
        found = {row[0].encode() for row in rows if isinstance(row[0], str)}
        if found:  # marked now or before, FAILED, or visible only now: mark those
            again = conn.execute(self._statement, (self._param(sorted(found)),))
            self.marked += max(again.rowcount, 0)
        return set(ids) - found

    def _param(self, ids: list[bytes]) -> str | list[str]:
        # uuid: one text parameter, split by the server, far cheaper than adapting a list
        # (a uuid has no comma); other types: a text array, cast by the statement.
        return b",".join(ids).decode() if self._joined else [i.decode() for i in ids]

    def _settle_prefix(self) -> None:
        """``settled``: the ids before the first one still waiting (or all taken so far)."""
        self.settled = min(self._waiting, default=self._done)


_UUID = ColumnType("uuid", "pg_catalog", "uuid")


def _ids_match(settings: Settings, id_type: ColumnType) -> sql.Composed:
    """``<id column> = ANY(<the one parameter>)`` for ids of ``id_type``."""
    if id_type.is_uuid:
        ids: sql.Composable = sql.SQL("string_to_array(%s, ',')::uuid[]")
    else:
        ids = sql.SQL("%s::text[]::{}").format(id_type.array())
    return sql.SQL("{} = ANY({})").format(sql.Identifier(settings.column_names().id), ids)


def _visible_statement(settings: Settings, id_type: ColumnType) -> sql.Composed:
    """``SELECT`` of the ids (as text) among the parameter's whose row is visible."""
    return sql.SQL("SELECT {}::text FROM {} WHERE {}").format(
        sql.Identifier(settings.column_names().id),
        outbox_ident(settings),
        _ids_match(settings, id_type),
    )


def _in_progress(conn: psycopg.Connection[tuple[object, ...]]) -> frozenset[str]:
    """Transaction ids in progress now: the current snapshot's, and those of the backends
    (a transaction past the snapshot's ``xmax`` is in neither list of the snapshot; a role
    without ``pg_read_all_stats`` sees only its own sessions' ids)."""
    rows = conn.execute(
        "SELECT x::xid::text FROM pg_snapshot_xip(pg_current_snapshot()) x"
        " UNION SELECT backend_xid::text FROM pg_stat_activity WHERE backend_xid IS NOT NULL"
    ).fetchall()
    return frozenset(str(row[0]) for row in rows)


def _statement(settings: Settings, id_type: ColumnType) -> sql.Composed | None:
    """The UPDATE/DELETE for a batch of ids of ``id_type``, or None when housekeeping is off.

    Its one parameter: for uuid ids the ids comma-joined in one text, else a list of texts."""
    match = _ids_match(settings, id_type)
    if settings.cdc_mark_published == "delete" or (
        settings.cdc_mark_published == "update" and settings.columns.preset == "default"
    ):
        return marking_statement(settings, match)
    return None
