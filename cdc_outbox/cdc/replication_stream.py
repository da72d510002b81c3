"""A logical replication connection (walsender, COPY BOTH) on psycopg's libpq layer.

This module is the only place that speaks the streaming-replication protocol. It never reads
the raw socket (under TLS it carries ciphertext): bytes come from libpq's ``get_copy_data``
and the socket is only waited on for readability.

Contract:
- ``connect()`` opens the walsender connection and returns the server's current
  :class:`~cdc_outbox.cdc.history.History` (``IDENTIFY_SYSTEM``, and ``TIMELINE_HISTORY`` past
  timeline 1) read on that same connection; ``start(start_lsn)`` then starts ``pgoutput`` on
  it at ``max(start_lsn, confirmed_flush_lsn)``; ``open(start_lsn)`` does both.
- ``read(timeout)`` returns one frame, or ``None`` when nothing arrived in ``timeout``.
- ``send_status(written, flushed)`` reports positions; the server moves the slot's
  ``confirmed_flush_lsn`` to ``flushed``. The caller keeps both monotonic.
- :func:`exported_snapshot`: a temporary slot on a connection of its own, only for the
  snapshot it exports and its consistent point (the catch-up of an outbox table the slot has
  not streamed yet, :mod:`cdc_outbox.cdc.new_tables`).
"""

from __future__ import annotations

import logging
import selectors
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from psycopg import conninfo, pq, sql

from cdc_outbox.cdc.history import History, parse_timeline_history
from cdc_outbox.errors import (
    AUTH_FAILED_TEXT,
    REPLICATION_PERMANENT_SQLSTATES,
    SQLSTATE_PRIVILEGE,
    CdcOutboxError,
)
from cdc_outbox.lsn import Lsn
from cdc_outbox.pgwire.walproto import Keepalive, XLogData, parse_copy_data, standby_status_update
from cdc_outbox.store.db_pool import connect_kwargs
from cdc_outbox.store.schema import slot_failover

logger = logging.getLogger(__name__)


class ReplicationError(CdcOutboxError):
    """The replication connection failed or the server ended the stream.

    ``permanent`` means retrying cannot help until someone changes the server (wal_level,
    privileges, a missing or invalidated slot, a missing publication); otherwise the failure
    is transient (server restarting, network, slot still held by a dying connection).
    """

    def __init__(
        self, message: str, *, permanent: bool = False, sqlstate: str | None = None
    ) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.sqlstate = sqlstate

    @property
    def missing_privilege(self) -> bool:
        """The role may not replicate (REPLICATION attribute missing or revoked)."""
        text = str(self)
        return self.sqlstate in SQLSTATE_PRIVILEGE or any(t in text for t in _NO_REPLICATION_TEXT)


#: SQLSTATEs after which streaming cannot work until the server is changed (the one list).
_PERMANENT_SQLSTATES = REPLICATION_PERMANENT_SQLSTATES
#: A walsender refused for want of the REPLICATION attribute (15; 16+) at connect.
_NO_REPLICATION_TEXT = (
    "must be superuser or replication role",
    "permission denied to start WAL sender",
)
_PERMANENT_CONNECT_TEXT = (
    *_NO_REPLICATION_TEXT,
    *AUTH_FAILED_TEXT,
    "does not exist",
)


def start_replication_command(
    slot: str, publication: str, start_lsn: int, *, proto_version: int = 1, messages: bool = True
) -> bytes:
    """The ``START_REPLICATION`` command, identifiers quoted by ``psycopg.sql``."""
    options: list[sql.Composable] = [
        sql.SQL("proto_version {}").format(sql.Literal(str(proto_version))),
        # publication_names is a string holding a list of (quoted) identifiers.
        sql.SQL("publication_names {}").format(
            sql.Literal(sql.Identifier(publication).as_string(None))
        ),
    ]
    if messages:
        options.append(sql.SQL("messages 'true'"))
    query = sql.SQL("START_REPLICATION SLOT {} LOGICAL {} ({})").format(
        sql.Identifier(slot), sql.SQL(str(Lsn(start_lsn))), sql.SQL(", ").join(options)
    )
    return query.as_string(None).encode()


class SlotMissing(ReplicationError):
    """The configured slot does not exist."""

    def __init__(self, message: str) -> None:
        super().__init__(message, permanent=True)


class ReplicationStream:
    """One walsender connection streaming one slot. Not thread-safe; one reader at a time."""

    def __init__(self, dsn: str, slot: str, publication: str, *, failover: bool = False) -> None:
        # connect_timeout and keepalives: no connect or dead peer blocks without a bound
        self._dsn = conninfo.make_conninfo(dsn, replication="database", **connect_kwargs(dsn))
        self._slot = slot
        self._publication = publication
        self._failover = failover
        self._slot_confirmed = 0
        self._conn: pq.abc.PGconn | None = None
        self._selector: selectors.DefaultSelector | None = None
        self._idle: pq.abc.PGconn | None = None  # connected, not streaming (holds a snapshot)

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    def open(self, start_lsn: int) -> int:
        """:meth:`connect`, then :meth:`start` at ``start_lsn``."""
        self.connect()
        return self.start(start_lsn)

    def connect(self) -> History:
        """Connect (or reuse the connection :meth:`create_slot` left) and read the server's
        current history on it. Raises ReplicationError with the server's message."""
        idle, self._idle = self._idle, None
        self.close()
        conn = idle or self._connect()
        try:
            history = _read_history(conn)
        except ReplicationError:
            conn.finish()
            raise
        self._idle = conn
        return history

    @property
    def slot_confirmed(self) -> int:
        """The slot's ``confirmed_flush_lsn`` as the last :meth:`start` read it."""
        return self._slot_confirmed

    def start(self, start_lsn: int) -> int:
        """Start streaming on the connection of :meth:`connect` from ``max(start_lsn,
        confirmed_flush_lsn)``.

        Returns that start position: the caller must never confirm less than it (PostgreSQL 15
        would move the slot backwards). Raises ReplicationError with the server's message.
        """
        conn, self._idle = self._idle, None
        if conn is None:
            raise ReplicationError("start() without connect()")
        confirmed = self._slot_position(conn)
        self._slot_confirmed = confirmed
        start_lsn = max(start_lsn, confirmed)
        command = start_replication_command(self._slot, self._publication, start_lsn)
        result = conn.exec_(command)
        if result.status != pq.ExecStatus.COPY_BOTH:
            msg = _error_text(conn)
            state = _sqlstate(result)
            conn.finish()
            raise ReplicationError(
                f"START_REPLICATION failed: {msg}",
                permanent=state in _PERMANENT_SQLSTATES,
                sqlstate=state,
            )
        conn.nonblocking = 1
        self._conn = conn
        self._selector = selectors.DefaultSelector()
        self._selector.register(conn.socket, selectors.EVENT_READ)
        logger.info("streaming slot %s from %s", self._slot, Lsn(start_lsn))
        return start_lsn

    def create_slot(self) -> tuple[int, str]:
        """Create the slot, exporting a snapshot: ``(consistent_point, snapshot_name)``.

        Rows committed before the consistent point are exactly those visible in the snapshot
        (import it with ``SET TRANSACTION SNAPSHOT`` in a REPEATABLE READ transaction); later
        ones will be streamed. The snapshot stays valid until :meth:`open` starts streaming
        on this same connection, so read the backlog first.
        """
        self.close()
        conn = self._connect()
        options = "FAILOVER true, " if slot_failover(self._failover, conn.server_version) else ""
        command = sql.SQL(
            "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (" + options + "SNAPSHOT 'export')"
        )
        res = conn.exec_(command.format(sql.Identifier(self._slot)).as_string(None).encode())
        if res.status != pq.ExecStatus.TUPLES_OK:
            msg = _error_text(conn)
            permanent = _sqlstate(res) in _PERMANENT_SQLSTATES
            conn.finish()
            raise ReplicationError(
                f"creating slot {self._slot!r} failed: {msg}", permanent=permanent
            )
        point, snapshot = res.get_value(0, 1), res.get_value(0, 2)
        if point is None or snapshot is None:
            conn.finish()
            raise ReplicationError("CREATE_REPLICATION_SLOT returned no snapshot")
        self._idle = conn
        logger.info(
            "created slot %s at %s%s", self._slot, point.decode(), options and " (failover)"
        )
        return int(Lsn.parse(point.decode())), snapshot.decode()

    def identify(self) -> tuple[str, str]:
        """``(system identifier, database name)`` of the server (``IDENTIFY_SYSTEM`` on a short
        replication connection)."""
        conn = self._connect()
        try:
            row = _identify_system(conn)
            return row[0], row[3]
        finally:
            conn.finish()

    def _connect(self) -> pq.abc.PGconn:
        conn = pq.PGconn.connect(self._dsn.encode())
        if conn.status != pq.ConnStatus.OK:
            msg = _error_text(conn)
            conn.finish()
            permanent = any(text in msg for text in _PERMANENT_CONNECT_TEXT)
            raise ReplicationError(f"replication connection failed: {msg}", permanent=permanent)
        return conn

    def _slot_position(self, conn: pq.abc.PGconn) -> int:
        query = sql.SQL(
            "SELECT confirmed_flush_lsn, plugin, wal_status FROM pg_catalog.pg_replication_slots"
            " WHERE slot_name = {}"
        ).format(sql.Literal(self._slot))
        res = conn.exec_(query.as_string(None).encode())
        if res.status != pq.ExecStatus.TUPLES_OK:
            msg = _error_text(conn)
            conn.finish()
            raise ReplicationError(f"reading slot {self._slot!r} failed: {msg}")
        if res.ntuples == 0:
            conn.finish()
            raise SlotMissing(
                f"replication slot {self._slot!r} does not exist; run `cdc-outbox init`"
            )
        raw_lsn, plugin, wal_status = (res.get_value(0, i) for i in range(3))
        if plugin != b"pgoutput" or wal_status == b"lost":
            conn.finish()
            problem = (
                "was invalidated (wal_status=lost)"
                if wal_status == b"lost"
                else (f"uses plugin {plugin!r}, not pgoutput")
            )
            raise ReplicationError(f"replication slot {self._slot!r} {problem}", permanent=True)
        return int(Lsn.parse(raw_lsn.decode())) if raw_lsn else 0

    def read(self, timeout: float) -> XLogData | Keepalive | None:
        """Next frame, or ``None`` if none arrived within ``timeout`` seconds."""
        data = self.read_raw(timeout)
        return None if data is None else parse_copy_data(data)

    def read_raw(self, timeout: float) -> memoryview | None:
        """Next CopyData message unparsed (see :mod:`cdc_outbox.pgwire.walproto`), or ``None``."""
        conn = self._require()
        nbytes, data = conn.get_copy_data(1)
        if nbytes == 0:
            deadline = time.monotonic() + timeout
            while True:
                conn.consume_input()
                nbytes, data = conn.get_copy_data(1)
                if nbytes != 0:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._wait_readable(remaining):
                    return None
        if nbytes > 0:
            return data
        self._raise_stream_end()

    def send_status(self, written: int, flushed: int, *, reply_requested: bool = False) -> None:
        """Send a standby status update (written, flushed = applied)."""
        conn = self._require()
        msg = standby_status_update(written, flushed, flushed, reply_requested=reply_requested)
        if conn.put_copy_data(msg) != 1 or self._flush(conn) < 0:
            raise ReplicationError(f"sending status update failed: {_error_text(conn)}")

    def close(self) -> None:
        """End the stream and close the connection (best effort, never raises)."""
        if self._idle is not None:
            self._idle.finish()
            self._idle = None
        conn, self._conn = self._conn, None
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        if conn is None:
            return
        try:
            conn.put_copy_end()
            self._flush(conn)
        except Exception:
            pass
        conn.finish()

    def _require(self) -> pq.abc.PGconn:
        if self._conn is None:
            raise ReplicationError("replication stream is not open")
        return self._conn

    def _wait_readable(self, timeout: float) -> bool:
        assert self._selector is not None
        return bool(self._selector.select(timeout))

    @staticmethod
    def _flush(conn: pq.abc.PGconn) -> int:
        deadline = time.monotonic() + 5.0
        while (rc := conn.flush()) == 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        return rc

    def _raise_stream_end(self) -> NoReturn:
        conn = self._require()
        parts = []
        permanent = False
        while (res := conn.get_result()) is not None:
            if res.status == pq.ExecStatus.FATAL_ERROR and res.error_message:
                parts.append(" ".join(res.error_message.decode(errors="replace").split()))
                permanent = permanent or _sqlstate(res) in _PERMANENT_SQLSTATES
        detail = "; ".join(parts) or _error_text(conn) or "server ended the stream"
        self.close()
        raise ReplicationError(f"replication stream ended: {detail}", permanent=permanent)


def _identify_system(conn: pq.abc.PGconn) -> list[str]:
    """``IDENTIFY_SYSTEM``: ``[systemid, timeline, xlogpos, dbname]`` as text."""
    res = conn.exec_(b"IDENTIFY_SYSTEM")
    if res.status != pq.ExecStatus.TUPLES_OK:
        raise ReplicationError(f"IDENTIFY_SYSTEM failed: {_error_text(conn)}")
    return [(res.get_value(0, i) or b"").decode() for i in range(4)]


def _read_history(conn: pq.abc.PGconn) -> History:
    """The server's current :class:`History` (``TIMELINE_HISTORY`` only past timeline 1)."""
    system_id, tli_text, xlogpos, _ = _identify_system(conn)
    timeline = int(tli_text)
    switchpoints: dict[int, int] = {}
    if timeline > 1:
        res = conn.exec_(f"TIMELINE_HISTORY {timeline}".encode())
        content = res.get_value(0, 1) if res.status == pq.ExecStatus.TUPLES_OK else None
        if content is None:
            raise ReplicationError(f"TIMELINE_HISTORY failed: {_error_text(conn)}")
        try:
            switchpoints = parse_timeline_history(content.decode())
        except ValueError as exc:
            raise ReplicationError(f"TIMELINE_HISTORY {timeline}: {exc}") from exc
    return History(system_id, timeline, int(Lsn.parse(xlogpos)), switchpoints)


def _sqlstate(result: pq.abc.PGresult) -> str:
    raw = result.error_field(pq.DiagnosticField.SQLSTATE)
    return raw.decode() if raw else ""


def _error_text(conn: pq.abc.PGconn) -> str:
    """libpq's error message on one line."""
    return " ".join(conn.error_message.decode(errors="replace").split())


@contextmanager
def exported_snapshot(dsn: str, name: str) -> Iterator[tuple[int, str]]:
    """Create the TEMPORARY logical slot ``name`` (pgoutput) on a replication connection of
    its own, exporting a snapshot, and yield ``(consistent_point, snapshot_name)``: rows of
    transactions committed before the point are exactly those the snapshot shows (import it
    with ``SET TRANSACTION SNAPSHOT``), later ones any slot of this database streams from
    there. On exit the connection ends, and with it the slot. Raises ReplicationError."""
    info = conninfo.make_conninfo(dsn, replication="database", **connect_kwargs(dsn))
    conn = pq.PGconn.connect(info.encode())
    try:
        if conn.status != pq.ConnStatus.OK:
            raise ReplicationError(f"replication connection failed: {_error_text(conn)}")
        command = sql.SQL(
            "CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL pgoutput (SNAPSHOT 'export')"
        ).format(sql.Identifier(name))
        res = conn.exec_(command.as_string(None).encode())
        if res.status != pq.ExecStatus.TUPLES_OK:
            permanent = _sqlstate(res) in _PERMANENT_SQLSTATES
            msg = f"creating temporary slot {name!r} failed: {_error_text(conn)}"
            raise ReplicationError(msg, permanent=permanent)
        point, snapshot = res.get_value(0, 1), res.get_value(0, 2)
        if point is None or snapshot is None:
            raise ReplicationError("CREATE_REPLICATION_SLOT returned no snapshot")
        logger.info("exported a snapshot at %s (temporary slot %s)", point.decode(), name)
        yield int(Lsn.parse(point.decode())), snapshot.decode()
    finally:
        conn.finish()
