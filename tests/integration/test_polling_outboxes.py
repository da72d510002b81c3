"""Polling over several outbox tables ([[outboxes]]) against real PostgreSQL and Kafka: a busy
table never starves a small one, and each table keeps its own per-aggregate order."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg import sql

from cdc_outbox.config.settings import Settings
from cdc_outbox.service.wiring import polling_relay
from cdc_outbox.store import schema
from tests.support.helpers import consume_all, wait_until
from tests.support.relay import running

BATCH = 40
BACKLOG = 800  # table A: 80 aggregates x 10 events


def _settings(dsn: str, bootstrap: str, prefix: str) -> Settings:
    return Settings.model_validate(
        {
            "mode": "polling",
            "dsn": dsn,
            "dead_letter_topic": prefix + ".dlq",
            "kafka": {"bootstrap_servers": bootstrap},
            "metrics_port": 0,
            "shutdown_grace_s": 15.0,
            "polling": {"poll_interval_s": 0.05, "batch_size": BATCH},
            "outboxes": [
                {"schema": "public", "table": "outbox",
                 "topic_template": prefix + ".a.{aggregate_type}"},
                {"schema": "billing", "table": "events",
                 "topic_template": prefix + ".b.{aggregate_type}"},
            ],
        }
    )  # fmt: skip


def _create(settings: Settings) -> None:
    """Table A as ``init --create-table`` makes it; table B the same shape in its schema."""
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        for stmt in schema.outbox_table_ddl(settings):
            conn.execute(stmt)
        conn.execute("CREATE SCHEMA billing")
        conn.execute("CREATE TABLE billing.events (LIKE public.outbox INCLUDING ALL)")


def _insert(conn: psycopg.Connection[Any], table: str, rows: list[tuple[str, int]]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL(
                "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload)"
                " VALUES ('order', %s, 'Placed', %s)"
            ).format(sql.Identifier(*table.split("."))),
            [(agg, json.dumps({"n": n})) for agg, n in rows],
        )


def _published(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE status = 'PUBLISHED'").format(
                sql.Identifier(*table.split("."))
            )
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_small_table_is_not_starved_by_a_big_backlog_and_each_keeps_its_order(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    settings = _settings(pg_dsn, bootstrap, kafka_topic_prefix)
    _create(settings)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # "shared" is an aggregate of both tables: two independent sequences.
        _insert(conn, "public.outbox", [(f"a-{i % 80}", i // 80) for i in range(BACKLOG - 5)])
        _insert(conn, "public.outbox", [("shared", n) for n in range(5)])
        _insert(conn, "billing.events", [("shared", n) for n in range(3)])

    with running(polling_relay(settings)):
        wait_until(
            lambda: (
                _published(pg_dsn, "billing.events") == 3
                and _published(pg_dsn, "public.outbox") == BACKLOG
            ),
            timeout=120,
            message=lambda: (
                f"A {_published(pg_dsn, 'public.outbox')}/{BACKLOG},"
                f" B {_published(pg_dsn, 'billing.events')}/3"
            ),
        )
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM public.outbox"
            " WHERE published_at <= (SELECT max(published_at) FROM billing.events)"
        ).fetchone()
    # B was published in the first pass: at most one batch of A went before it (a relay that
    # drains A first would publish all of A's backlog before B's rows).
    assert row is not None and row[0] <= BATCH, row

    b = consume_all(bootstrap, [kafka_topic_prefix + ".b.order"], expected_count=3)
    assert [json.loads(m.value or b"")["n"] for m in b] == [0, 1, 2]
    a = consume_all(bootstrap, [kafka_topic_prefix + ".a.order"], expected_count=BACKLOG)
    order: dict[bytes | None, list[int]] = {}
    for m in a:
        order.setdefault(m.key, []).append(json.loads(m.value or b"")["n"])
    assert len(a) == BACKLOG
    assert order[b"shared"] == [0, 1, 2, 3, 4]
    assert all(ns == sorted(ns) for ns in order.values())
