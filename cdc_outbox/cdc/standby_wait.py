"""Hold streamed transactions until a listed physical standby has flushed them
(``wait_for_standbys``; issue 24, "no phantom events").

:func:`gated` wraps the relay's replication stream in a :class:`GatedStream` when the setting
is on (otherwise returns the stream itself). ``read_raw`` then gives the relay a transaction's
frames only once ``pg_stat_replication`` on the primary shows a listed standby (by
``application_name``, or ``*``: any physical standby) with ``flush_lsn`` at or past its commit's
end; frames keep their order (:mod:`cdc_outbox.cdc.standby_gate`). A server keepalive is passed
on only while nothing is held (its WAL end must not confirm past held transactions); one that
asks for a reply while something is held becomes a keepalive with WAL end 0, so the relay
still answers at once. ``read_raw`` blocks at most one poll interval, so the relay's loop keeps
sending status updates while it holds. With no listed standby connected it holds for ever: the
gauges ``stats.standby_held_transactions`` / ``stats.standby_wait_s`` show it, and a warning is
logged at most every 10 s. ``pg_stat_replication`` is read on an ordinary connection, only
while a held transaction needs a newer position, at most every ``_POLL_S``. Reading more stops
once ``max_in_flight`` frames are held (a single open transaction is read whole).
"""

from __future__ import annotations

import logging
import struct
import time
from collections import deque

import psycopg

from cdc_outbox.cdc.history import History
from cdc_outbox.cdc.relay_ports import ReplicationPort
from cdc_outbox.cdc.standby_gate import StandbyGate, release_point
from cdc_outbox.config.cdc import CdcRelaySection
from cdc_outbox.config.input import parse_standby_names
from cdc_outbox.lsn import Lsn
from cdc_outbox.pgwire import pgoutput
from cdc_outbox.pgwire.walproto import XLOG_HEADER_SIZE, Keepalive, XLogData, parse_copy_data
from cdc_outbox.telemetry.relay_stats import RelayStats

logger = logging.getLogger(__name__)

_POLL_S = 0.02
_LOG_INTERVAL_S = 10.0
_XLOGDATA, _BEGIN, _COMMIT = ord("w"), ord("B"), ord("C")
#: Physical walsenders have no database; ``flush_lsn`` as a byte position.
_QUERY = (
    "SELECT r.application_name, (r.flush_lsn - '0/0'::pg_lsn)::bigint"
    " FROM pg_stat_replication r JOIN pg_stat_activity a ON a.pid = r.pid"
    " WHERE a.datname IS NULL AND r.flush_lsn IS NOT NULL"
)


class StandbyPoller:
    """Reads the listed standbys' flush positions from ``pg_stat_replication``."""

    def __init__(self, dsn: str, names: frozenset[str] | None) -> None:
        self._dsn = dsn
        self._names = names
        self._conn: psycopg.Connection[tuple[str, int]] | None = None
        #: application_names of the physical standbys seen by the last poll.
        self.connected: list[str] = []

    def flushed(self) -> int | None:
        """The newest flush position of a listed standby (0: none connected); ``None`` if the
        primary could not be asked (the connection is reopened on the next call)."""
        try:
            if self._conn is None:
                self._conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=3)
            rows = self._conn.execute(_QUERY).fetchall()
        except psycopg.Error as exc:
            logger.debug("reading pg_stat_replication failed: %s", exc)
            self.close()
            return None
        self.connected = [name for name, _ in rows]
        names = self._names
        return release_point(lsn for name, lsn in rows if names is None or name in names)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class GatedStream:
    """A :class:`ReplicationPort` whose ``read_raw`` holds transactions (module contract)."""

    def __init__(
        self, inner: ReplicationPort, poller: StandbyPoller, stats: RelayStats, limit: int
    ) -> None:
        self._inner = inner
        self._poller = poller
        self._stats = stats
        self._limit = limit
        self._gate = StandbyGate()
        self._ready: deque[bytes | memoryview] = deque()
        self._flushed = 0
        self._next_poll = 0.0
        self._last_log = time.monotonic()

    @property
    def is_open(self) -> bool:
        return self._inner.is_open

    def identify(self) -> tuple[str, str]:
        return self._inner.identify()

    def connect(self) -> History:
        return self._inner.connect()

    def start(self, start_lsn: int) -> int:
        self._reset()
        return self._inner.start(start_lsn)

    @property
    def slot_confirmed(self) -> int:
        return self._inner.slot_confirmed

    def create_slot(self) -> tuple[int, str]:
        return self._inner.create_slot()

    def read(self, timeout: float) -> XLogData | Keepalive | None:
        data = self.read_raw(timeout)
        return None if data is None else parse_copy_data(data)

    def send_status(self, written: int, flushed: int, *, reply_requested: bool = False) -> None:
        self._inner.send_status(written, flushed, reply_requested=reply_requested)

    def close(self) -> None:
        self._reset()
        self._poller.close()
        self._inner.close()

    def read_raw(self, timeout: float) -> memoryview | bytes | None:
        """The next frame the relay may handle, or ``None`` within about ``timeout``."""
        gate = self._gate
        wait = timeout
        while not self._ready:
            if not gate.empty:
                wait = min(wait, _POLL_S)
            if gate.held_frames >= self._limit and not (
                gate.in_transaction and gate.waiting_for() is None
            ):
                self._release(block_s=wait)
                break
            data = self._inner.read_raw(wait)
            if data is None:
                self._release()
                break
            wait = 0.0
            if self._take(data):
                self._release()
        return self._ready.popleft() if self._ready else None

    def _take(self, data: memoryview | bytes) -> bool:
        """File one frame; whether it committed a transaction."""
        gate = self._gate
        if data[0] != _XLOGDATA:
            if gate.empty:
                self._ready.append(data)
            elif getattr(parse_copy_data(data), "reply_requested", False):
                self._ready.append(b"k" + struct.pack(">QQB", 0, 0, 1))
            return False
        kind = data[XLOG_HEADER_SIZE]
        if gate.empty and kind != _BEGIN:
            self._ready.append(data)
            return False
        frame = bytes(data)  # the stream's buffer is reused by its next read
        if kind == _BEGIN:
            gate.begin(frame, time.monotonic())
        elif kind == _COMMIT and gate.in_transaction:
            msg = pgoutput.decode(frame[XLOG_HEADER_SIZE:])
            assert isinstance(msg, pgoutput.Commit)
            gate.commit(frame, msg.end_lsn)
            return True
        else:
            gate.add(frame, time.monotonic())
        return False

    def _release(self, block_s: float = 0.0) -> None:
        """Hand over what a standby has, asking the primary at most every ``_POLL_S``."""
        gate = self._gate
        needs = gate.waiting_for()
        now = time.monotonic()
        if needs is not None and needs > self._flushed:
            if now < self._next_poll:
                time.sleep(min(block_s, self._next_poll - now))
                now = time.monotonic()
            if now >= self._next_poll:
                self._next_poll = now + _POLL_S
                flushed = self._poller.flushed()
                if flushed is not None and flushed > self._flushed:
                    self._flushed = flushed
        self._ready.extend(gate.pop_released(self._flushed))
        self._report(time.monotonic())

    def _report(self, now: float) -> None:
        gate, stats = self._gate, self._stats
        held = gate.held_transactions
        since = gate.oldest_since() if held else None
        stats.standby_held_transactions = held
        stats.standby_wait_s = 0.0 if since is None else now - since
        if since is None or now - self._last_log < _LOG_INTERVAL_S:
            return
        self._last_log = now
        logger.warning(
            "holding %d transactions for %.0fs until a listed standby flushes past %s (reached"
            " %s; physical standbys connected: %s)",
            held,
            stats.standby_wait_s,
            Lsn(gate.waiting_for() or 0),
            Lsn(self._flushed),
            ", ".join(self._poller.connected) or "none",
            extra={"mode": "cdc"},
        )

    def _reset(self) -> None:
        self._gate.clear()
        self._ready.clear()
        self._flushed = 0
        self._report(time.monotonic())


def gated(section: CdcRelaySection, stream: ReplicationPort, stats: RelayStats) -> ReplicationPort:
    """``stream`` behind a :class:`GatedStream` if ``section.wait_for_standbys`` is set."""
    if not section.wait_for_standbys:
        return stream
    names = parse_standby_names(section.wait_for_standbys)
    poller = StandbyPoller(section.dsn, names)
    return GatedStream(stream, poller, stats, section.max_in_flight)
