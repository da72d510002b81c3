"""An in-memory PostgreSQL with one logical slot, and the replication stream the relay takes
through its ports (ReplicationPort).

Model: committed transactions in WAL order, each with its commit LSN (Begin's final LSN) and
end LSN; a slot with ``confirmed_flush_lsn``; the state table's kept position. A stream
started at ``lsn`` sends, in order, every transaction whose commit LSN is at or past
``max(lsn, confirmed)`` (as PostgreSQL skips those committed before), as pgoutput v1
messages: the outbox Relation first, then Begin, Insert..., Commit; then a keepalive when
nothing is left. Faults: :meth:`FakePostgres.drop_stream_after` ends the stream after some
frames (a walsender terminated), :meth:`FakePostgres.crash` moves the slot back (its position
is saved only at checkpoints), :meth:`FakePostgres.promote_copy` is a failover to a standby
that had WAL up to a fork point (new timeline, the slot as the copy had it),
:meth:`FakePostgres.recreate_slot` drops and recreates the slot behind the relay's back.
Rows go into one of :data:`TABLES` (``public.outbox`` by default), each described by a
Relation before its first insert in a stream. The outbox rows' PUBLISHED marks
(:class:`FakeMarks`) are kept per server; a confirmation past a row not marked is recorded
(:attr:`FakePostgres.confirmed_unmarked`).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from cdc_outbox.cdc.history import History
from cdc_outbox.cdc.replication_stream import ReplicationError
from cdc_outbox.lsn import Lsn
from cdc_outbox.pgwire.walproto import Keepalive, XLogData, parse_copy_data
from cdc_outbox.store.inspection import SlotStatus
from cdc_outbox.store.relay_state import Phase, RelayState, SlotFacts

OUTBOX_OID = 16384
COLUMNS = ("id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers")
#: Tables the fake server has, by ``schema.table``: (relation OID, columns). Every stream
#: describes all of them first; ``FakePostgres.commit(..., table=...)`` writes into one.
TABLES: dict[str, tuple[int, tuple[str, ...]]] = {
    "public.outbox": (OUTBOX_OID, COLUMNS),
    # the Debezium layout (no headers column)
    "shipping.events": (16385, ("id", "aggregatetype", "aggregateid", "type", "payload")),
    "public.not_an_outbox": (16386, COLUMNS),
}
_TXN_OVERHEAD = 40  # WAL bytes of a transaction beyond its rows (any positive size will do)
_ROW_BYTES = 100


@dataclass(frozen=True)
class Event:
    id: str
    aggregate_id: str
    seq: int
    pad: int = 0  # bytes of padding in the payload (a poison event: larger than allowed)
    table: str = "public.outbox"  # a key of TABLES

    def row(self) -> tuple[bytes, ...]:
        pad = f', "pad": "{"x" * self.pad}"' if self.pad else ""
        payload = f'{{"seq": {self.seq}{pad}}}'.encode()
        row = (self.id.encode(), b"order", self.aggregate_id.encode(), b"Placed", payload, b"{}")
        return row[: len(TABLES[self.table][1])]


@dataclass(frozen=True)
class Txn:
    xid: int
    final_lsn: int  # the commit record's start (Begin's final LSN)
    end_lsn: int
    events: tuple[Event, ...]


@dataclass
class FakePostgres:
    system_id: str = "7000000000000000001"
    timeline: int = 1
    switchpoints: dict[int, int] = field(default_factory=dict)
    txns: list[Txn] = field(default_factory=list)
    wal_end: int = 0x1000000
    confirmed: int = 0  # the slot's confirmed_flush_lsn
    saved_confirmed: int = 0  # what a crash brings it back to
    kept: int = 0  # the state table's confirmed_lsn
    phase: str = "STREAMING"  # the state table's phase
    consistent_point: int = 0  # the state table's consistent_point (the slot's creation)
    backwards: list[tuple[int, int]] = field(default_factory=list)  # confirmations that regressed
    advances: list[tuple[int, int]] = field(default_factory=list)  # (confirmed, kept then)
    drops: list[int] = field(default_factory=list)  # frame counts after which streams end
    down: bool = False
    marked: set[bytes] = field(default_factory=set)  # ids of the rows marked PUBLISHED
    #: table -> ids marked in it, in marking order (FakeMarks with a table)
    marked_in: dict[str, list[bytes]] = field(default_factory=dict)
    #: ids of the rows marked FAILED (durably dead-lettered: settled, never published again)
    failed: set[bytes] = field(default_factory=set)
    #: Confirmations past rows that were not marked: (confirmed, the unmarked event ids).
    confirmed_unmarked: list[tuple[int, list[str]]] = field(default_factory=list)
    streams_open: list[FakeStream] = field(default_factory=list)
    streams: int = 0
    _seqs: dict[str, int] = field(default_factory=dict)
    _xid: int = 1000

    def commit(
        self,
        aggregates: list[str],
        pad: dict[int, int] | None = None,
        table: str | list[str] = "public.outbox",
    ) -> Txn:
        """Commit one transaction with one event per listed aggregate (versions per
        aggregate count up, per table); ``pad``: payload padding by event index (poison
        events); ``table``: the table of every event, or of each (a key of TABLES)."""
        events = []
        for i, agg in enumerate(aggregates):
            into = table if isinstance(table, str) else table[i]
            seq_key = agg if into == "public.outbox" else f"{into}/{agg}"
            self._seqs[seq_key] = self._seqs.get(seq_key, 0) + 1
            pad_i = (pad or {}).get(i, 0)
            events.append(Event(str(uuid.uuid4()), agg, self._seqs[seq_key], pad_i, into))
        final = self.wal_end + _ROW_BYTES * len(events)
        txn = Txn(self._xid, final, final + _TXN_OVERHEAD, tuple(events))
        self._xid += 1
        self.wal_end = txn.end_lsn
        self.txns.append(txn)
        return txn

    def events(self) -> list[Event]:
        return [e for t in self.txns for e in t.events]

    def drop_stream_after(self, frames: int) -> None:
        self.drops.append(frames)

    def terminate(self) -> None:
        """End the open streams now (pg_terminate_backend of the walsender, a crash)."""
        for stream in self.streams_open:
            stream.kill()
        self.streams_open.clear()

    def recreate_slot(self) -> None:
        """Someone else drops the slot and creates it again (the state table unchanged): the
        new slot's consistent point is the current WAL end, past every transaction so far."""
        self.confirmed = self.saved_confirmed = self.wal_end

    def slot_facts(self, keeps_position: bool = True) -> SlotFacts:
        """The state row and the slot, as the catch-up rule reads them."""
        state = RelayState(
            Phase(self.phase),
            Lsn(self.consistent_point),
            exists=True,
            confirmed_lsn=Lsn(self.kept) if keeps_position else None,
        )
        lsn = Lsn(self.confirmed)
        slot = SlotStatus("slot", "logical", False, None, lsn, lsn, 0, 0, "reserved", None,
                          "pgoutput", "db")  # fmt: skip
        return SlotFacts(state, slot, keeps_position)

    def checkpoint(self) -> None:
        """A PostgreSQL checkpoint: the slot's position is saved to disk."""
        self.saved_confirmed = self.confirmed

    def crash(self) -> None:
        """Immediate shutdown and restart: the slot is back at its saved position."""
        self.confirmed = self.saved_confirmed

    def promote_copy(self, fork: int) -> FakePostgres:
        """A standby that had the WAL up to ``fork`` (a commit's end LSN or 0), promoted: a
        new timeline from there; its copy of the slot (and state table) as they were then."""
        kept_txns = [t for t in self.txns if t.end_lsn <= fork]
        wal = kept_txns[-1].end_lsn if kept_txns else 0x1000000
        copy = FakePostgres(
            system_id=self.system_id,
            timeline=self.timeline + 1,
            switchpoints={**self.switchpoints, self.timeline: max(fork, wal)},
            txns=list(kept_txns),
            wal_end=max(fork, wal),
            confirmed=min(self.saved_confirmed, fork),
            saved_confirmed=min(self.saved_confirmed, fork),
            kept=min(self.kept, fork),
            phase=self.phase,
            consistent_point=min(self.consistent_point, fork),
        )
        kept_ids = {e.id.encode() for t in kept_txns for e in t.events}
        copy.marked = kept_ids & self.marked
        copy.failed = kept_ids & self.failed
        copy._seqs = {}
        for t in kept_txns:
            for e in t.events:
                copy._seqs[e.aggregate_id] = e.seq
        copy._xid = self._xid
        return copy

    def history(self) -> History:
        return History(self.system_id, self.timeline, self.wal_end, dict(self.switchpoints))


def _xlog(lsn: int, payload: bytes) -> bytes:
    return b"w" + struct.pack("!QQQ", lsn, lsn, 0) + payload


def _keepalive(wal_end: int, reply: bool) -> bytes:
    return b"k" + struct.pack("!QQB", wal_end, 0, int(reply))


def _relation(table: str = "public.outbox") -> bytes:
    oid, columns = TABLES[table]
    schema, name = table.split(".")
    cols = b"".join(bytes([0]) + n.encode() + b"\0" + struct.pack("!Ii", 25, -1) for n in columns)
    return (
        b"R" + struct.pack("!I", oid) + schema.encode() + b"\0" + name.encode() + b"\0" + b"d"
        + struct.pack("!H", len(columns)) + cols
    )  # fmt: skip


def _insert(row: tuple[bytes, ...], table: str = "public.outbox") -> bytes:
    parts = [struct.pack("!H", len(row))]
    for v in row:
        parts.append(b"t" + struct.pack("!I", len(v)) + v)
    return b"I" + struct.pack("!I", TABLES[table][0]) + b"N" + b"".join(parts)


def txn_frames(txn: Txn) -> list[bytes]:
    begin = b"B" + struct.pack("!QqI", txn.final_lsn, 0, txn.xid)
    commit = b"C" + struct.pack("!BQQq", 0, txn.final_lsn, txn.end_lsn, 0)
    first = txn.final_lsn - _ROW_BYTES * len(txn.events)
    frames = [_xlog(first, begin)]
    frames += [
        _xlog(first + i * _ROW_BYTES, _insert(e.row(), e.table)) for i, e in enumerate(txn.events)
    ]
    return [*frames, _xlog(txn.final_lsn, commit)]


class FakeStream:
    """A replication connection to a :class:`FakePostgres` (which may be swapped, as a
    multi-host DSN follows a promoted standby: :attr:`server`; a started stream stays with
    the server it was started on)."""

    def __init__(self, server: FakePostgres) -> None:
        self.server = server
        self._connected = False
        self._open = False
        self._frames: list[bytes] = []
        self._described: set[str] = set()
        self._next_txn = 0
        self._sent = 0
        self._drop_at: int | None = None
        self._reply = False
        self._killed = False
        self._session = server
        self.starts: list[int] = []
        self.slot_confirmed = 0
        self._refusal: str | None = None

    def refuse_connect(self, message: str) -> None:
        """From now on the server refuses the connection for good (e.g. REPLICATION revoked):
        ``connect`` raises a permanent :class:`ReplicationError` with ``message``."""
        self._refusal = message

    def kill(self) -> None:
        """The server ends this stream: the next read raises."""
        self._killed = self._open

    @property
    def is_open(self) -> bool:
        return self._open

    def identify(self) -> tuple[str, str]:
        return self.server.system_id, "db"

    def connect(self) -> History:
        self.close()
        if self.server.down:
            raise ReplicationError("replication connection failed: server down")
        if self._refusal is not None:
            raise ReplicationError(self._refusal, permanent=True)
        self._connected = True
        self._session = self.server  # a connection is to one server
        return self._session.history()

    def start(self, start_lsn: int) -> int:
        assert self._connected, "start() without connect()"
        server = self._session
        if server.down:
            raise ReplicationError("START_REPLICATION failed: server closed the connection")
        start = max(start_lsn, server.confirmed)
        self.slot_confirmed = server.confirmed
        self.starts.append(start)
        server.streams += 1
        self._frames = [_xlog(start, _relation())]
        self._described = {"public.outbox"}  # other tables: before their first insert
        self._next_txn = next(
            (i for i, t in enumerate(server.txns) if t.final_lsn >= start), len(server.txns)
        )
        self._sent = 0
        self._drop_at = server.drops.pop(0) if server.drops else None
        self._open = True
        self._killed = False
        server.streams_open.append(self)
        return start

    def create_slot(self) -> tuple[int, str]:
        raise NotImplementedError("catch-up is covered by the integration tests")

    def read(self, timeout: float) -> XLogData | Keepalive | None:
        raw = self.read_raw(timeout)
        return None if raw is None else parse_copy_data(raw)

    def read_raw(self, timeout: float) -> bytes | None:
        if not self._open:
            raise ReplicationError("replication stream is not open")
        if (
            self._killed
            or self._session.down
            or (self._drop_at is not None and self._sent >= self._drop_at)
        ):
            self._killed = False
            self.close()
            raise ReplicationError("replication stream ended: FATAL: terminating connection")
        if not self._frames:
            server = self._session
            if self._next_txn < len(server.txns):
                txn = server.txns[self._next_txn]
                new = list(dict.fromkeys(e.table for e in txn.events))
                new = [t for t in new if t not in self._described]
                self._described.update(new)
                self._frames = [_xlog(txn.final_lsn, _relation(t)) for t in new]
                self._frames += txn_frames(txn)
                self._next_txn += 1
            elif self._reply:
                self._reply = False
                return _keepalive(server.wal_end, False)
            else:
                return None
        self._sent += 1
        return self._frames.pop(0)

    def send_status(self, written: int, flushed: int, *, reply_requested: bool = False) -> None:
        if not self._open:
            raise ReplicationError("replication stream is not open")
        server = self._session
        if flushed < server.confirmed:
            server.backwards.append((server.confirmed, flushed))
        elif flushed > server.confirmed:
            server.advances.append((flushed, server.kept))
        if flushed > server.confirmed:
            unmarked = [
                e.id
                for t in server.txns
                if server.confirmed < t.end_lsn <= flushed
                for e in t.events
                if e.id.encode() not in server.marked and e.id.encode() not in server.failed
            ]
            if unmarked:
                server.confirmed_unmarked.append((flushed, unmarked))
        server.confirmed = max(server.confirmed, flushed)
        self._reply = self._reply or reply_requested

    def close(self) -> None:
        self._open = self._connected = False
        self._frames = []


class FakeMarks:
    """The outbox rows' marks (a :class:`~cdc_outbox.cdc.published_marker.MarkSink`): an id
    marked goes to :attr:`FakePostgres.marked` of the server reached now (``server()``), and,
    with ``table``, to :attr:`FakePostgres.marked_in` under that table."""

    def __init__(self, server: Callable[[], FakePostgres], table: str | None = None) -> None:
        self.server = server
        self.table = table

    def mark(self, ids: list[bytes]) -> tuple[int, set[bytes]]:
        marked = self.server().marked
        new = set(ids) - marked
        marked.update(new)
        if self.table is not None:
            self.server().marked_in.setdefault(self.table, []).extend(ids)
        return len(new), set()  # every row is visible at once

    def in_progress(self) -> frozenset[str]:
        return frozenset()

    def close(self) -> None:
        pass
