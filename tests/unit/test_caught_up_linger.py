"""MessageRouter.read_turn while caught up (issue 38): transactions that keep coming are sent
in batches held at most ``pacing.LINGER_S``, a lone transaction at once.

The router runs on a fake clock: the stream (a script of arrivals) delivers a single-row
transaction every ``gap`` seconds, ``read(wait)`` and the router's sleep move the clock on,
and the fake producer counts flushes (``publisher.send_now``: one produce request of what
librdkafka holds). Before issue 38 every caught-up transaction was flushed on its own: at
2,000 transactions/s one produce request per event, the relay's CPU per event 10x that at
100-row transactions.
"""

from __future__ import annotations

import struct
import uuid
from types import SimpleNamespace
from typing import Any

from cdc_outbox.cdc import pacing
from cdc_outbox.cdc.ack_tracker import AckTracker
from cdc_outbox.cdc.message_router import MessageRouter
from cdc_outbox.config.cdc import router_section
from cdc_outbox.config.delivery import delivery_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.mapping.build import outbox_mapper
from cdc_outbox.pgwire.walproto import pg_clock_now
from cdc_outbox.telemetry.relay_stats import RelayStats
from tests.support.fakes.kafka import FakeCluster, FakeProducerClient
from tests.support.fakes.replication import _insert, _relation, _xlog

SETTINGS = Settings.model_validate(
    {"dsn": "postgresql://u@h/db", "kafka": {"bootstrap_servers": "fake:9092"}}
)


class _Clock:
    """Fake monotonic time."""

    def __init__(self) -> None:
        self.now = 1000.0


class _Stream:
    """``count`` transactions of ``rows`` rows arriving every ``gap`` s from ``now`` on; a
    transaction's frames arrive in ``parts`` parts ``part_gap`` s apart (the Commit with the
    last), as a large transaction's do."""

    def __init__(
        self,
        clock: _Clock,
        gap: float,
        count: int,
        rows: int = 1,
        parts: int = 1,
        part_gap: float = 0.0,
    ) -> None:
        self.clock = clock
        self.frames: list[bytes] = [_xlog(0x100, _relation())]
        self.arrived: dict[str, float] = {}  # event id -> when it arrived
        #: (arrival time, frames, their event ids), in arrival order
        self.due: list[tuple[float, list[bytes], list[str]]] = []
        lsn = 0x1000
        for n in range(count):
            # An hour ahead: never behind (lag <= BEHIND_S), however slow this machine is.
            commit_us = pg_clock_now() + 3_600_000_000
            end = lsn + 0x10 * (rows + 1)
            frames = [_xlog(lsn, b"B" + struct.pack("!QqI", end, commit_us, 1))]
            events = [str(uuid.uuid4()) for _ in range(rows)]
            for k, event in enumerate(events, 1):
                row = (event.encode(), b"order", b"agg", b"Placed", b"{}", b"{}")
                frames.append(_xlog(lsn + 0x10 * k, _insert(row)))
            frames.append(_xlog(end, b"C" + struct.pack("!BQQq", 0, end, end + 0x10, commit_us)))
            size = -(-len(frames) // parts)
            for part in range(parts):
                chunk = frames[part * size : (part + 1) * size]
                ids = events[max(part * size - 1, 0) : max((part + 1) * size - 1, 0)]
                self.due.append((clock.now + gap * (n + 1) + part_gap * part, chunk, ids))
            lsn = end + 0x100

    def _arrive(self) -> None:
        while self.due and self.due[0][0] <= self.clock.now + 1e-12:
            at, frames, events = self.due.pop(0)
            self.frames += frames
            self.arrived.update(dict.fromkeys(events, at))

    def sleep(self, seconds: float) -> None:
        self.clock.now += seconds
        self._arrive()

    def read(self, wait: float) -> bytes | None:
        self._arrive()
        if not self.frames and wait > 0 and self.due and self.due[0][0] <= self.clock.now + wait:
            self.clock.now = self.due[0][0]  # the read waited for what arrives next
            self._arrive()
        if not self.frames:
            self.clock.now += wait
            return None
        return self.frames.pop(0)


class _CountingClient(FakeProducerClient):
    """Notes the time of every flush and, per event id, the flush that sent it."""

    def __init__(self, cluster: FakeCluster, config: dict[str, Any], clock: _Clock) -> None:
        super().__init__(cluster, config)
        self.clock = clock
        self.flushes: list[float] = []
        self.sent_at: dict[str, float] = {}

    def flush(self, timeout: float = 0.0) -> int:
        self.flushes.append(self.clock.now)
        for item in self.pending:
            self.sent_at[dict(item.record.headers)["id"].decode()] = self.clock.now
        return super().flush(timeout)


def _run(
    gap: float, count: int, settings: Settings = SETTINGS, **shape: Any
) -> tuple[list[float], _Stream, list[float]]:
    """Stream ``count`` transactions ``gap`` s apart (``shape``: :class:`_Stream`'s rows and
    parts) through read turns; returns (flush times, the stream, each event's wait from its
    arrival to the flush that sent it)."""
    clock = _Clock()
    clients: list[_CountingClient] = []

    def client(config: dict[str, Any]) -> _CountingClient:
        clients.append(_CountingClient(FakeCluster(), config, clock))
        return clients[-1]

    stats = RelayStats()
    delivery = Delivery(delivery_section(settings), stats, producer_client=client)
    router = MessageRouter(
        router_section(settings), [outbox_mapper(settings)], delivery, stats, None
    )
    stream = _Stream(clock, gap, count, **shape)
    router._sleep = stream.sleep
    router._clock = lambda: clock.now
    checkpoint = SimpleNamespace(note_written=lambda lsn: None, send=lambda **kw: None)
    router.new_session(AckTracker(0x100), checkpoint)  # type: ignore[arg-type]
    [producer] = clients
    while len(producer.sent_at) < count * shape.get("rows", 1):
        router.read_turn(stream.read, lambda: True, lambda: False)
        delivery.service()
        assert clock.now < 1000.0 + gap * count + 1.0, "the stream stalled"
    waits = [producer.sent_at[e] - at for e, at in stream.arrived.items()]
    return producer.flushes, stream, waits


def test_transactions_that_keep_coming_go_out_in_batches_held_at_most_the_linger() -> None:
    """2,000 single-row transactions/s: a produce request per batch, not per transaction."""
    count = 400
    flushes, _stream, waits = _run(0.0005, count)
    # Held LINGER_S (10 ms) while they keep coming: ~20 per request. Before: one per event.
    assert len(flushes) <= count // 3, f"{len(flushes)} flushes for {count} transactions"
    assert max(waits) <= pacing.LINGER_S + 1e-9, max(waits)


def test_a_lone_transaction_goes_out_at_once() -> None:
    """20 transactions/s: each is sent the moment the relay caught up, never held."""
    flushes, _stream, waits = _run(0.05, 40)
    assert len(flushes) == 40
    assert max(waits) == 0.0


def test_a_large_transaction_arriving_in_parts_is_never_held() -> None:
    """20 transactions/s of 100 rows, each arriving in 5 parts 1 ms apart: the pauses inside a
    transaction are no load; every part goes out as it is read. Before, the third part of
    each was held ``LINGER_S`` (the two sends before it less than ``BUSY_S`` apart)."""
    flushes, stream, waits = _run(0.05, 20, rows=100, parts=5, part_gap=0.001)
    assert len(stream.arrived) == 2000
    assert max(waits) == 0.0, max(waits)
    assert len(flushes) >= 20 * 4


def test_the_hold_never_exceeds_the_producers_linger_ms() -> None:
    """``linger.ms=1``: held 1 ms at most; ``linger.ms=0``: the user wants no batching wait,
    every transaction is sent as soon as it is read."""
    for linger_ms, bound in (("1", 0.001), ("0", 0.0)):
        settings = Settings.model_validate(
            {
                "dsn": "postgresql://u@h/db",
                "kafka": {"bootstrap_servers": "fake:9092", "config": {"linger.ms": linger_ms}},
            }
        )
        _flushes, _stream, waits = _run(0.0005, 200, settings)
        assert max(waits) <= bound + 1e-9, (linger_ms, max(waits))
    _flushes, _stream, waits = _run(0.0005, 200)
    assert max(waits) > 0.001  # the default linger.ms (20) leaves the hold at LINGER_S
