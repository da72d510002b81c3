"""What a table-less event saves the database (docs/outboxes.md): WAL bytes and writer time per
event, an outbox row (``write_event``) against a logical message (``emit_event``), then the
row's later costs: the ``cdc_mark_published = "update"`` UPDATE and a VACUUM of the table.

``python -m benchmarks.table_less_cost [--events N] [--per-txn K]`` starts a local PostgreSQL
(:mod:`cdc_outbox_dev.sandbox`; no relay, no Kafka: only what the database pays), creates the
default outbox table (``sql/outbox.sql``) and writes N events, K per transaction, each way.
WAL is the ``pg_current_wal_insert_lsn()`` delta (whole server; a checkpoint inside a window adds
full-page images), time the wall clock of the writing client, both divided by N.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from cdc_outbox.outbox import write_event
from cdc_outbox.outbox_messages import emit_event
from cdc_outbox_dev.sandbox.postgres import LocalPostgres

_SQL = Path(__file__).resolve().parents[1] / "sql" / "outbox.sql"
_PAYLOAD = {"order": "o-1", "customer": "c-42", "status": "NEW", "total_cents": 1999}


def _wal(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def _measure(conn: psycopg.Connection[Any], events: int, run: Callable[[], None]) -> str:
    conn.execute("CHECKPOINT")  # full-page images of a checkpoint do not land in the window
    wal, began = _wal(conn), time.perf_counter()
    run()
    seconds = time.perf_counter() - began
    return f"{(_wal(conn) - wal) / events:8.0f} B WAL/event {seconds * 1e6 / events:8.1f} us/event"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--per-txn", type=int, default=10)
    args = parser.parse_args(argv)
    n, k = args.events, args.per_txn
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
            return lambda: conn.execute(statement) and None

        print(f"{n} events, {k} per transaction (PostgreSQL {conn.info.server_version})")
        print("row insert      ", _measure(conn, n, writing(write_event)))
        print("message emit    ", _measure(conn, n, writing(emit_event, prefix="app.outbox")))
        mark = (
            "UPDATE outbox SET status = 'PUBLISHED', published_at = now(), locked_by = NULL,"
            " locked_at = NULL WHERE status IN ('PENDING', 'PROCESSING')"  # as the marker does
        )
        print("row mark update ", _measure(conn, n, sql_step(mark)))
        conn.commit()
        conn.autocommit = True
        print("row vacuum      ", _measure(conn, n, sql_step("VACUUM outbox")))


if __name__ == "__main__":
    main()
