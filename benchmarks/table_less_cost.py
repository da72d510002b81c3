"""What a table-less event saves the database (docs/outboxes.md): WAL bytes and writer time per
event, an outbox row (``write_event``) against a logical message (``write_event`` with
``message_prefix``), then the row's later costs: the ``cdc_mark_published = "update"`` UPDATE
and a VACUUM of the table.

``python -m benchmarks table-less-cost [--events N] [--per-txn K]`` starts a local PostgreSQL
(:mod:`cdc_outbox_dev.sandbox`; no relay, no Kafka: only what the database pays), creates the
default outbox table (``sql/outbox.sql``) and writes N events, K per transaction, each way.
WAL is the ``pg_current_wal_insert_lsn()`` delta (whole server; a checkpoint inside a window adds
full-page images), time the wall clock of the writing client, both divided by N.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import output
from cdc_outbox.writer import write_event
from cdc_outbox_dev.sandbox.postgres import LocalPostgres

_SQL = Path(__file__).resolve().parents[1] / "sql" / "outbox.sql"
_PAYLOAD = {"order": "o-1", "customer": "c-42", "status": "NEW", "total_cents": 1999}


def _wal(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def _measure(
    conn: psycopg.Connection[Any], events: int, run: Callable[[], None]
) -> dict[str, float]:
    conn.execute("CHECKPOINT")  # full-page images of a checkpoint do not land in the window
    wal, began = _wal(conn), time.perf_counter()
    run()
    seconds = time.perf_counter() - began
    return {
        "wal_bytes_per_event": round((_wal(conn) - wal) / events, 1),
        "us_per_event": round(seconds * 1e6 / events, 1),
    }


def _show(step: str, figures: dict[str, float]) -> None:
    wal, us = figures["wal_bytes_per_event"], figures["us_per_event"]
    print(f"{step:<16}{wal:8.0f} B WAL/event {us:8.1f} us/event")


def main(argv: list[str]) -> int:
    """``python -m benchmarks table-less-cost`` (see the module docstring)."""
    parser = output.parser("table-less-cost", (__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--per-txn", type=int, default=10)
    args = parser.parse_args(argv)
    n, k = args.events, args.per_txn
    if n < 1 or k < 1:
        print("table-less-cost: --events and --per-txn must be >= 1", file=sys.stderr)
        return 2
    steps: dict[str, dict[str, float]] = {}
    with LocalPostgres() as pg, psycopg.connect(pg.dsn) as conn:
        conn.execute(_SQL.read_text())
        conn.commit()

        def writing(write: Callable[..., Any], **kw: Any) -> Callable[[], None]:
            def run() -> None:
                for i in range(n):
                    write(conn, "order", f"o-{i % 100}", "OrderUpdated", _PAYLOAD, **kw)
                    if i % k == k - 1:
                        conn.commit()
                conn.commit()

            return run

        def sql_step(statement: str) -> Callable[[], None]:
            def run() -> None:
                conn.execute(statement)

            return run

        print(f"{n} events, {k} per transaction (PostgreSQL {conn.info.server_version})")
        steps["row insert"] = _measure(conn, n, writing(write_event))
        steps["message emit"] = _measure(conn, n, writing(write_event, message_prefix="app.outbox"))
        mark = (
            "UPDATE outbox SET status = 'PUBLISHED', published_at = now(), locked_by = NULL,"
            " locked_at = NULL WHERE status IN ('PENDING', 'PROCESSING')"  # as the marker does
        )
        steps["row mark update"] = _measure(conn, n, sql_step(mark))
        conn.commit()
        conn.autocommit = True
        steps["row vacuum"] = _measure(conn, n, sql_step("VACUUM outbox"))
        server = conn.info.server_version
    for step, figures in steps.items():
        _show(step, figures)
    result = {"events": n, "per_txn": k, "server_version": server, "steps": steps}
    output.save("table-less-cost", result, args)
    return 0
