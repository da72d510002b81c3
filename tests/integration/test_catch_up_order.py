"""Catch-up only when needed, and in commit order per aggregate (issue 23, point 3).

- A slot made by ``init`` over an empty table is streamed as it is, not dropped for a catch-up
  (no catch-up counted, the relay state keeps the consistent point ``init`` recorded).
- A slot recreated by someone else while the relay was down is not streamed (rows committed
  in between would be lost): the relay catches up.
- A catch-up over rows written by several connections at once, while other rows are deleted
  and vacuumed away (free space reused: ``ctid`` order is not insertion order, checked),
  publishes each aggregate's rows in commit order, in both layouts.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import PreflightError
from cdc_outbox.lsn import Lsn
from cdc_outbox.service.wiring import build_service
from cdc_outbox.store import relay_state
from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import read_topics
from tests.support.relay import (
    init_for_catch_up,
    init_outbox,
    relay_settings,
    service_thread,
    slot_position,
    wait_streamed_past_now,
)

WRITERS = 4
AGGREGATES_PER_WRITER = 10
#: Per writer; CDC_OUTBOX_CATCH_UP_ORDER_TRANSACTIONS=1250 makes the one-off 100,000-event run.
TRANSACTIONS = int(os.environ.get("CDC_OUTBOX_CATCH_UP_ORDER_TRANSACTIONS", "250"))
ROWS_PER_TRANSACTION = 20  # two per aggregate of the writer: 4 * 250 * 20 = 20,000 events
FILLERS_PER_TRANSACTION = 10  # deleted again: the free space later rows reuse

LAYOUTS = {
    "default": {},
    # created_at set by now() (transaction start) rather than clock_timestamp(): equal within a
    # transaction, so the statement order (cmin) must break the tie, not ctid.
    "default-now": {},
    # Published rows are deleted: the table holds the unpublished ones (a catch-up with
    # cdc_mark_published = "off" over a non-empty table is refused, see the last test).
    "debezium": {"columns": {"preset": "debezium"}, "cdc_mark_published": "delete"},
}


def _settings(dsn: str, kafka: Any, prefix: str, layout: str) -> Settings:
    return relay_settings(dsn, kafka.bootstrap_servers, prefix, **LAYOUTS[layout])


def _insert(settings: Settings) -> sql.Composed:
    cols = settings.column_names()
    names = [cols.id, cols.aggregate_type, cols.aggregate_id, cols.event_type, cols.payload]
    return sql.SQL("INSERT INTO outbox ({}) VALUES (%s, %s, %s, %s, %s)").format(
        sql.SQL(", ").join(map(sql.Identifier, names))
    )


def _writer(settings: Settings, w: int, errors: list[BaseException]) -> None:
    """One connection, its own aggregates, many transactions; each also writes filler rows
    and, every fourth, deletes its fillers."""
    cols = settings.column_names()
    insert = _insert(settings)
    delete = sql.SQL("DELETE FROM outbox WHERE {} = %s").format(sql.Identifier(cols.aggregate_id))
    aggregates = [f"agg-{w}-{a}" for a in range(AGGREGATES_PER_WRITER)]
    seq = dict.fromkeys(aggregates, 0)
    pad = "x" * 200
    try:
        with psycopg.connect(settings.postgres_dsn()) as conn:
            for t in range(TRANSACTIONS):
                rows = []
                for i in range(ROWS_PER_TRANSACTION):
                    agg = aggregates[i % len(aggregates)]
                    seq[agg] += 1
                    payload = json.dumps({"seq": seq[agg], "pad": pad})
                    rows.append((str(uuid.uuid4()), "order", agg, "E", payload))
                    if i % 2 == 0 and i // 2 < FILLERS_PER_TRANSACTION:
                        rows.append((str(uuid.uuid4()), "filler", f"filler-{w}", "F", "{}"))
                with conn.cursor() as cur:
                    cur.executemany(insert, rows)
                conn.commit()
                if t % 4 == 3:
                    conn.execute(delete, (f"filler-{w}",))
                    conn.commit()
    except BaseException as exc:
        errors.append(exc)


def _write_concurrently(settings: Settings) -> None:
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_writer, args=(settings, w, errors)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        while any(t.is_alive() for t in threads):
            conn.execute("VACUUM outbox")  # records the freed space for reuse
    for t in threads:
        t.join()
    assert not errors, errors
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DELETE FROM outbox WHERE {} = 'filler'").format(
                sql.Identifier(settings.column_names().aggregate_type)
            )
        )


def _inversions(settings: Settings, order: str) -> int:
    """Rows that come after a later row of their aggregate when read ``ORDER BY order``."""
    cols = settings.column_names()
    query = sql.SQL("SELECT {}, ({}->>'seq')::int FROM outbox ORDER BY {}").format(
        sql.Identifier(cols.aggregate_id), sql.Identifier(cols.payload), sql.SQL(order)
    )
    last: dict[str, int] = {}
    inversions = 0
    with psycopg.connect(settings.postgres_dsn()) as conn:
        for agg, seq in conn.execute(query):
            if seq < last.get(agg, 0):
                inversions += 1
            last[agg] = max(seq, last.get(agg, 0))
    return inversions


def _relay_state(settings: Settings) -> tuple[str, Lsn | None]:
    with psycopg.connect(settings.postgres_dsn()) as conn:
        state = relay_state.read_state(conn, settings)
    return str(state.phase), state.consistent_point


def _relay_all(settings: Settings) -> Any:
    """Run the service until everything committed so far is relayed; returns its stats."""
    with service_thread(settings) as service:
        wait_streamed_past_now(
            settings.postgres_dsn(), settings.slot_name, 300, lambda: f"{service.stats}"
        )
        return service.stats


def _tally(settings: Settings, kafka: Any, prefix: str, expected: list[Any]) -> Any:
    records = read_topics(kafka.bootstrap_servers, f"{prefix}.event.", timeout=120)
    verdict = workload.tally(expected, records)
    print(verdict.summary())
    return verdict


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_catch_up_of_concurrent_writers_keeps_each_aggregates_commit_order(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str, layout: str
) -> None:
    settings = _settings(pg_dsn, kafka_broker, kafka_topic_prefix, layout)
    init_for_catch_up(settings)  # the rows below are published by a catch-up
    if layout == "default-now":
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE outbox ALTER COLUMN created_at SET DEFAULT now()")
    _write_concurrently(settings)
    # The order the catch-up used before (debezium: ctid; default: created_at, ctid).
    before = "ctid" if layout == "debezium" else "created_at, ctid"
    by_ctid = _inversions(settings, "ctid")
    by_before = _inversions(settings, before)
    print(
        f"{layout}: rows out of their aggregate's order: {by_ctid} by ctid, {by_before} by {before}"
    )
    assert by_ctid > 0  # free space was reused
    if layout != "default":  # clock_timestamp() created_at orders them (and did before)
        assert by_before > 0  # else the old order would pass too
    expected = workload.stored_events(pg_dsn, columns=settings.column_names())
    assert len(expected) == WRITERS * TRANSACTIONS * ROWS_PER_TRANSACTION
    stats = _relay_all(settings)
    assert stats.catch_ups == 1
    verdict = _tally(settings, kafka_broker, kafka_topic_prefix, expected)
    assert verdict.ok, verdict.summary()
    assert verdict.duplicates == 0 and verdict.received == len(expected)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_slot_init_made_over_an_empty_table_is_streamed_without_a_catch_up(
    pg_dsn: str,
    kafka_broker: Any,
    kafka_topic_prefix: str,
    layout: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    overrides = {"columns": {"preset": "debezium"}} if layout == "debezium" else {}
    settings = relay_settings(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, **overrides
    )
    init_outbox(settings)  # an empty table
    phase, point = _relay_state(settings)
    assert phase == "STREAMING" and point == slot_position(pg_dsn, settings.slot_name)[0]
    spec = workload.WorkloadSpec(events=2_000, writers=2, aggregates=20, txn_sizes=(1, 10))
    workload.write_orders(pg_dsn, spec, columns=settings.column_names())  # relay not running
    caplog.set_level(logging.INFO, logger="cdc_outbox.service.relay_service")
    stats = _relay_all(settings)
    assert stats.catch_ups == 0
    assert f"streaming slot {settings.slot_name} as it is" in caplog.text
    # A catch-up would have written its own new slot's consistent point.
    assert _relay_state(settings) == ("STREAMING", point)
    expected = workload.stored_events(pg_dsn, columns=settings.column_names())
    verdict = _tally(settings, kafka_broker, kafka_topic_prefix, expected)
    assert verdict.ok, verdict.summary()
    assert verdict.duplicates == 0 and verdict.received == 2_000


def test_a_slot_recreated_by_someone_else_is_not_streamed_over_the_rows_in_between(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    settings = _settings(pg_dsn, kafka_broker, kafka_topic_prefix, "default")
    init_outbox(settings)
    first = workload.WorkloadSpec(events=200, writers=1, aggregates=10, txn_sizes=(1, 10))
    workload.write_orders(pg_dsn, first, columns=settings.column_names())
    assert _relay_all(settings).catch_ups == 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (settings.slot_name,))
        between = workload.WorkloadSpec(
            events=300, writers=1, aggregates=10, txn_sizes=(1, 10), aggregate_type="invoice"
        )
        workload.write_orders(pg_dsn, between, columns=settings.column_names())  # no slot
        conn.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (settings.slot_name,)
        )
    later = workload.WorkloadSpec(
        events=300, writers=1, aggregates=10, txn_sizes=(1, 10), aggregate_type="refund"
    )
    workload.write_orders(pg_dsn, later, columns=settings.column_names())
    assert _relay_all(settings).catch_ups == 1
    expected = workload.stored_events(pg_dsn, columns=settings.column_names())
    verdict = _tally(settings, kafka_broker, kafka_topic_prefix, expected)
    assert verdict.ok, verdict.summary()
    assert verdict.expected == 800


def test_a_catch_up_that_would_republish_a_statusless_table_is_refused(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    settings = relay_settings(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, columns={"preset": "debezium"}
    )
    assert settings.cdc_mark_published == "off"
    init_for_catch_up(settings)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(_insert(settings), (str(uuid.uuid4()), "order", "a-1", "E", "{}"))
        conn.commit()
    with pytest.raises(PreflightError, match='cdc_mark_published = "off"'):
        build_service(settings).run()
