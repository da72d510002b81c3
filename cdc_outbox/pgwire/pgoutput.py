"""Decoder for pgoutput logical replication messages (pure, no I/O).

Covers protocol v1 plus ``M`` (logical decoding messages) and the v2 streaming messages.
LSNs, xids and timestamps are plain ``int`` (timestamps: µs since 2000-01-01 UTC, see
:func:`cdc_outbox.pgwire.walproto.pg_clock_to_datetime`). Column values stay raw ``bytes`` (text or
binary form as sent), ``None`` for SQL NULL, :data:`UNCHANGED_TOAST` for an unchanged TOASTed
value that the server did not send. Message objects (defined in
:mod:`cdc_outbox.pgwire.pgoutput_messages`, re-exported here) are slots dataclasses: treat as
immutable. :class:`RelationCache` (in :mod:`cdc_outbox.pgwire.relations`) is re-exported too.

Every malformed input raises :class:`~cdc_outbox.errors.DecodeError` naming the message type
and the byte offset (truncation, garbage, unknown type byte, bad tuple kind, trailing bytes).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TypeAlias, cast

from cdc_outbox.errors import DecodeError
from cdc_outbox.pgwire.pgoutput_messages import (
    UNCHANGED_TOAST,
    Begin,
    ColumnValue,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Relation,
    RelationColumn,
    StreamableMessage,
    StreamAbort,
    StreamCommit,
    Streamed,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    UnchangedToast,
    Update,
)
from cdc_outbox.pgwire.relations import RelationCache, UnknownRelationError

__all__ = [
    "UNCHANGED_TOAST",
    "Begin",
    "ColumnValue",
    "Commit",
    "Delete",
    "Insert",
    "Message",
    "Origin",
    "PgOutputMessage",
    "Relation",
    "RelationCache",
    "RelationColumn",
    "StreamAbort",
    "StreamCommit",
    "StreamStart",
    "StreamStop",
    "StreamableMessage",
    "Streamed",
    "Truncate",
    "TupleData",
    "Type",
    "UnchangedToast",
    "UnknownRelationError",
    "Update",
    "decode",
    "decode_insert",
]


_U16 = struct.Struct("!H").unpack_from
_U32 = struct.Struct("!I").unpack_from
_U64 = struct.Struct("!Q").unpack_from
_REL_COL = struct.Struct("!Ii")  # type oid, type modifier
_INSERT_HEAD = struct.Struct("!IB").unpack_from
_TRUNC_HEAD = struct.Struct("!IB")
_MSG_HEAD = struct.Struct("!BQ")
_STREAM_START = struct.Struct("!IB")
_STREAM_ABORT_V4 = struct.Struct("!IIQq")

_Parser: TypeAlias = Callable[[bytes, int, int], tuple[PgOutputMessage, int]]


class _Short(Exception):
    """Internal: ran past the end of the buffer at ``offset``."""

    def __init__(self, offset: int) -> None:
        self.offset = offset


def _tuple(buf: bytes, off: int, end: int) -> tuple[TupleData, int]:
    """TupleData at ``off``; returns it and the offset after it. Raises _Short/ValueError."""
    cols: list[ColumnValue] = []
    append = cols.append
    u32 = _U32
    try:
        (ncols,) = _U16(buf, off)
        off += 2
        for _ in range(ncols):
            kind = buf[off]
            if kind == 0x74 or kind == 0x62:  # 't' text, 'b' binary: Int32 length + bytes
                start = off + 5
                off = start + u32(buf, off + 1)[0]
                if off > end:
                    raise _Short(start)
                append(buf[start:off])
            elif kind == 0x6E:  # 'n' NULL
                append(None)
                off += 1
            elif kind == 0x75:  # 'u' unchanged TOASTed value
                append(UNCHANGED_TOAST)
                off += 1
            else:
                raise ValueError(f"bad tuple column kind {bytes([kind])!r} at offset {off}")
    except (IndexError, struct.error):
        raise _Short(off) from None  # ``off`` is where the incomplete column starts
    return tuple(cols), off


def _cstring(buf: bytes, off: int, end: int) -> tuple[str, int]:
    nul = buf.find(0, off, end)
    if nul < 0:
        raise _Short(end)
    try:
        return buf[off:nul].decode(), nul + 1
    except UnicodeDecodeError as e:
        raise ValueError(f"invalid UTF-8 in string at offset {off + e.start}") from None


def _need(off: int, size: int, end: int) -> None:
    if off + size > end:
        raise _Short(off)


def _fixed(cls: Callable[..., PgOutputMessage], fmt: str) -> _Parser:
    """Parser of a fixed-size message whose fields are exactly ``fmt``."""
    unpack = struct.Struct(fmt).unpack_from
    size = struct.calcsize(fmt)

    def parse(buf: bytes, off: int, end: int) -> tuple[PgOutputMessage, int]:
        if off + size > end:
            raise _Short(off)
        return cls(*unpack(buf, off)), off + size

    return parse


def _origin(buf: bytes, off: int, end: int) -> tuple[Origin, int]:
    _need(off, 8, end)
    (lsn,) = _U64(buf, off)
    name, off = _cstring(buf, off + 8, end)
    return Origin(lsn, name), off


def _relation(buf: bytes, off: int, end: int) -> tuple[Relation, int]:
    _need(off, 4, end)
    (oid,) = _U32(buf, off)
    namespace, off = _cstring(buf, off + 4, end)
    name, off = _cstring(buf, off, end)
    _need(off, 3, end)
    ident = chr(buf[off])
    (ncols,) = _U16(buf, off + 1)
    off += 3
    cols = []
    for _ in range(ncols):
        _need(off, 1, end)
        flags = buf[off]
        colname, off = _cstring(buf, off + 1, end)
        _need(off, 8, end)
        type_oid, typmod = _REL_COL.unpack_from(buf, off)
        off += 8
        cols.append(RelationColumn(flags, colname, type_oid, typmod))
    return Relation(oid, namespace, name, ident, tuple(cols)), off


def _type(buf: bytes, off: int, end: int) -> tuple[Type, int]:
    _need(off, 4, end)
    (oid,) = _U32(buf, off)
    namespace, off = _cstring(buf, off + 4, end)
    name, off = _cstring(buf, off, end)
    return Type(oid, namespace, name), off


def _insert_parts(buf: bytes, off: int, end: int) -> tuple[int, TupleData, int]:
    try:
        oid, tag = _INSERT_HEAD(buf, off)
    except struct.error:
        raise _Short(off) from None
    if tag != 0x4E:  # 'N'
        raise ValueError(f"expected 'N' but got {bytes([tag])!r} at offset {off + 4}")
    new, off = _tuple(buf, off + 5, end)
    return oid, new, off


def _insert(buf: bytes, off: int, end: int) -> tuple[Insert, int]:
    oid, new, off = _insert_parts(buf, off, end)
    return Insert(oid, new), off


def _interpreted_insert(buf: bytes) -> tuple[int, TupleData]:
    """:func:`decode_insert` without the compiled module: the common row in one loop built on
    ``struct`` (faster than :func:`~cdc_outbox.pgwire.insert_row.text_row` interpreted)."""
    try:
        oid, tag = _INSERT_HEAD(buf, 1)
        (ncols,) = _U16(buf, 6)
        if buf[0] == 0x49 and tag == 0x4E:  # 'I', 'N'
            cols: list[ColumnValue] = [None] * ncols
            u32 = _U32
            off = 8
            for i in range(ncols):
                kind = buf[off]
                if kind == 0x74:  # 't': Int32 length + bytes
                    start = off + 5
                    off = start + u32(buf, off + 1)[0]
                    cols[i] = buf[start:off]
                elif kind == 0x6E:  # 'n': NULL (already in place)
                    off += 1
                else:
                    break
            else:
                if off == len(buf):
                    return oid, tuple(cols)
    except (IndexError, struct.error):
        pass
    return _decode_insert_checked(buf)


try:
    from cdc_outbox.pgwire.insert_row import COMPILED
    from cdc_outbox.pgwire.insert_row import text_row as _text_row
except ImportError:  # a half-built extension (its runtime part missing): run interpreted
    COMPILED = False


def _compiled_insert(buf: bytes) -> tuple[int, TupleData]:
    """:func:`decode_insert` with the compiled module (bytes only; anything else, and any
    row it does not take, goes the checked way)."""
    row = _text_row(buf) if type(buf) is bytes else None
    return row if row is not None else _decode_insert_checked(buf)


#: Hot path for an Insert message (``buf[0] == ord("I")``, protocol v1, not streamed):
#: ``(relation_oid, new_tuple)`` with the same checks and errors as :func:`decode`. The common
#: row (text and NULL columns only, well formed) is read in one pass, by
#: :func:`cdc_outbox.pgwire.insert_row.text_row` when that module is compiled, else by an
#: interpreted loop; anything else (binary or unchanged-TOAST columns, any malformed input)
#: takes :func:`_insert_parts`, which gives the same tuple or raises the same error.
decode_insert: Callable[[bytes], tuple[int, TupleData]] = (
    _compiled_insert if COMPILED else _interpreted_insert
)


def _decode_insert_checked(buf: bytes) -> tuple[int, TupleData]:
    """:func:`decode_insert` for any input, column by column with every check."""
    end = len(buf)
    try:
        if buf[0] != 0x49:
            raise ValueError(f"not an Insert message: {buf[:1]!r}")
        oid, new, off = _insert_parts(buf, 1, end)
    except _Short as e:
        raise DecodeError(f"Insert: truncated at offset {e.offset}") from None
    except (ValueError, IndexError, struct.error) as e:
        raise DecodeError(f"Insert: {e}") from None
    if off != end:
        raise DecodeError(f"Insert: {end - off} trailing bytes at offset {off}")
    return oid, new


def _old_or_key(buf: bytes, off: int, end: int) -> tuple[TupleData | None, TupleData | None, int]:
    _need(off, 1, end)
    tag = buf[off]
    if tag == 0x4F:  # 'O'
        old, off = _tuple(buf, off + 1, end)
        return old, None, off
    if tag == 0x4B:  # 'K'
        key, off = _tuple(buf, off + 1, end)
        return None, key, off
    return None, None, off


def _update(buf: bytes, off: int, end: int) -> tuple[Update, int]:
    _need(off, 4, end)
    (oid,) = _U32(buf, off)
    old, key, off = _old_or_key(buf, off + 4, end)
    _need(off, 1, end)
    if buf[off] != 0x4E:
        raise ValueError(f"expected 'N' but got {buf[off : off + 1]!r} at offset {off}")
    new, off = _tuple(buf, off + 1, end)
    return Update(oid, old, key, new), off


def _delete(buf: bytes, off: int, end: int) -> tuple[Delete, int]:
    _need(off, 4, end)
    (oid,) = _U32(buf, off)
    old, key, off2 = _old_or_key(buf, off + 4, end)
    if off2 == off + 4:
        raise ValueError(f"expected 'K' or 'O' but got {buf[off2 : off2 + 1]!r} at offset {off2}")
    return Delete(oid, old, key), off2


def _truncate(buf: bytes, off: int, end: int) -> tuple[Truncate, int]:
    _need(off, 5, end)
    nrels, options = _TRUNC_HEAD.unpack_from(buf, off)
    off += 5
    _need(off, 4 * nrels, end)
    oids = struct.unpack_from(f"!{nrels}I", buf, off)
    return Truncate(options, oids), off + 4 * nrels


def _message(buf: bytes, off: int, end: int) -> tuple[Message, int]:
    _need(off, 9, end)
    flags, lsn = _MSG_HEAD.unpack_from(buf, off)
    prefix, off = _cstring(buf, off + 9, end)
    _need(off, 4, end)
    start = off + 4
    off = start + _U32(buf, off)[0]
    if off > end:
        raise _Short(start)
    return Message(bool(flags & 1), lsn, prefix, buf[start:off]), off


def _stream_start(buf: bytes, off: int, end: int) -> tuple[StreamStart, int]:
    _need(off, 5, end)
    xid, first = _STREAM_START.unpack_from(buf, off)
    return StreamStart(xid, first == 1), off + 5


def _stream_stop(buf: bytes, off: int, end: int) -> tuple[StreamStop, int]:
    return StreamStop(), off


_stream_abort_v2 = _fixed(StreamAbort, "!II")


def _stream_abort(buf: bytes, off: int, end: int) -> tuple[PgOutputMessage, int]:
    if end - off >= 24:  # v4 (parallel streaming) adds abort LSN and time
        return StreamAbort(*_STREAM_ABORT_V4.unpack_from(buf, off)), off + 24
    return _stream_abort_v2(buf, off, end)


_PARSERS: dict[int, tuple[str, _Parser]] = {
    ord("B"): ("Begin", _fixed(Begin, "!QqI")),
    ord("C"): ("Commit", _fixed(Commit, "!BQQq")),
    ord("O"): ("Origin", _origin),
    ord("R"): ("Relation", _relation),
    ord("Y"): ("Type", _type),
    ord("I"): ("Insert", _insert),
    ord("U"): ("Update", _update),
    ord("D"): ("Delete", _delete),
    ord("T"): ("Truncate", _truncate),
    ord("M"): ("Message", _message),
    ord("S"): ("StreamStart", _stream_start),
    ord("E"): ("StreamStop", _stream_stop),
    ord("c"): ("StreamCommit", _fixed(StreamCommit, "!IBQQq")),
    ord("A"): ("StreamAbort", _stream_abort),
}
_STREAMABLE = frozenset(ord(c) for c in "RYIUDTM")


def decode(buf: bytes | bytearray | memoryview, *, in_stream: bool = False) -> PgOutputMessage:
    """Decode one pgoutput message (the XLogData payload).

    With ``in_stream=True`` (between StreamStart and StreamStop, protocol v2+) changes carry a
    leading xid and come back wrapped in :class:`Streamed`. Raises :class:`DecodeError` on
    any malformed input; never anything else.
    """
    if type(buf) is not bytes:
        buf = bytes(buf)
    end = len(buf)
    if end == 0:
        raise DecodeError("pgoutput: empty message at offset 0")
    entry = _PARSERS.get(buf[0])
    if entry is None:
        raise DecodeError(f"pgoutput: unknown message type {buf[:1]!r} at offset 0")
    what, parse = entry
    xid = -1
    off = 1
    try:
        if in_stream and buf[0] in _STREAMABLE:
            _need(1, 4, end)
            (xid,) = _U32(buf, 1)
            off = 5
        msg, off = parse(buf, off, end)
    except _Short as e:
        raise DecodeError(f"{what}: truncated at offset {e.offset}") from None
    except (ValueError, IndexError, struct.error) as e:
        raise DecodeError(f"{what}: {e}") from None
    if off != end:
        raise DecodeError(f"{what}: {end - off} trailing bytes at offset {off}")
    if xid >= 0:
        return Streamed(xid, cast(StreamableMessage, msg))
    return msg
