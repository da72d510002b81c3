"""Copy-both framing of the streaming replication protocol (pure, no I/O).

Server -> client CopyData: XLogData ``w`` (25-byte header + pgoutput payload) and primary
keepalive ``k``. Client -> server: standby status update ``r`` (34 bytes). LSNs and clocks are
plain ``int`` here (hot path); clocks are microseconds since 2000-01-01 00:00:00 UTC.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cdc_outbox.errors import DecodeError

__all__ = [
    "PG_EPOCH",
    "Keepalive",
    "XLogData",
    "parse_copy_data",
    "pg_clock_from_datetime",
    "pg_clock_now",
    "pg_clock_to_datetime",
    "pg_clock_to_unix",
    "standby_status_update",
]

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_PG_EPOCH_UNIX_US = 946_684_800_000_000  # 2000-01-01 in µs since the Unix epoch
_PG_EPOCH_UNIX_S = _PG_EPOCH_UNIX_US / 1_000_000

_XLOG_HEADER = struct.Struct("!QQq")  # after the 'w' byte: start, end, clock
_KEEPALIVE = struct.Struct("!Qq?")  # after the 'k' byte: end, clock, reply requested
_STATUS = struct.Struct("!cQQQq?")  # 'r', written, flushed, applied, clock, reply requested
XLOG_HEADER_SIZE = 1 + _XLOG_HEADER.size  # 25
KEEPALIVE_SIZE = 1 + _KEEPALIVE.size  # 18
_U64_MAX = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class XLogData:
    """``w``: one pgoutput message; ``payload`` is a view of the bytes after the header.

    ``wal_start`` is not a usable position: PostgreSQL 15 sends 0 for Relation and Type
    messages and for a Begin followed by an Origin. Confirm Commit end LSNs instead.
    """

    wal_start: int
    wal_end: int
    server_clock: int
    payload: memoryview


@dataclass(frozen=True, slots=True)
class Keepalive:
    """``k``: the server's WAL end; reply at once when ``reply_requested``."""

    wal_end: int
    server_clock: int
    reply_requested: bool


def parse_copy_data(buf: bytes | bytearray | memoryview) -> XLogData | Keepalive:
    """Parse one CopyData message of a replication stream.

    Raises :class:`DecodeError` (naming the message type and byte offset) for an empty buffer,
    an unknown type byte, a short header, or a keepalive with trailing bytes. The XLogData
    payload is a zero-copy ``memoryview`` into ``buf``.
    """
    n = len(buf)
    if n == 0:
        raise DecodeError("CopyData: empty message at offset 0")
    kind = buf[0]
    if kind == 0x77:  # 'w'
        if n < XLOG_HEADER_SIZE:
            raise DecodeError(f"XLogData: truncated header at offset {n} (need 25 bytes)")
        start, end, clock = _XLOG_HEADER.unpack_from(buf, 1)
        mv = buf if isinstance(buf, memoryview) else memoryview(buf)
        return XLogData(start, end, clock, mv[XLOG_HEADER_SIZE:])
    if kind == 0x6B:  # 'k'
        if n != KEEPALIVE_SIZE:
            raise DecodeError(
                f"Keepalive: expected {KEEPALIVE_SIZE} bytes at offset 0, got {n}"
                f" ({'truncated' if n < KEEPALIVE_SIZE else 'trailing bytes'})"
            )
        end, clock, reply = _KEEPALIVE.unpack_from(buf, 1)
        return Keepalive(end, clock, reply)
    raise DecodeError(f"CopyData: unknown message type {bytes([kind])!r} at offset 0")


def standby_status_update(
    written: int,
    flushed: int,
    applied: int,
    *,
    reply_requested: bool = False,
    clock_us: int | None = None,
) -> bytes:
    """Build the 34-byte ``r`` message (each LSN = last WAL byte + 1).

    For a logical slot ``flushed`` moves ``confirmed_flush_lsn``. ``clock_us`` defaults to
    :func:`pg_clock_now`. Raises ``ValueError`` for an LSN outside 0..2**64-1.
    """
    for name, v in (("written", written), ("flushed", flushed), ("applied", applied)):
        if not 0 <= v <= _U64_MAX:
            raise ValueError(f"{name} LSN out of range: {v}")
    clock = pg_clock_now() if clock_us is None else clock_us
    return _STATUS.pack(b"r", written, flushed, applied, clock, reply_requested)


def pg_clock_now() -> int:
    """Now, in microseconds since 2000-01-01 UTC (PostgreSQL's TimestampTz)."""
    return time.time_ns() // 1000 - _PG_EPOCH_UNIX_US


def pg_clock_to_datetime(us: int) -> datetime:
    """A PostgreSQL TimestampTz (µs since 2000-01-01) as an aware UTC ``datetime``."""
    return PG_EPOCH + timedelta(microseconds=us)


def pg_clock_to_unix(us: int) -> float:
    """A PostgreSQL TimestampTz (µs since 2000-01-01) as seconds since the Unix epoch, the
    scale of ``time.time()`` (cheaper than a ``datetime`` on a per-transaction path)."""
    return us / 1e6 + _PG_EPOCH_UNIX_S


def pg_clock_from_datetime(dt: datetime) -> int:
    """Inverse of :func:`pg_clock_to_datetime`; ``dt`` must be timezone-aware."""
    if dt.tzinfo is None:
        raise ValueError("naive datetime")
    delta = dt - PG_EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
