"""docker/writer.py (Compose's sample writer) against the real PostgreSQL: the outbox rows it
commits are what the relay expects, and it stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psycopg

from cdc_outbox.config.settings import Settings
from cdc_outbox.mapping.build import outbox_mapper
from cdc_outbox.records import OutboxRecord
from tests.support.deploy import DOCKER
from tests.support.helpers import wait_until
from tests.support.relay import init_outbox

WRITER = DOCKER / "writer.py"


def writer_env(dsn: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDC_OUTBOX_", "WRITER_"))}
    return {**env, "CDC_OUTBOX_DSN": dsn, **extra}


def test_writer_commits_orders_with_their_events(pg_dsn: str) -> None:
    init_outbox(Settings.model_validate({"dsn": pg_dsn}))  # what the init service does
    result = subprocess.run(
        [sys.executable, str(WRITER)],
        env=writer_env(pg_dsn, WRITER_COUNT="6", WRITER_INTERVAL_S="0"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "6 transactions committed" in result.stderr
    with psycopg.connect(pg_dsn) as conn:
        orders = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE paid) FROM orders"
        ).fetchone()
        events = conn.execute(
            "SELECT aggregate_type, aggregate_id, event_type, payload, headers, status"
            " FROM outbox ORDER BY created_at, event_type"
        ).fetchall()
    assert orders == (6, 2)
    created = [e for e in events if e[2] == "OrderCreated"]
    paid = [e for e in events if e[2] == "OrderPaid"]
    assert len(created) == 6 and len(paid) == 2
    assert all(e[0] == "order" and e[5] == "PENDING" for e in events)
    first = created[0]
    assert first[3]["orderId"] == int(first[1]) and first[4]["source"] == "writer"
    assert {e[1] for e in paid} <= {e[1] for e in created}  # same aggregates: same key
    # every row maps to a Kafka record with the relay's own mapping (no dead letter)
    mapper = outbox_mapper(Settings.model_validate({"dsn": pg_dsn}))
    columns = ", ".join(f"{c}::text" for c in mapper.row_columns)
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT {columns} FROM outbox").fetchall()  # noqa: S608
    records = [mapper.map_row(row) for row in rows]
    assert all(isinstance(r, OutboxRecord) for r in records), records
    assert {r.topic for r in records if isinstance(r, OutboxRecord)} == {"outbox.event.order"}


def test_writer_stops_on_sigterm(pg_dsn: str) -> None:
    init_outbox(Settings.model_validate({"dsn": pg_dsn}))
    process = subprocess.Popen(
        [sys.executable, str(WRITER)],
        env=writer_env(pg_dsn, WRITER_INTERVAL_S="0.2"),
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def written() -> int:
            with psycopg.connect(pg_dsn) as conn:
                row = conn.execute("SELECT count(*) FROM outbox").fetchone()
            return int(row[0]) if row else 0

        wait_until(lambda: written() >= 3, timeout=30)
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert process.wait(timeout=10) == 0
        assert time.monotonic() - started < 5
        assert process.stderr is not None and "stopped after" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
