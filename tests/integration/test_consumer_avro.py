"""The idempotent consumer reading Avro values (``value_format = "avro"``) on a real Apicurio
registry, PostgreSQL and Kafka.

The relay publishes the workload in Avro; the consumer (in-process, a fresh decoder with no
schema cached) starts while the registry is down: it redoes its batch and dead-letters
nothing, then, with the registry back, hands the handler payload dicts equal to the rows'
JSON payloads. Undecodable records (not the wire format; a schema id the registry does not
know) are dead-lettered with the reason and do not stop the others.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from psycopg_pool import ConnectionPool

from cdc_outbox.consumer import ConsumerSettings, Event, IdempotentConsumer
from cdc_outbox.consumer.settings import topics_from_template
from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import read_topics
from cdc_outbox_dev.sandbox.registry import LocalRegistry, registry_client
from tests.support.helpers import create_topic, wait_until
from tests.support.relay import init_outbox, relay_settings, running, service_thread

DEMO_SCHEMA = (
    Path(__file__).resolve().parents[2] / "cdc_outbox_dev" / "schemas" / "OrderPlaced.avsc"
)
EVENTS = 300


class _Collect:
    """A handler that records each event's payload (thread-safe)."""

    def __init__(self) -> None:
        self.payloads: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, conn: psycopg.Connection[Any], event: Event) -> None:
        with self._lock:
            self.payloads[str(event.event_id)] = event.payload


def test_consumer_applies_avro_events_and_waits_out_a_registry_outage(
    pg_dsn: str,
    kafka_broker: Any,
    kafka_topic_prefix: str,
    schema_registry: LocalRegistry,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An in-memory registry forgets the ids when it restarts: this test needs the harness's
    # durable Apicurio 3.x (Java >= 21, present on the CI machine kind); never skipped.
    assert schema_registry.durable, "needs Apicurio 3.x (a JDK >= 21) for a durable registry"
    caplog.set_level(logging.WARNING)
    shutil.copy(DEMO_SCHEMA, tmp_path)
    settings = relay_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        value_format="avro",
        schema_registry={
            "url": schema_registry.url,
            "schemas_dir": str(tmp_path),
            "auto_register": True,
            "timeout_s": 2.0,
        },
    )
    init_outbox(settings)
    spec = workload.WorkloadSpec(events=EVENTS, writers=2, aggregates=20, txn_sizes=(1, 5, 20))
    workload.write_orders(pg_dsn, spec, columns=settings.column_names())
    with service_thread(settings) as service:
        wait_until(
            lambda: service.stats.events_published >= EVENTS,
            timeout=90,
            message=lambda: f"{service.stats}",
        )
    rows = workload.stored_events(pg_dsn, columns=settings.column_names())
    assert len(rows) == EVENTS

    dlq = f"{kafka_topic_prefix}.consumer-dlq"
    create_topic(kafka_broker.bootstrap_servers, dlq, partitions=1)
    consumer_settings = ConsumerSettings.from_relay(
        settings,
        group_id=f"{kafka_topic_prefix}-avro",
        dead_letter_topic=dlq,
        retry_backoff_s=0.2,
    )
    assert consumer_settings.value_format == "avro"
    assert consumer_settings.topics == topics_from_template(settings.topic_template)
    handler = _Collect()
    schema_registry.stop()
    try:
        with ConnectionPool(pg_dsn, min_size=1, max_size=2) as pool:
            consumer = IdempotentConsumer(consumer_settings, pool, handler)
            with running(consumer):
                wait_until(
                    lambda: caplog.text.count("redoing the batch") >= 2,
                    timeout=60,
                    message=lambda: f"{consumer.metrics.counts}",
                )
                assert "schema registry unreachable" in caplog.text
                assert consumer.metrics.counts["dead_lettered"] == 0
                assert consumer.metrics.counts["processed"] == 0 and not handler.payloads
                schema_registry.start()
                wait_until(
                    lambda: consumer.metrics.counts["processed"] >= EVENTS,
                    timeout=90,
                    message=lambda: f"{consumer.metrics.counts}",
                )
            assert consumer.metrics.counts["dead_lettered"] == 0
    finally:
        if not schema_registry.running:
            schema_registry.start()
    assert read_topics(kafka_broker.bootstrap_servers, dlq, timeout=10) == []
    assert handler.payloads == {r.id: json.loads(r.payload) for r in rows}


def test_undecodable_avro_records_are_dead_lettered(
    pg_dsn: str,
    kafka_broker: Any,
    kafka_topic_prefix: str,
    schema_registry: LocalRegistry,
) -> None:
    """Not the wire format, and a schema id the registry does not know: dead-lettered with
    the reason; a record of another key after them is applied."""
    bootstrap = kafka_broker.bootstrap_servers
    topic, dlq = f"{kafka_topic_prefix}.event.order", f"{kafka_topic_prefix}.consumer-dlq"
    create_topic(bootstrap, topic, partitions=1)
    create_topic(bootstrap, dlq, partitions=1)
    from confluent_kafka.schema_registry import Schema

    subject = f"{topic}-value"
    schema = json.dumps(
        {"type": "record", "name": "Paid", "fields": [{"name": "amount", "type": "long"}]}
    )
    schema_id = registry_client(schema_registry.url).register_schema(
        subject, Schema(schema, "AVRO")
    )
    ids = [str(uuid.uuid4()) for _ in range(3)]
    values = [
        b'{"amount": 1}',  # JSON, not Avro
        b"\x00\x7f\xff\xff\xf0\x02",  # an id nobody registered
        b"\x00" + schema_id.to_bytes(4, "big") + b"\x06",  # amount 3
    ]
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, event_id, value in zip((b"a", b"b", b"c"), ids, values, strict=True):
        producer.produce(topic, value, key, headers=[("id", event_id.encode())])
    assert producer.flush(30) == 0

    settings = ConsumerSettings(
        consumer_name="avro-dlq", group_id=f"{kafka_topic_prefix}-g", topics=(topic,),
        bootstrap_servers=bootstrap, dead_letter_topic=dlq, value_format="avro",
        schema_registry={"url": schema_registry.url},
    )  # fmt: skip
    handler = _Collect()
    with ConnectionPool(pg_dsn, min_size=1, max_size=2) as pool:
        consumer = IdempotentConsumer(settings, pool, handler)
        with running(consumer):
            wait_until(
                lambda: (
                    consumer.metrics.counts["processed"] == 1
                    and consumer.metrics.counts["dead_lettered"] == 2
                ),
                timeout=60,
                message=lambda: f"{consumer.metrics.counts}",
            )
    assert handler.payloads == {ids[2]: {"amount": 3}}
    dead = {dict(r.headers)["id"].decode(): r for r in read_topics(bootstrap, dlq)}
    assert set(dead) == set(ids[:2])
    reasons = [dict(dead[i].headers)["cdc_outbox.error"].decode() for i in ids[:2]]
    assert reasons[0].startswith("value is not Avro"), reasons[0]
    assert "the registry does not know" in reasons[1], reasons[1]
    assert dead[ids[1]].value == values[1]  # the dead letter keeps the bytes
