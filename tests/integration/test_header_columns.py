"""``columns.header_columns`` (Debezium's ``column:header:alias``) in every mode that maps rows:
a snapshot catch-up, CDC streaming and the polling relay each put the configured columns in
the named headers of the real Kafka record (a NULL column: no header)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg

from cdc_outbox.service.wiring import polling_relay
from tests.support.helpers import consume_all, wait_until
from tests.support.relay import (
    init_for_catch_up,
    outbox_statuses,
    relay_settings,
    service_thread,
    wait_streamed_past_now,
)

HEADER_COLUMNS = {"eventType": "event_type", "tenant": "tenant_id"}


def _insert(dsn: str, event_type: str, tenant: str | None) -> str:
    event_id = str(uuid.uuid4())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload,"
            " tenant_id) VALUES (%s, 'order', 'o-1', %s, '{}', %s)",
            (event_id, event_type, tenant),
        )
    return event_id


def test_header_columns_reach_kafka_in_catch_up_cdc_and_polling(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    settings = relay_settings(
        pg_dsn, bootstrap, kafka_topic_prefix, columns={"header_columns": HEADER_COLUMNS}
    )
    init_for_catch_up(settings)  # init --create-table adds tenant_id (a text column)
    ids = [_insert(pg_dsn, "CaughtUp", "t-catch-up")]
    with service_thread(settings) as service:
        wait_streamed_past_now(pg_dsn, settings.slot_name, 120, lambda: f"{service.stats}")
        assert service.stats.catch_ups == 1
        ids.append(_insert(pg_dsn, "Streamed", "t-cdc"))
        wait_streamed_past_now(pg_dsn, settings.slot_name, 120, lambda: f"{service.stats}")
        wait_until(lambda: outbox_statuses(pg_dsn) == {"PUBLISHED": 2}, timeout=60)
    ids.append(_insert(pg_dsn, "Polled", "t-polling"))
    ids.append(_insert(pg_dsn, "PolledNull", None))
    relay = polling_relay(settings.model_copy(update={"mode": "polling"}))
    worker = threading.Thread(target=relay.run, daemon=True)
    worker.start()
    try:
        wait_until(lambda: outbox_statuses(pg_dsn) == {"PUBLISHED": 4}, timeout=60)
    finally:
        relay.request_stop()
        worker.join(60)
    records = consume_all(bootstrap, [f"{kafka_topic_prefix}.event.order"], expected_count=4)
    assert [r.headers for r in records] == [
        [("id", event_id.encode()), ("event_type", et), ("aggregate_type", b"order"),
         ("eventType", et), *([("tenant", tenant)] if tenant else [])]
        for event_id, et, tenant in zip(
            ids, [b"CaughtUp", b"Streamed", b"Polled", b"PolledNull"],
            [b"t-catch-up", b"t-cdc", b"t-polling", None], strict=True,
        )
    ]  # fmt: skip
