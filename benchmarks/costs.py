"""What a benchmark run cost: outbox row writes, WAL bytes per event, latency percentiles."""

from __future__ import annotations

import time

import psycopg


def outbox_writes(dsn: str, table: str, settle_s: float = 1.5, timeout: float = 15.0) -> int:
    """``n_tup_ins + n_tup_upd + n_tup_del`` of ``table`` once it stops changing (backends
    report their counters when idle for a second or when they exit)."""
    query = (
        "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
        " WHERE relname = %s"
    )
    deadline = time.monotonic() + timeout
    last: int | None = None
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(query, (table,)).fetchone()
            value = int(row[0]) if row else 0
            if value == last or time.monotonic() > deadline:
                return value
            last = value
            time.sleep(settle_s)


def costs_per_event(events: int, writes: int, wal: int) -> dict[str, float]:
    """Row writes and WAL bytes per event, rounded for the report."""
    return {
        "row_writes_per_event": round(writes / events, 3),
        "wal_bytes_per_event": round(wal / events, 1),
    }


def percentile(samples: list[tuple[float, int]], q: float) -> float:
    """The ``q`` quantile (0..1) of (value, weight) samples: weighted nearest rank."""
    ordered = sorted(samples)
    total = sum(w for _, w in ordered)
    if not total:
        return float("nan")
    need, seen = q * total, 0
    for value, weight in ordered:
        seen += weight
        if seen >= need:
            return value
    return ordered[-1][0]
