"""CDC housekeeping with non-uuid event ids: rows are marked PUBLISHED whatever the id type,
including text ids holding commas, quotes and array-literal syntax."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from cdc_outbox.admin import lifecycle
from cdc_outbox.store.inspection import id_column_type
from cdc_outbox_dev.readback import read_topics
from tests.support.helpers import wait_until
from tests.support.relay import outbox_statuses, relay_settings, relay_thread

TEXT_IDS = [
    "order,1",
    "order,2,with,commas",
    'a "quoted", {braced} id',
    "back\\slash,x",
    "NULL",
    "",
    " spaced ",
]
BIGINT_IDS = [str(n) for n in (1, 42, 9_007_199_254_740_993, -5)]


def _create_outbox(dsn: str, id_type: str) -> None:
    """The default preset's columns, with an id of ``id_type`` and no default."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE outbox ("
                " id {} PRIMARY KEY,"
                " aggregate_type text NOT NULL, aggregate_id text NOT NULL,"
                " event_type text NOT NULL, payload jsonb, headers jsonb NOT NULL DEFAULT '{{}}',"
                " created_at timestamptz NOT NULL DEFAULT clock_timestamp(),"
                " status text NOT NULL DEFAULT 'PENDING', attempts integer NOT NULL DEFAULT 0,"
                " available_at timestamptz NOT NULL DEFAULT now(), locked_at timestamptz,"
                " locked_by text, published_at timestamptz, last_error text)"
            ).format(sql.SQL(id_type))
        )


@pytest.mark.parametrize(
    ("id_type", "ids", "shown_as"),
    [("text", TEXT_IDS, "text"), ("bigint", BIGINT_IDS, "bigint")],
)
def test_rows_with_non_uuid_ids_are_marked_published(
    id_type: str,
    ids: list[str],
    shown_as: str,
    pg_dsn: str,
    kafka_broker: Any,
    kafka_topic_prefix: str,
) -> None:
    settings = relay_settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    _create_outbox(pg_dsn, id_type)
    lifecycle.init(settings, create_table=False)
    with lifecycle.connect(settings) as conn:
        found = id_column_type(conn, settings)
    assert (found.name, found.is_uuid) == (shown_as, False)
    with relay_thread(settings) as relay, psycopg.connect(pg_dsn) as conn:
        for n, event_id in enumerate(ids):
            conn.execute(
                sql.SQL(
                    "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
                    " VALUES (%s::{}, 'order', %s, 'OrderPlaced', %s)"
                ).format(sql.SQL(id_type)),
                (event_id, f"agg-{n % 2}", json.dumps({"n": n})),
            )
        conn.commit()
        wait_until(
            lambda: outbox_statuses(pg_dsn) == {"PUBLISHED": len(ids)},
            timeout=30,
            message=lambda: f"statuses {outbox_statuses(pg_dsn)}",
        )
        assert relay.marker is not None and relay.marker.failures == 0
    records = read_topics(kafka_broker.bootstrap_servers, f"{kafka_topic_prefix}.event.")
    assert sorted(dict(r.headers)["id"].decode() for r in records) == sorted(ids)
