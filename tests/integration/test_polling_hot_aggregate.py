"""Polling fairness: one aggregate stuck behind a backing-off row, with thousands of due rows
queued behind it, must not starve every other aggregate."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from cdc_outbox.service.wiring import polling_relay
from cdc_outbox.store.schema import outbox_table_ddl
from cdc_outbox_dev.readback import read_topics
from tests.support.helpers import wait_until
from tests.support.relay import relay_settings, running

HOT_QUEUE = 3_000
OTHERS, PER_OTHER = 50, 4


def _statuses(dsn: str, hot: bool) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT status, count(*) FROM outbox WHERE (aggregate_id = 'hot') = %s GROUP BY 1",
            (hot,),
        ).fetchall()
    return {status: int(n) for status, n in rows}


def test_backing_off_aggregate_with_a_long_queue_does_not_starve_the_others(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    settings = relay_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        polling={"batch_size": 100, "poll_interval_s": 0.05},
    )
    insert = (
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, available_at)"
        " SELECT 'order', %s, 'OrderPlaced', jsonb_build_object('n', g), now() + %s::interval"
        " FROM generate_series(1, %s) AS g"
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for stmt in outbox_table_ddl(settings):
            conn.execute(stmt)
        with conn.transaction():
            # The hot aggregate's first row is backing off for an hour; 3,000 due rows behind
            # it hold the oldest available_at of all.
            conn.execute(insert, ("hot", "1 hour", 1))
            conn.execute(insert, ("hot", "0 seconds", HOT_QUEUE))
        with conn.transaction():
            for a in range(OTHERS):
                conn.execute(insert, (f"other-{a}", "0 seconds", PER_OTHER))
    with running(polling_relay(settings)):
        wait_until(
            lambda: _statuses(pg_dsn, hot=False) == {"PUBLISHED": OTHERS * PER_OTHER},
            timeout=30,
            message=lambda: f"other aggregates: {_statuses(pg_dsn, hot=False)}",
        )
    assert _statuses(pg_dsn, hot=True) == {"PENDING": HOT_QUEUE + 1}
    records = read_topics(kafka_broker.bootstrap_servers, f"{kafka_topic_prefix}.event.")
    seen: dict[bytes, list[int]] = {}
    for record in records:
        assert record.key is not None and record.value is not None
        seen.setdefault(record.key, []).append(json.loads(record.value)["n"])
    assert len(seen) == OTHERS and b"hot" not in seen
    assert all(ns == list(range(1, PER_OTHER + 1)) for ns in seen.values()), seen
