"""CloudEvents Kafka binding end to end (real PostgreSQL and Kafka): outbox rows relayed with
``cloudevents = "binary"`` (CDC streaming) and ``"structured"`` (polling: the row-text path)
are read raw from Kafka (the ``ce_*`` headers, or the JSON envelope with its content type) and
then applied by the consumer helper, whose handler gets the rows' id, type, aggregate and
payload."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from cdc_outbox.consumer import ConsumerSettings, Event, IdempotentConsumer
from cdc_outbox_dev.readback import read_topics
from tests.support.helpers import create_topic, wait_until
from tests.support.relay import init_outbox, relay_settings, running, service_thread

EVENTS = 12


class _Collect:
    """A handler that records each event's fields (thread-safe)."""

    def __init__(self) -> None:
        self.events: dict[str, tuple[str | None, str | None, str | None, Any]] = {}
        self._lock = threading.Lock()

    def __call__(self, conn: psycopg.Connection[Any], event: Event) -> None:
        with self._lock:
            self.events[str(event.event_id)] = (
                event.event_type,
                event.aggregate_type,
                event.aggregate_id,
                event.payload,
            )


def _insert(dsn: str) -> dict[str, tuple[str, str, Any, datetime]]:
    """EVENTS rows over 3 aggregates; id -> (event type, aggregate id, payload, created_at)."""
    with psycopg.connect(dsn) as conn:
        for i in range(EVENTS):
            conn.execute(
                "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
                " VALUES (gen_random_uuid(), 'order', %s, %s, %s::jsonb)",
                (f"o-{i % 3}", f"Order{'Paid' if i % 2 else 'Placed'}", json.dumps({"n": i})),
            )
        rows = conn.execute(
            "SELECT id::text, event_type, aggregate_id, payload, created_at FROM outbox"
        ).fetchall()
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}


@pytest.mark.parametrize(("ce_mode", "relay_mode"), [("binary", "cdc"), ("structured", "polling")])
def test_cloudevents_records_round_trip_through_kafka_and_the_consumer(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str, ce_mode: str, relay_mode: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    settings = relay_settings(
        pg_dsn,
        bootstrap,
        kafka_topic_prefix,
        mode=relay_mode,
        cloudevents=ce_mode,
        cloudevents_source="/shop/outbox",
    )
    init_outbox(settings)
    rows = _insert(pg_dsn)
    with service_thread(settings) as service:
        wait_until(
            lambda: service.stats.events_published >= EVENTS,
            timeout=90,
            message=lambda: f"{service.stats}",
        )
    records = read_topics(bootstrap, f"{kafka_topic_prefix}.event.")
    assert len(records) == EVENTS
    for rec in records:
        headers = {k: v for k, v in rec.headers}
        if ce_mode == "binary":
            attrs = {k[3:]: (v or b"").decode() for k, v in headers.items() if k.startswith("ce_")}
            assert headers["content-type"] == b"application/json"
            data = json.loads(rec.value or b"")
        else:
            assert not any(k.startswith("ce_") for k in headers)
            assert headers["content-type"] == b"application/cloudevents+json"
            attrs = json.loads(rec.value or b"")
            assert attrs.pop("datacontenttype") == "application/json"
            data = attrs.pop("data")
        event_type, aggregate, payload, created_at = rows[attrs["id"]]
        time = datetime.fromisoformat(attrs.pop("time"))
        assert attrs == {
            "specversion": "1.0",
            "id": attrs["id"],
            "source": "/shop/outbox",
            "type": event_type,
            "subject": aggregate,
        }
        assert rec.key == aggregate.encode() and data == payload
        if relay_mode == "cdc":
            assert time == created_at  # CDC streaming: the row's created_at
        else:
            assert time >= created_at  # polling: the moment the relay mapped the row

    dlq = f"{kafka_topic_prefix}.consumer-dlq"
    create_topic(bootstrap, dlq, partitions=1)
    consumer_settings = ConsumerSettings.from_relay(
        settings, group_id=f"{kafka_topic_prefix}-ce", dead_letter_topic=dlq
    )
    handler = _Collect()
    with ConnectionPool(pg_dsn, min_size=1, max_size=2) as pool:
        consumer = IdempotentConsumer(consumer_settings, pool, handler)
        with running(consumer):
            wait_until(
                lambda: consumer.metrics.counts["processed"] >= EVENTS,
                timeout=90,
                message=lambda: f"{consumer.metrics.counts}",
            )
        assert consumer.metrics.counts["dead_lettered"] == 0
    assert handler.events == {
        str(uuid.UUID(i)): (et, "order", agg, payload) for i, (et, agg, payload, _) in rows.items()
    }
