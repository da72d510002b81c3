"""wait_for_standbys: the pure gate (which held transactions a standby has) and the stream
wrapper that holds frames, against a list of frames and a scripted standby position."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.cdc.history import History
from cdc_outbox.cdc.standby_gate import StandbyGate, release_point
from cdc_outbox.cdc.standby_wait import GatedStream, StandbyPoller
from cdc_outbox.config.input import parse_standby_names
from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import ConfigError
from cdc_outbox.pgwire.walproto import Keepalive, parse_copy_data
from cdc_outbox.telemetry.relay_stats import RelayStats


def _w(payload: bytes) -> bytes:
    return b"w" + struct.pack("!QQQ", 0, 0, 0) + payload


def _txn(end_lsn: int, rows: int = 1) -> list[bytes]:
    begin = _w(b"B" + struct.pack("!QqI", end_lsn - 8, 0, 1))
    inserts = [_w(b"I" + bytes([i])) for i in range(rows)]
    return [begin, *inserts, _w(b"C" + struct.pack("!BQQq", 0, end_lsn - 8, end_lsn, 0))]


def _keepalive(wal_end: int, reply: bool) -> bytes:
    return b"k" + struct.pack("!QQB", wal_end, 0, int(reply))


def _feed(gate: StandbyGate, frames: list[bytes]) -> None:
    for f in frames:
        kind = f[25]
        if kind == ord("B"):
            gate.begin(f, 0.0)
        elif kind == ord("C"):
            gate.commit(f, struct.unpack_from("!Q", f, 25 + 10)[0])
        else:
            gate.add(f, 0.0)


def test_release_point_is_the_newest_listed_flush() -> None:
    assert release_point([]) == 0
    assert release_point([None, 5, 9, None]) == 9


def test_a_transaction_is_released_once_flushed_up_to_its_end() -> None:
    gate = StandbyGate()
    first, second = _txn(100, rows=2), _txn(200)
    _feed(gate, first + second)
    assert gate.held_transactions == 2 and gate.waiting_for() == 100
    assert gate.pop_released(99) == []
    assert gate.pop_released(100) == first
    assert gate.pop_released(10_000) == second
    assert gate.empty and gate.held_frames == 0


def test_an_open_transaction_is_never_released() -> None:
    gate = StandbyGate()
    _feed(gate, _txn(100)[:-1])
    assert gate.pop_released(2**63) == []
    assert gate.in_transaction and not gate.empty


@given(
    ends=st.lists(st.integers(10, 1000), min_size=1, max_size=20).map(sorted),
    flushes=st.lists(st.integers(0, 1100), max_size=20),
    open_tail=st.booleans(),
)
def test_released_frames_keep_order_and_never_pass_the_standby(
    ends: list[int], flushes: list[int], open_tail: bool
) -> None:
    gate = StandbyGate()
    frames = [f for end in ends for f in _txn(end)]
    _feed(gate, frames + (_txn(5000)[:-1] if open_tail else []))
    out: list[bytes] = []
    reached = 0
    for flushed in flushes:
        reached = max(reached, flushed)  # a standby's flush position only grows
        released = gate.pop_released(reached)
        for f in released:  # nothing whose commit the standby does not have
            if f[25] == ord("C"):
                assert struct.unpack_from("!Q", f, 35)[0] <= reached
        out += released
    assert out == frames[: len(out)]  # a prefix, in stream order
    # everything a standby has is out: the next held commit is past it
    assert gate.waiting_for() is None or gate.waiting_for() > reached  # type: ignore[operator]
    assert gate.held_frames == len(frames) - len(out) + (len(_txn(5000)) - 1) * open_tail


def test_parse_standby_names() -> None:
    assert parse_standby_names("*") is None
    assert parse_standby_names(" a, b ") == frozenset({"a", "b"})
    for bad in ("a,,b", "a,*", ""):
        with pytest.raises(ValueError):
            parse_standby_names(bad)


def test_a_bad_wait_for_standbys_setting_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cdc_outbox.config.settings import load_settings

    monkeypatch.setenv("CDC_OUTBOX_DSN", "postgresql://u@h/d")
    monkeypatch.setenv("CDC_OUTBOX_WAIT_FOR_STANDBYS", "s1,,s2")
    with pytest.raises(ConfigError, match="wait_for_standbys"):
        load_settings(None)
    assert Settings.model_validate({"wait_for_standbys": " s1 "}).wait_for_standbys == "s1"


class _Frames:
    """The inner replication stream: hands out a list of frames."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = list(frames)

    is_open = True

    def identify(self) -> tuple[str, str]:
        return ("1", "1")

    def connect(self) -> History:
        raise NotImplementedError

    def start(self, start_lsn: int) -> int:
        return start_lsn

    def create_slot(self) -> tuple[int, str]:
        raise NotImplementedError

    def read(self, timeout: float) -> None:
        raise NotImplementedError

    def read_raw(self, timeout: float) -> bytes | None:
        return self.frames.pop(0) if self.frames else None

    def send_status(self, written: int, flushed: int, *, reply_requested: bool = False) -> None:
        pass

    def close(self) -> None:
        pass


class _Standby(StandbyPoller):
    def __init__(self) -> None:
        super().__init__("", None)
        self.position = 0
        self.polls = 0

    def flushed(self) -> int | None:
        self.polls += 1
        return self.position


def _drain(stream: GatedStream) -> list[bytes]:
    out = []
    while (frame := stream.read_raw(0.0)) is not None:
        out.append(bytes(frame))
    return out


def test_the_stream_holds_transactions_and_keepalives_until_the_standby_has_them() -> None:
    first, second = _txn(100), _txn(200)
    inner = _Frames([*first, _keepalive(150, reply=True), *second, _keepalive(250, reply=False)])
    standby, stats = _Standby(), RelayStats()
    stream = GatedStream(inner, standby, stats, limit=1000)
    out = _drain(stream)
    # nothing of a transaction; the reply request answered with a keepalive that confirms nothing
    assert [parse_copy_data(f) for f in out] == [Keepalive(0, 0, True)]
    assert stats.standby_held_transactions == 2
    standby.position = 100
    stream._next_poll = 0.0
    assert _drain(stream) == first
    standby.position = 10_000
    stream._next_poll = 0.0
    assert _drain(stream) == second
    assert stats.standby_held_transactions == 0
    inner.frames = [_keepalive(300, reply=False), *_txn(400)]
    stream._next_poll = 0.0
    # a standby known to be past needs no poll; a keepalive with nothing held passes as is
    polls = standby.polls
    assert _drain(stream) == [_keepalive(300, reply=False), *_txn(400)]
    assert standby.polls == polls


def test_the_stream_stops_reading_while_the_limit_is_held() -> None:
    inner = _Frames([f for end in range(100, 1100, 100) for f in _txn(end)])
    stream = GatedStream(inner, _Standby(), RelayStats(), limit=6)
    assert _drain(stream) == []
    assert len(inner.frames) == 30 - 6  # two transactions of three frames are held
    stream.start(0)  # a new stream: what was held is streamed again
    assert stream._gate.empty
