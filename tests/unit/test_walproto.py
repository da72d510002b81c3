"""Copy-both framing: real frames captured from PostgreSQL 15, hand-built frames, garbage."""

from __future__ import annotations

import json
import struct
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.errors import DecodeError
from cdc_outbox.pgwire.walproto import (
    Keepalive,
    XLogData,
    parse_copy_data,
    pg_clock_from_datetime,
    pg_clock_now,
    pg_clock_to_datetime,
    pg_clock_to_unix,
    standby_status_update,
)

GOLDEN = json.loads((Path(__file__).parent / "golden" / "frames.json").read_text())
U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
I64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)


def _frames(stream: str) -> list[bytes]:
    return [bytes.fromhex(f["copy_data"]) for f in GOLDEN[stream]]


def test_golden_stream_starts_with_keepalive_then_xlogdata() -> None:
    for stream in ("v1", "v2_stream"):
        frames = _frames(stream)
        msgs = [parse_copy_data(f) for f in frames]
        first = msgs[0]
        assert isinstance(first, Keepalive)
        assert first.reply_requested is False and first.wal_end > 0
        for raw, m, meta in zip(frames[1:], msgs[1:], GOLDEN[stream][1:], strict=True):
            assert isinstance(m, XLogData)
            assert bytes(m.payload) == raw[25:]
            assert m.payload[0] == ord(meta["kind"])


def test_golden_xlogdata_header_fields() -> None:
    msgs = [parse_copy_data(f) for f in _frames("v1")]
    kinds = [f["kind"] for f in GOLDEN["v1"]]
    begin = msgs[kinds.index("B")]
    keepalive = msgs[0]
    assert isinstance(begin, XLogData) and isinstance(keepalive, Keepalive)
    assert begin.wal_start == begin.wal_end >= keepalive.wal_end
    # the server clock is "now" at capture time: within a day of the keepalive's clock
    assert abs(begin.server_clock - keepalive.server_clock) < 86_400_000_000
    assert pg_clock_to_datetime(begin.server_clock).year >= 2024
    # Surprise worth pinning: Relation and Type messages carry wal_start = wal_end = 0.
    for m, kind in zip(msgs, kinds, strict=True):
        if kind in ("R", "Y"):
            assert isinstance(m, XLogData) and m.wal_start == 0 and m.wal_end == 0


def test_keepalive_exact_bytes() -> None:
    raw = b"k" + struct.pack("!QQ?", 0x2AF8FA8, 123456789, True)
    assert parse_copy_data(raw) == Keepalive(0x2AF8FA8, 123456789, True)
    assert parse_copy_data(memoryview(raw)) == Keepalive(0x2AF8FA8, 123456789, True)


def test_xlogdata_payload_is_a_zero_copy_view() -> None:
    raw = bytearray(b"w" + struct.pack("!QQq", 1, 2, -3) + b"Ipayload")
    m = parse_copy_data(memoryview(raw))
    assert isinstance(m, XLogData)
    assert (m.wal_start, m.wal_end, m.server_clock) == (1, 2, -3)
    raw[-1] = ord("!")
    assert bytes(m.payload) == b"Ipayloa!"


def test_empty_payload_is_allowed_at_this_layer() -> None:
    m = parse_copy_data(b"w" + bytes(24))
    assert isinstance(m, XLogData) and len(m.payload) == 0


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"", "CopyData: empty message at offset 0"),
        (b"x123", r"CopyData: unknown message type b'x' at offset 0"),
        (b"w" + bytes(23), "XLogData: truncated header at offset 24"),
        (b"k" + bytes(16), "Keepalive: expected 18 bytes at offset 0, got 17 .truncated"),
        (b"k" + bytes(18), "Keepalive: expected 18 bytes at offset 0, got 19 .trailing"),
    ],
)
def test_bad_frames(raw: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        parse_copy_data(raw)


@given(st.binary(max_size=64))
def test_garbage_raises_only_decode_error(raw: bytes) -> None:
    try:
        m = parse_copy_data(raw)
    except DecodeError:
        return
    assert isinstance(m, XLogData | Keepalive)


@given(U64, U64, I64, st.binary(max_size=40))
def test_xlogdata_round_trip(start: int, end: int, clock: int, payload: bytes) -> None:
    m = parse_copy_data(b"w" + struct.pack("!QQq", start, end, clock) + payload)
    assert m == XLogData(start, end, clock, memoryview(payload))


@given(U64, I64, st.booleans())
def test_keepalive_round_trip(end: int, clock: int, reply: bool) -> None:
    assert parse_copy_data(b"k" + struct.pack("!Qq?", end, clock, reply)) == Keepalive(
        end, clock, reply
    )


def test_standby_status_update_layout() -> None:
    msg = standby_status_update(30, 20, 10, reply_requested=True, clock_us=42)
    assert len(msg) == 34
    assert msg == b"r" + struct.pack("!QQQq", 30, 20, 10, 42) + b"\x01"
    assert standby_status_update(1, 1, 1, clock_us=0)[-1] == 0


def test_standby_status_update_default_clock_is_now() -> None:
    before = pg_clock_now()
    msg = standby_status_update(5, 5, 5)
    after = pg_clock_now()
    (clock,) = struct.unpack_from("!q", msg, 25)
    assert before <= clock <= after


@given(U64, U64, U64, I64, st.booleans())
def test_standby_status_update_round_trip(w: int, f: int, a: int, clock: int, r: bool) -> None:
    msg = standby_status_update(w, f, a, reply_requested=r, clock_us=clock)
    assert struct.unpack("!cQQQq?", msg) == (b"r", w, f, a, clock, r)


@pytest.mark.parametrize("bad", [-1, 1 << 64])
def test_standby_status_update_rejects_out_of_range(bad: int) -> None:
    with pytest.raises(ValueError, match="flushed LSN out of range"):
        standby_status_update(0, bad, 0, clock_us=0)


def test_pg_clock() -> None:
    assert pg_clock_to_datetime(0) == datetime(2000, 1, 1, tzinfo=UTC)
    # the origin timestamp set in the golden capture ('2024-01-02 00:00:00+00')
    assert pg_clock_to_datetime(757_468_800_000_000) == datetime(2024, 1, 2, tzinfo=UTC)
    now = datetime.now(UTC)
    assert abs(pg_clock_to_datetime(pg_clock_now()) - now) < timedelta(seconds=5)
    assert abs(pg_clock_now() - (time.time() - 946_684_800) * 1e6) < 5e6
    with pytest.raises(ValueError, match="naive"):
        pg_clock_from_datetime(datetime(2024, 1, 1))


@given(st.integers(min_value=-(10**16), max_value=10**17))
def test_pg_clock_round_trip(us: int) -> None:
    assert pg_clock_from_datetime(pg_clock_to_datetime(us)) == us


@given(st.integers(min_value=-(10**15), max_value=4 * 10**15))  # 1968-2126: µs fit a float
def test_pg_clock_to_unix_is_the_datetime_s_timestamp(us: int) -> None:
    assert pg_clock_to_unix(us) == pytest.approx(pg_clock_to_datetime(us).timestamp(), abs=1e-6)
    assert pg_clock_to_unix(0) == 946_684_800.0
