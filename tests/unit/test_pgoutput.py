"""pgoutput decoder: real frames from PostgreSQL 15 (golden/frames.json), hand-built frames
round-tripped through a test-only encoder, and truncated/garbage input (DecodeError only)."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cdc_outbox.errors import DecodeError
from cdc_outbox.pgwire import pgoutput as pgoutput_module
from cdc_outbox.pgwire.pgoutput import (
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
    RelationCache,
    RelationColumn,
    StreamAbort,
    StreamCommit,
    Streamed,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    UnchangedToast,
    UnknownRelationError,
    Update,
    decode,
    decode_insert,
)

GOLDEN = json.loads((Path(__file__).parent / "golden" / "frames.json").read_text())
META = GOLDEN["meta"]
OIDS: dict[str, int] = META["relation_oids"]
NAMES = {oid: name for name, oid in OIDS.items()}
HEADER = 25  # XLogData header


def payloads(stream: str) -> list[bytes]:
    frames = GOLDEN[stream]
    return [bytes.fromhex(f["copy_data"])[HEADER:] for f in frames if f["kind"] != "keepalive"]


def xlog_starts(stream: str) -> list[int]:
    return [
        struct.unpack_from("!Q", bytes.fromhex(f["copy_data"]), 1)[0]
        for f in GOLDEN[stream]
        if f["kind"] != "keepalive"
    ]


# --- a test-only encoder (the inverse of decode) -----------------------------------------


def enc_str(s: str) -> bytes:
    return s.encode() + b"\0"


def enc_tuple(t: TupleData) -> bytes:
    out = [struct.pack("!H", len(t))]
    for v in t:
        if v is None:
            out.append(b"n")
        elif v is UNCHANGED_TOAST:
            out.append(b"u")
        else:
            assert isinstance(v, bytes)
            out.append(b"t" + struct.pack("!I", len(v)) + v)
    return b"".join(out)


def enc_old(old: TupleData | None, key: TupleData | None) -> bytes:
    if old is not None:
        return b"O" + enc_tuple(old)
    return b"" if key is None else b"K" + enc_tuple(key)


def encode(m: PgOutputMessage) -> bytes:
    match m:
        case Begin():
            return b"B" + struct.pack("!QqI", m.final_lsn, m.commit_time, m.xid)
        case Commit():
            return b"C" + struct.pack("!BQQq", m.flags, m.commit_lsn, m.end_lsn, m.commit_time)
        case Origin():
            return b"O" + struct.pack("!Q", m.commit_lsn) + enc_str(m.name)
        case Relation():
            cols = b"".join(
                bytes([c.flags]) + enc_str(c.name) + struct.pack("!Ii", c.type_oid, c.type_modifier)
                for c in m.columns
            )
            return (
                b"R"
                + struct.pack("!I", m.oid)
                + enc_str(m.namespace)
                + enc_str(m.name)
                + m.replica_identity.encode()
                + struct.pack("!H", len(m.columns))
                + cols
            )
        case Type():
            return b"Y" + struct.pack("!I", m.oid) + enc_str(m.namespace) + enc_str(m.name)
        case Insert():
            return b"I" + struct.pack("!I", m.relation_oid) + b"N" + enc_tuple(m.new)
        case Update():
            return (
                b"U"
                + struct.pack("!I", m.relation_oid)
                + enc_old(m.old, m.key)
                + b"N"
                + enc_tuple(m.new)
            )
        case Delete():
            return b"D" + struct.pack("!I", m.relation_oid) + enc_old(m.old, m.key)
        case Truncate():
            n = len(m.relation_oids)
            return b"T" + struct.pack(f"!IB{n}I", n, m.options, *m.relation_oids)
        case Message():
            return (
                b"M"
                + struct.pack("!BQ", int(m.transactional), m.lsn)
                + enc_str(m.prefix)
                + struct.pack("!I", len(m.content))
                + m.content
            )
        case StreamStart():
            return b"S" + struct.pack("!IB", m.xid, int(m.first_segment))
        case StreamStop():
            return b"E"
        case StreamCommit():
            return b"c" + struct.pack(
                "!IBQQq", m.xid, m.flags, m.commit_lsn, m.end_lsn, m.commit_time
            )
        case StreamAbort():
            tail = b"" if m.abort_lsn is None else struct.pack("!Qq", m.abort_lsn, m.abort_time)
            return b"A" + struct.pack("!II", m.xid, m.subxid) + tail
        case Streamed():
            inner = encode(m.message)
            return inner[:1] + struct.pack("!I", m.xid) + inner[1:]
    raise AssertionError(m)


# --- golden frames -------------------------------------------------------------------------

TOAST_DOC = b"0123456789" * 500
TS = b"2024-01-02 03:04:05+00"
OUTBOX_COLS = (
    (1, "id", 2950, -1), (0, "aggregate_type", 25, -1), (0, "aggregate_id", 25, -1),
    (0, "event_type", 25, -1), (0, "payload", 3802, -1), (0, "headers", 3802, -1),
    (0, "created_at", 1184, -1), (0, "status", 25, -1), (0, "attempts", 23, -1),
    (0, "available_at", 1184, -1), (0, "locked_at", 1184, -1), (0, "locked_by", 25, -1),
    (0, "published_at", 1184, -1), (0, "last_error", 25, -1),
)  # fmt: skip
ITEM_COLS = (
    (1, "id", 23, -1), (0, "name", 25, -1), (0, "feeling", META["mood_type_oid"], -1),
    (0, "doc", 25, -1), (0, "price", 1700, (10 << 16 | 2) + 4), (0, "note", 25, -1),
)  # fmt: skip
AUDIT_COLS = ((1, "id", 20, -1), (1, "actor", 25, -1), (1, "detail", 3802, -1))
OUTBOX_TAIL = (TS, b"PENDING", b"0", TS, None, None, None, None)
MOOD = ("Type", "public", "mood")


def summary(m: PgOutputMessage) -> tuple[Any, ...]:
    """The deterministic fields (OIDs as table names; LSNs/xids/times checked separately)."""
    match m:
        case Begin():
            return ("Begin",)
        case Commit():
            return ("Commit", m.flags)
        case Relation():
            cols = tuple((c.flags, c.name, c.type_oid, c.type_modifier) for c in m.columns)
            return ("Relation", NAMES[m.oid], m.namespace, m.name, m.replica_identity, cols)
        case Type():
            assert m.oid == META["mood_type_oid"]
            return ("Type", m.namespace, m.name)
        case Insert():
            return ("Insert", NAMES[m.relation_oid], m.new)
        case Update():
            return ("Update", NAMES[m.relation_oid], m.old, m.key, m.new)
        case Delete():
            return ("Delete", NAMES[m.relation_oid], m.old, m.key)
        case Truncate():
            return ("Truncate", m.options, tuple(NAMES[o] for o in m.relation_oids))
        case Message():
            return ("Message", m.transactional, m.prefix, m.content)
        case Origin():
            return ("Origin", m.commit_lsn, m.name)
    raise AssertionError(m)


EXPECTED_V1 = [
    ("Begin",),
    ("Relation", "outbox", "public", "outbox", "d", OUTBOX_COLS),
    ("Insert", "outbox", (
        b"00000000-0000-4000-8000-000000000001", b"order", b"order-42", b"OrderPlaced",
        # jsonb comes back normalised: keys reordered (shorter first), spacing canonical
        '{"note": "ünïcode", "items": ["a", "b"], "total": 12.5}'.encode(),
        b'{"nested": {"a": [1, 2]}, "attempt": 1, "trace_id": "abc123"}', *OUTBOX_TAIL)),
    ("Insert", "outbox", (b"00000000-0000-4000-8000-000000000002", b"order", b"order-42",
                          b"OrderPaid", b"{}", b"{}", *OUTBOX_TAIL)),
    ("Message", True, "cdc", b"hello"),
    ("Commit", 0),
    ("Begin",),
    ("Insert", "outbox", (b"00000000-0000-4000-8000-000000000003", b"order", None, b"Broken",
                          None, None, *OUTBOX_TAIL)),
    ("Insert", "outbox", (b"00000000-0000-4000-8000-000000000004", b"order", b"order-7", b"Odd",
                          b"[1, 2]", b"[1]", *OUTBOX_TAIL)),
    ("Commit", 0),
    ("Begin",), MOOD,
    ("Relation", "item", "public", "item", "d", ITEM_COLS),
    ("Insert", "item", (b"1", b"widget", b"happy", TOAST_DOC, b"9.99", None)),
    ("Commit", 0),
    ("Begin",),
    ("Update", "item", None, None, (b"1", b"widget", b"happy", UNCHANGED_TOAST, b"10.50", None)),
    ("Commit", 0),
    ("Begin",),
    ("Update", "item", None, (b"1", None, None, None, None, None),
     (b"2", b"gadget", b"happy", UNCHANGED_TOAST, b"10.50", None)),
    ("Commit", 0),
    ("Begin",),
    ("Relation", "audit", "public", "audit", "f", AUDIT_COLS),
    ("Insert", "audit", (b"1", b"alice", b'{"x": 1}')),
    ("Update", "audit", (b"1", b"alice", b'{"x": 1}'), None, (b"1", b"bob", b'{"x": 1}')),
    ("Delete", "audit", (b"1", b"bob", b'{"x": 1}'), None),
    ("Commit", 0),
    ("Begin",),
    ("Delete", "item", None, (b"2", None, None, None, None, None)),
    ("Commit", 0),
    ("Begin",),
    ("Insert", "item", (b"3", b"x", None, None, None, None)),
    ("Commit", 0),
    # TRUNCATE invalidates the relcache: Type and Relation messages are sent again
    ("Begin",), MOOD,
    ("Relation", "item", "public", "item", "d", ITEM_COLS),
    ("Relation", "audit", "public", "audit", "f", AUDIT_COLS),
    ("Truncate", 2, ("item", "audit")),
    ("Commit", 0),
    ("Begin",),
    ("Relation", "audit", "public", "audit", "f", AUDIT_COLS),
    ("Truncate", 0, ("audit",)),
    ("Commit", 0),
    # the rolled-back transaction: only its non-transactional message, outside Begin/Commit
    ("Message", False, "cdc", b"non-transactional"),
    ("Begin",),
    ("Relation", "outbox", "public", "outbox", "d", (*OUTBOX_COLS, (0, "tenant", 25, -1))),
    ("Insert", "outbox", (b"00000000-0000-4000-8000-000000000005", b"customer", b"c-1",
                          b"CustomerCreated", b'{"name": "Ann"}', b"{}", *OUTBOX_TAIL, b"acme")),
    ("Commit", 0),
    ("Begin",),
    ("Origin", 0xABCDEF, "golden_origin"),
    ("Relation", "audit", "public", "audit", "f", AUDIT_COLS),
    ("Insert", "audit", (b"2", b"origin", None)),
    ("Commit", 0),
    ("Begin",),
    ("Message", True, "golden", b"end"),
]  # fmt: skip


def test_golden_v1_decodes_to_exact_fields() -> None:
    msgs = [decode(p) for p in payloads("v1")]
    assert [summary(m) for m in msgs] == EXPECTED_V1


def test_golden_v1_lsns_xids_and_times_are_consistent() -> None:
    msgs = [decode(p) for p in payloads("v1")]
    starts = xlog_starts("v1")
    begins = [m for m in msgs if isinstance(m, Begin)]
    commits = [m for m in msgs if isinstance(m, Commit)]
    assert len(begins) == len(commits) + 1  # capture stops at the end marker
    xids = [b.xid for b in begins]
    assert xids == sorted(set(xids))
    for b, c in zip(begins, commits, strict=False):
        assert b.final_lsn == c.commit_lsn < c.end_lsn
        assert b.commit_time == c.commit_time
    ends = [c.end_lsn for c in commits]
    assert ends == sorted(ends)  # commit order
    for i, m in enumerate(msgs):
        if isinstance(m, Commit):
            assert starts[i] == m.end_lsn  # the Commit's XLogData starts at its end LSN
    # a replayed transaction reports the origin's commit timestamp, not the local one
    origin_begin = begins[-2]
    assert origin_begin.commit_time == 757_468_800_000_000  # 2024-01-02 00:00:00 UTC
    # a transactional Message's LSN is the END of its WAL record (= the commit record start)
    first_msg = msgs[4]
    assert isinstance(first_msg, Message) and first_msg.lsn == begins[0].final_lsn


def test_golden_decode_accepts_memoryview_and_bytearray() -> None:
    for p in payloads("v1"):
        assert decode(memoryview(p)) == decode(bytearray(p)) == decode(p)


def test_golden_v2_stream() -> None:
    msgs: list[PgOutputMessage] = []
    in_stream = False
    for p in payloads("v2_stream"):
        m = decode(p, in_stream=in_stream)
        in_stream = isinstance(m, StreamStart) or (in_stream and not isinstance(m, StreamStop))
        msgs.append(m)
    starts = [m for m in msgs if isinstance(m, StreamStart)]
    assert [(s.first_segment) for s in starts] == [True, False, True]
    a, b = starts[0].xid, starts[2].xid
    assert starts[1].xid == a and b > a
    streamed = [m for m in msgs if isinstance(m, Streamed)]
    inserts_a = [s.message for s in streamed if s.xid == a and isinstance(s.message, Insert)]
    assert len(inserts_a) == 600
    bulk = OIDS["bulk"]
    # binary 'true': int4 comes as 4 big-endian bytes, text as its UTF-8 bytes
    assert inserts_a[0] == Insert(bulk, (struct.pack("!i", 1), b"row 1"))
    assert inserts_a[-1] == Insert(bulk, (struct.pack("!i", 600), b"row 600"))
    rels = [s.message for s in streamed if isinstance(s.message, Relation)]
    assert [(r.oid, s) for r, s in zip(rels, (a, b), strict=True)] == [(bulk, a), (bulk, b)]
    (emitted,) = [s.message for s in streamed if isinstance(s.message, Message)]
    assert emitted.transactional and (emitted.prefix, emitted.content) == ("cdc", b"in stream")
    commit = next(m for m in msgs if isinstance(m, StreamCommit))
    assert commit.xid == a and commit.flags == 0 and commit.commit_lsn < commit.end_lsn
    abort = next(m for m in msgs if isinstance(m, StreamAbort))
    assert abort == StreamAbort(b, b)
    # a rolled-back streamed transaction: part of it was streamed, then aborted
    inserts_b = [s for s in streamed if s.xid == b and isinstance(s.message, Insert)]
    assert 0 < len(inserts_b) < 500
    assert all(isinstance(i.message, Insert) and i.message.new[1] is None for i in inserts_b)
    kinds = [type(m).__name__ for m in msgs]
    assert kinds[-4:] == ["StreamStop", "StreamAbort", "Begin", "Message"]  # then the end marker
    # streamed changes never appear outside a stream block and every block is closed
    assert kinds.count("StreamStart") == kinds.count("StreamStop") == 3


@pytest.mark.parametrize("stream", ["v1", "v2_stream"])
def test_every_truncation_of_golden_frames_is_a_decode_error(stream: str) -> None:
    seen = 0
    in_stream = False
    for p in payloads(stream):
        full = decode(p, in_stream=in_stream)
        if isinstance(full, StreamStart | StreamStop):
            in_stream = isinstance(full, StreamStart)
        if len(p) > 600 and stream == "v2_stream":
            continue
        for cut in range(len(p)):
            with pytest.raises(DecodeError, match=r"(truncated|empty) .*at offset \d+"):
                decode(p[:cut], in_stream=in_stream)
            seen += 1
        with pytest.raises(DecodeError, match="1 trailing bytes at offset"):
            decode(p + b"\0", in_stream=in_stream)
    assert seen > 1000


def test_error_messages_name_type_and_offset() -> None:
    ins = encode(Insert(7, (b"ab", None)))
    with pytest.raises(DecodeError, match=r"^Insert: truncated at offset 13$"):
        decode(ins[:14])  # cut inside the 't' value that starts at offset 13
    with pytest.raises(DecodeError, match=r"^Insert: truncated at offset 15$"):
        decode(ins[:15])  # the second column is missing
    with pytest.raises(DecodeError, match=r"^Insert: bad tuple column kind b'x' at offset 15$"):
        decode(ins[:15] + b"x")
    with pytest.raises(DecodeError, match=r"^Insert: 2 trailing bytes at offset 16$"):
        decode(ins + b"zz")
    with pytest.raises(DecodeError, match=r"^Insert: expected 'N' but got b'K' at offset 5$"):
        decode(b"I" + struct.pack("!I", 7) + b"K" + enc_tuple(()))
    with pytest.raises(DecodeError, match=r"^pgoutput: unknown message type b'Z' at offset 0$"):
        decode(b"Z123")
    with pytest.raises(DecodeError, match=r"^pgoutput: empty message at offset 0$"):
        decode(b"")
    with pytest.raises(DecodeError, match=r"^Delete: expected 'K' or 'O' but got b'N'"):
        decode(b"D" + struct.pack("!I", 1) + b"N" + enc_tuple(()))
    with pytest.raises(DecodeError, match=r"^Relation: invalid UTF-8 in string at offset 6$"):
        decode(b"R" + struct.pack("!I", 1) + b"a\xff\0t\0d\0\0")
    with pytest.raises(DecodeError, match=r"^Type: truncated at offset 15$"):
        decode(b"Y" + struct.pack("!I", 1) + b"pub\0" + b"no-nul")


def test_streamed_changes_need_in_stream() -> None:
    s = encode(Streamed(99, Insert(7, (b"x",))))
    assert decode(s, in_stream=True) == Streamed(99, Insert(7, (b"x",)))
    with pytest.raises(DecodeError):
        decode(s)  # without the flag the xid is read as the relation OID and 'N' is missing
    # control messages have no xid prefix even inside a stream block
    assert decode(b"E", in_stream=True) == StreamStop()


def test_stream_abort_v4_fields() -> None:
    raw = b"A" + struct.pack("!IIQq", 5, 6, 0x10, 42)
    assert decode(raw) == StreamAbort(5, 6, 0x10, 42)


def test_unchanged_toast_sentinel() -> None:
    assert UnchangedToast() is UNCHANGED_TOAST
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"
    assert pickle.loads(pickle.dumps(UNCHANGED_TOAST)) is UNCHANGED_TOAST
    assert UNCHANGED_TOAST is not None and UNCHANGED_TOAST != b""


def test_relation_cache() -> None:
    cache = RelationCache()
    r1 = Relation(10, "public", "outbox", "d", (RelationColumn(1, "id", 2950, -1),))
    r2 = Relation(10, "public", "outbox", "d", ())
    cache.put(r1)
    assert cache.get(10) is r1 and len(cache) == 1 and 10 in cache
    cache.put(r2)  # a newer Relation (schema change) replaces the older one
    assert cache.get(10) is r2 and len(cache) == 1
    with pytest.raises(UnknownRelationError, match="no Relation message for relation OID 11"):
        cache.get(11)
    with pytest.raises(KeyError):
        cache.get(11)
    with pytest.raises(DecodeError):
        cache.get(11)
    cache.clear()
    assert len(cache) == 0 and 10 not in cache


# --- hypothesis ----------------------------------------------------------------------------

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\0"), max_size=12)
value: st.SearchStrategy[ColumnValue] = st.one_of(
    st.binary(max_size=20), st.none(), st.just(UNCHANGED_TOAST)
)
tuples = st.lists(value, max_size=6).map(tuple)
maybe_tuple = st.none() | tuples
i32 = st.integers(-(2**31), 2**31 - 1)
rel_cols = st.builds(RelationColumn, st.integers(0, 255), text, u32, i32)

streamable = st.one_of(
    st.builds(Relation, u32, text, text, st.sampled_from("dnfi"),
              st.lists(rel_cols, max_size=4).map(tuple)),
    st.builds(Type, u32, text, text),
    st.builds(Insert, u32, tuples),
    st.builds(Update, u32, maybe_tuple, st.none(), tuples),
    st.builds(Update, u32, st.none(), tuples, tuples),
    st.builds(Delete, u32, tuples, st.none()),
    st.builds(Delete, u32, st.none(), tuples),
    st.builds(Truncate, st.integers(0, 3), st.lists(u32, max_size=4).map(tuple)),
    st.builds(Message, st.booleans(), u64, text, st.binary(max_size=30)),
)  # fmt: skip
messages = st.one_of(
    streamable,
    st.builds(Begin, u64, i64, u32),
    st.builds(Commit, st.integers(0, 255), u64, u64, i64),
    st.builds(Origin, u64, text),
    st.builds(StreamStart, u32, st.booleans()),
    st.just(StreamStop()),
    st.builds(StreamCommit, u32, st.integers(0, 255), u64, u64, i64),
    st.builds(StreamAbort, u32, u32),
    st.builds(StreamAbort, u32, u32, u64, i64),
)


@given(messages)
def test_round_trip(m: PgOutputMessage) -> None:
    assert decode(encode(m)) == m


@given(u32, streamable)
def test_round_trip_in_stream(xid: int, m: PgOutputMessage) -> None:
    s = Streamed(xid, m)  # type: ignore[arg-type]
    assert decode(encode(s), in_stream=True) == s


@given(messages, st.data())
def test_truncated_hand_built_frames(m: PgOutputMessage, data: st.DataObject) -> None:
    raw = encode(m)
    cut = data.draw(st.integers(0, len(raw) - 1))
    if isinstance(m, StreamAbort) and m.abort_lsn is not None and cut == 9:
        return  # exactly a v2 abort: valid
    with pytest.raises(DecodeError):
        decode(raw[:cut])


def _decode_or_error(raw: bytes, in_stream: bool) -> None:
    try:
        decode(raw, in_stream=in_stream)
    except DecodeError as e:
        assert "offset" in str(e)


@given(st.binary(max_size=80), st.booleans())
@example(b"T\xff\xff\xff\xff\x00", False)
@example(b"I\x00\x00\x00\x01N\xff\xff", False)
@example(b"M\x01" + bytes(8) + b"p\0\xff\xff\xff\xff", False)
def test_garbage_raises_only_decode_error(raw: bytes, in_stream: bool) -> None:
    _decode_or_error(raw, in_stream)


@given(st.sampled_from(sorted(set(b"BCORYIUDTMSEcA"))), st.binary(max_size=60), st.booleans())
def test_garbage_after_valid_type_byte(kind: int, body: bytes, in_stream: bool) -> None:
    _decode_or_error(bytes([kind]) + body, in_stream)


GOLDEN_SMALL = [p for p in payloads("v1") if len(p) < 400]


@given(st.sampled_from(GOLDEN_SMALL), st.data())
def test_mutated_golden_frames(p: bytes, data: st.DataObject) -> None:
    buf = bytearray(p)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    _decode_or_error(bytes(buf), False)


# --- decode_insert: the hot path gives what decode gives, errors included --------------------

wide_value: st.SearchStrategy[ColumnValue] = st.one_of(
    st.binary(max_size=300), st.none(), st.just(UNCHANGED_TOAST)
)


def _insert_or_error(raw: bytes) -> tuple[int, TupleData] | str:
    try:
        msg = decode(raw)
    except DecodeError as e:
        return str(e)
    if not isinstance(msg, Insert):
        return "not an Insert"
    return msg.relation_oid, msg.new


#: Both ways of the hot path: with the mypyc-compiled module (tested compiled when the
#: checkout was installed with a C compiler: test_insert_row.py) and without it.
HOT_PATHS = [
    pytest.param(pgoutput_module._compiled_insert, id="compiled"),
    pytest.param(pgoutput_module._interpreted_insert, id="interpreted"),
]


def _hot_or_error(raw: bytes, hot: Any = decode_insert) -> tuple[int, TupleData] | str:
    try:
        return cast(tuple[int, TupleData], hot(raw))
    except DecodeError as e:
        return str(e)


@pytest.mark.parametrize("hot", HOT_PATHS)
@given(m=st.builds(Insert, u32, st.lists(wide_value, max_size=20).map(tuple)))
def test_decode_insert_is_decode(hot: Any, m: Insert) -> None:
    assert hot(encode(m)) == (m.relation_oid, m.new)


@pytest.mark.parametrize("hot", HOT_PATHS)
@given(m=st.builds(Insert, u32, st.lists(wide_value, max_size=8).map(tuple)), data=st.data())
def test_decode_insert_errors_are_decodes(hot: Any, m: Insert, data: st.DataObject) -> None:
    """Cut, grown or mutated: the same tuple or the same DecodeError as :func:`decode`."""
    raw = bytearray(encode(m))
    how = data.draw(st.sampled_from(["cut", "grow", "mutate"]))
    if how == "cut":
        raw = raw[: data.draw(st.integers(1, len(raw)))]
    elif how == "grow":
        raw += data.draw(st.binary(min_size=1, max_size=6))
    else:
        for _ in range(data.draw(st.integers(1, 3))):
            i = data.draw(st.integers(1, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
    got = _hot_or_error(bytes(raw), hot)
    expected = _insert_or_error(bytes(raw))
    if expected == "not an Insert":
        assert isinstance(got, str)
    else:
        assert got == expected


@pytest.mark.parametrize("hot", HOT_PATHS)
def test_decode_insert_golden_frames(hot: Any) -> None:
    inserts = [p for p in payloads("v1") if p[0] == ord("I")]
    assert inserts
    for p in inserts:
        msg = decode(p)
        assert isinstance(msg, Insert)
        assert hot(p) == (msg.relation_oid, msg.new)
