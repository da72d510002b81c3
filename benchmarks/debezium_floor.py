"""The floor under ``python -m benchmarks debezium``'s 20 x 100 latency: PostgreSQL alone.

The same table, writers and pace as the systems' ``latency_20x100`` phase (warm-up, then
measured), the slot read by a raw drain that does nothing with what it receives
(:class:`benchmarks.latency_floor.CommitDrain`). A transaction's latency runs from its commit
timestamp to the drain's receipt of its Commit: no system reading the slot can publish a
transaction before that, so a system's p99 minus this one is what the system adds. It runs once
per round, after the systems, so that the same run shows it beside them.
"""

from __future__ import annotations

from typing import Any

from benchmarks.debezium_report import latency_ms
from benchmarks.latency_floor import drain_while
from cdc_outbox.mapping.rows import ColumnNames
from cdc_outbox_dev import workload


def measure(
    dsn: str,
    slot: str,
    publication: str,
    *,
    table: str,
    columns: ColumnNames,
    spec: workload.WorkloadSpec,
    warmup: workload.WorkloadSpec | None,
    txn_size: int,
    timeout: float,
) -> dict[str, Any]:
    """Write ``warmup`` then ``spec`` (transactions of ``txn_size`` rows) into ``table`` while a
    raw drain reads ``slot`` (made by the caller, before the writes); the measured
    transactions' commit -> Commit received, ms: p50, p99, max and how many."""

    def write() -> int:
        written = 0
        for part in (warmup, spec):
            if part is not None:
                workload.write_orders(dsn, part, table=table, columns=columns)
                written += part.events
        return written

    times = drain_while(dsn, slot, publication, write, txn_size, timeout)
    return latencies(times[-(spec.events // txn_size) :])


def latencies(times: list[tuple[float, float, float, float]]) -> dict[str, Any]:
    """From :attr:`CommitDrain.times` rows: Commit received minus commit, ms (pure)."""
    if not times:
        raise ValueError("no transaction was received")
    samples = [((t[3] - t[0]) * 1000, 1) for t in times]
    return {"transactions": len(times), "latency_ms": latency_ms(samples)}
