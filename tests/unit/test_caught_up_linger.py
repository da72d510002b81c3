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
    """Single-row transactions arriving every ``gap`` s from ``now`` on, ``count`` of them."""

    def __init__(self, clock: _Clock, gap: float, count: int) -> None:
        self.clock, self.gap = clock, gap
        self.due = [clock.now + gap * (n + 1) for n in range(count)]  # arrival times
        self.frames: list[bytes] = [_xlog(0x100, _relation())]
        self.arrived: dict[str, float] = {}  # event id -> when it arrived
        self._lsn = 0x1000

    def _arrive(self) -> None:
        while self.due and self.due[0] <= self.clock.now + 1e-12:
            at = self.due.pop(0)
            event = str(uuid.uuid4())
            self.arrived[event] = at
            row = (event.encode(), b"order", b"agg", b"Placed", b"{}", b"{}")
            lsn, self._lsn = self._lsn, self._lsn + 0x100
            # An hour ahead: never behind (lag <= BEHIND_S), however slow this machine is.
            commit_us = pg_clock_now() + 3_600_000_000
            self.frames += [
                _xlog(lsn, b"B" + struct.pack("!QqI", lsn + 0x80, commit_us, 1)),
                _xlog(lsn + 0x10, _insert(row)),
                _xlog(
                    lsn + 0x80, b"C" + struct.pack("!BQQq", 0, lsn + 0x80, lsn + 0xC0, commit_us)
                ),
            ]

    def sleep(self, seconds: float) -> None:
        self.clock.now += seconds
        self._arrive()

    def read(self, wait: float) -> bytes | None:
        self._arrive()
        if not self.frames and wait > 0 and self.due and self.due[0] <= self.clock.now + wait:
            self.clock.now = self.due[0]  # the read waited for the next transaction
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


def _run(gap: float, count: int) -> tuple[list[float], _Stream, list[float]]:
    """Stream ``count`` transactions ``gap`` s apart through read turns; returns (flush
    times, the stream, each event's wait from its arrival to the flush that sent it)."""
    clock = _Clock()
    clients: list[_CountingClient] = []

    def client(config: dict[str, Any]) -> _CountingClient:
        clients.append(_CountingClient(FakeCluster(), config, clock))
        return clients[-1]

    stats = RelayStats()
    delivery = Delivery(delivery_section(SETTINGS), stats, producer_client=client)
    router = MessageRouter(
        router_section(SETTINGS), [outbox_mapper(SETTINGS)], delivery, stats, None
    )
    stream = _Stream(clock, gap, count)
    router._sleep = stream.sleep
    router._clock = lambda: clock.now
    checkpoint = SimpleNamespace(note_written=lambda lsn: None, send=lambda **kw: None)
    router.new_session(AckTracker(0x100), checkpoint)  # type: ignore[arg-type]
    [producer] = clients
    while len(producer.sent_at) < count:
        router.read_turn(stream.read, lambda: True, lambda: False)
        delivery.service()
        assert clock.now < 1000.0 + gap * count + 1.0, "the stream stalled"
    waits = [producer.sent_at[e] - at for e, at in stream.arrived.items()]
    return producer.flushes, stream, waits


def test_transactions_that_keep_coming_go_out_in_batches_held_at_most_the_linger() -> None:
    """2,000 single-row transactions/s: a produce request per batch, not per transaction."""
    count = 400
    flushes, _stream, waits = _run(0.0005, count)
    # Held LINGER_S (2 ms) while they keep coming: 4-5 per request. Before: one per event.
    assert len(flushes) <= count // 3, f"{len(flushes)} flushes for {count} transactions"
    assert max(waits) <= pacing.LINGER_S + 1e-9, max(waits)


def test_a_lone_transaction_goes_out_at_once() -> None:
    """20 transactions/s: each is sent the moment the relay caught up, never held."""
    flushes, _stream, waits = _run(0.05, 40)
    assert len(flushes) == 40
    assert max(waits) == 0.0
