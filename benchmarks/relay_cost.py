"""Instructions per event of the relay's Python hot path, counted by callgrind.

    python -m benchmarks relay-cost [--events N] [--json PATH] [--write-results]

What the relay thread does per event, without a server: the pgoutput payloads of the relay
benchmark's rows (the outbox table of the default layout, 100-row transactions, the
workload's columns and sizes) go through :meth:`MessageRouter.handle` (decode, map,
:meth:`Delivery.submit`, ``produce``), and the delivery reports come back through
:meth:`KafkaPublisher.poll` (report, key bookkeeping, stats, published-marker ``add``, ack
tracker), every 1,000 payloads. Kafka is a stand-in client that keeps each record's callback
and calls it at ``poll`` (its cost, a list append and a call, is counted too). Each count runs
in a child ``python`` under ``valgrind --tool=callgrind`` with N and 6N events, and again
without the relay part; per event = the difference of the differences / 5N (deterministic:
the same total for the same build, inputs and environment, unlike wall time on a shared
machine). Needs valgrind (Debian's package); exit 2 without it.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, cast

from benchmarks import callgrind

_NAME = "relay-cost"
_OID = 16400
_COLUMNS = (
    ("id", 2950),
    ("aggregate_type", 25),
    ("aggregate_id", 25),
    ("event_type", 25),
    ("payload", 3802),
    ("headers", 3802),
    ("created_at", 1184),
    ("status", 25),
    ("attempts", 23),
    ("available_at", 1184),
    ("locked_at", 1184),
    ("locked_by", 25),
    ("published_at", 1184),
    ("last_error", 25),
)
_TXN = 100


def _relation() -> bytes:
    cols = b"".join(
        bytes([1 if name == "id" else 0]) + name.encode() + b"\0" + struct.pack("!Ii", oid, -1)
        for name, oid in _COLUMNS
    )
    return (
        b"R" + struct.pack("!I", _OID) + b"public\0bench_outbox\0d"
        + struct.pack("!H", len(_COLUMNS)) + cols
    )  # fmt: skip


def _insert(values: list[bytes | None]) -> bytes:
    parts = [struct.pack("!H", len(values))]
    for v in values:
        parts.append(b"n" if v is None else b"t" + struct.pack("!I", len(v)) + v)
    return b"I" + struct.pack("!IB", _OID, ord("N")) + b"".join(parts)


def payloads(events: int) -> list[bytes]:
    """The relay benchmark's stream of ``events`` events (as ``cdc_outbox_dev.workload``
    writes them and PostgreSQL 15 sends them), Relation first."""
    out = [_relation()]
    lsn = 0x1000000
    for n in range(events):
        txn = n // _TXN
        if n % _TXN == 0:
            out.append(b"B" + struct.pack("!QqI", lsn + 50_000, 0, 1000 + txn))
        agg = f"order-{n % 200}"
        seq = n // 200 + 1
        note = "x" * 120
        payload = (
            f'{{"seq": {seq}, "note": "{note}", "order": "{agg}", "amount_cents": {1000 + seq}}}'
        ).encode()
        headers = b'{"txn": "%d", "writer": "%d"}' % (txn, txn % 4)
        ts = b"2026-12-04 06:51:04.123456+00"
        values: list[bytes | None] = [
            str(uuid.UUID(int=n + 1, version=4)).encode(),
            b"order",
            agg.encode(),
            b"OrderPlaced",
            payload,
            headers,
            ts,
            b"PENDING",
            b"0",
            ts,
            None,
            None,
            None,
            None,
        ]
        out.append(_insert(values))
        if n % _TXN == _TXN - 1 or n == events - 1:
            lsn += 60_000
            out.append(b"C" + struct.pack("!BQQq", 0, lsn - 10, lsn, 0))
    return out


class _Message:
    """A delivery report's message: ``topic()`` is a builtin (no Python frame), as in
    confluent-kafka."""

    __slots__ = ("topic",)

    def __init__(self, topic: str) -> None:
        self.topic = topic.__str__


class _Client:
    """Stand-in for ``confluent_kafka.Producer``: callbacks are called at ``poll``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._pending: list[tuple[Any, _Message]] = []
        self._messages: dict[str, _Message] = {}

    def produce(self, topic: str, value: Any, key: Any, *, headers: Any, on_delivery: Any) -> None:
        message = self._messages.get(topic)
        if message is None:
            message = self._messages[topic] = _Message(topic)
        self._pending.append((on_delivery, message))

    def poll(self, timeout: float) -> int:
        pending, self._pending = self._pending, []
        for callback, message in pending:
            callback(None, message)
        return len(pending)

    def __len__(self) -> int:
        return len(self._pending)


def _child(what: str, n: int) -> None:
    """Build ``n`` events' payloads and the relay's parts; with ``relay`` route them all."""
    from cdc_outbox.cdc.ack_tracker import AckTracker
    from cdc_outbox.cdc.message_router import MessageRouter
    from cdc_outbox.cdc.published_marker import PublishedMarker
    from cdc_outbox.config.cdc import marker_section, router_section
    from cdc_outbox.config.delivery import delivery_section
    from cdc_outbox.config.settings import Settings
    from cdc_outbox.delivery.engine import Delivery
    from cdc_outbox.kafka.publisher import ProducerFactory
    from cdc_outbox.mapping.build import outbox_mapper
    from cdc_outbox.store.outbox_table import OutboxTable
    from cdc_outbox.telemetry.relay_stats import RelayStats

    stream = payloads(n)
    settings = Settings.model_validate(
        {
            "dsn": "host=none",
            "outbox_table": "bench_outbox",
            "topic_template": "bench.{aggregate_type}",
            "kafka": {"bootstrap_servers": "none:9092"},
        }
    )
    stats = RelayStats()
    # Not started: ids are only buffered.
    marker = PublishedMarker(marker_section(settings), OutboxTable.all_of(settings))
    # The stand-in has what the relay calls (produce, poll, len), not the whole client.
    delivery = Delivery(
        delivery_section(settings),
        stats,
        marker=marker,
        producer_client=cast(ProducerFactory, _Client),
    )
    router = MessageRouter(
        router_section(settings), [outbox_mapper(settings)], delivery, stats, None
    )
    tracker = AckTracker(0)

    class _Checkpoint:
        def note_written(self, lsn: int) -> None:
            pass

    router.new_session(tracker, _Checkpoint())  # type: ignore[arg-type]
    if what == "relay":
        handle = router.handle
        poll = delivery.publisher.poll
        for i, payload in enumerate(stream):
            handle(payload)
            if i % 1000 == 999:
                poll(0)
        poll(0)
        assert stats.events_published == n and tracker.in_flight == 0, stats
        assert marker.handed == n


def measure(n: int) -> dict[str, Any]:
    """Instructions per event (see the module docstring)."""
    base = callgrind.marginal(_NAME, "none", n)
    spent = callgrind.marginal(_NAME, "relay", n)
    return {"events": n, "relay_instructions_per_event": round((spent - base) / (5 * n))}


def main(argv: list[str]) -> int:
    """``python -m benchmarks relay-cost`` (see the module docstring)."""
    return callgrind.main(
        argv,
        name=_NAME,
        description=(__doc__ or "").split("\n", 1)[0],
        children=["relay"],
        child=_child,
        measure=measure,
        report=lambda result: (
            f"relay hot path {result['relay_instructions_per_event']:>8,} instructions per event"
        ),
    )
