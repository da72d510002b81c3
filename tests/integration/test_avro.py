"""Avro values (issue 10) against a real Apicurio registry, PostgreSQL and Kafka.

Values are read back with confluent_kafka's AvroDeserializer (an independent reader, which
fetches the writer schema by the id in the Confluent wire format). Covered: the workload's
tally in CDC streaming, snapshot catch-up and polling; schema failures dead-lettered with
fastavro's reason and redriven after the schema is fixed; a registry outage (cached event types
flow, a new one waits without being dead-lettered and the slot does not pass it); ``schemas
check`` refusing an incompatible change with exit 3.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cdc_outbox.admin import outbox_ops as outbox_admin
from cdc_outbox.lsn import Lsn
from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import ConsumedRecord, read_topics
from cdc_outbox_dev.sandbox.registry import LocalRegistry, registry_client
from tests.support.helpers import run_cli, wait_until
from tests.support.relay import (
    current_wal_lsn,
    init_for_catch_up,
    init_outbox,
    outbox_statuses,
    relay_settings,
    relay_thread,
    service_thread,
    slot_position,
    tally_topics,
)

DEMO_SCHEMA = (
    Path(__file__).resolve().parents[2] / "cdc_outbox_dev" / "schemas" / "OrderPlaced.avsc"
)


def _record(name: str, fields: list[tuple[str, Any]]) -> str:
    return json.dumps(
        {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}
    )


def _reader(registry: LocalRegistry, field: str = MessageField.VALUE) -> Callable[[Any], Any]:
    """Decode with AvroDeserializer (fresh client: no ids cached across restarts)."""
    deserializer = AvroDeserializer(registry_client(registry.url))
    ctx = SerializationContext("any", field)
    return lambda value: deserializer(value, ctx)


def _avro_settings(pg_dsn: str, kafka: Any, prefix: str, registry: LocalRegistry, **sr: Any) -> Any:
    top = sr.pop("_top", {})
    return relay_settings(
        pg_dsn,
        kafka.bootstrap_servers,
        prefix,
        value_format="avro",
        schema_registry={"url": registry.url, **sr},
        **top,
    )


def _demo_schema_outbox(
    pg_dsn: str, kafka: Any, prefix: str, registry: LocalRegistry, schemas_dir: Path, **sr: Any
) -> Any:
    """Avro settings with the demo schema copied to ``schemas_dir`` (auto_register); the
    outbox, publication and slot created."""
    shutil.copy(DEMO_SCHEMA, schemas_dir)
    settings = _avro_settings(
        pg_dsn, kafka, prefix, registry, schemas_dir=str(schemas_dir), auto_register=True, **sr
    )
    init_outbox(settings)
    return settings


def _wait_published(service: Any, events: int) -> None:
    wait_until(
        lambda: service.stats.events_published >= events,
        timeout=90,
        message=lambda: f"{service.stats}",
    )


def _write_workload(dsn: str, events: int, settings: Any, aggregate_type: str = "order") -> None:
    spec = workload.WorkloadSpec(
        events=events, writers=2, aggregates=20, txn_sizes=(1, 5, 20), aggregate_type=aggregate_type
    )
    workload.write_orders(dsn, spec, columns=settings.column_names())


def _ok_tally(pg_dsn: str, settings: Any, kafka: Any, prefix: str, registry: LocalRegistry) -> None:
    avro_keys = settings.key_format == "avro"
    verdict = tally_topics(
        pg_dsn,
        settings,
        kafka.bootstrap_servers,
        prefix,
        decode_value=_reader(registry),
        decode_key=_reader(registry, MessageField.KEY) if avro_keys else None,
    )
    assert verdict.ok and not verdict.missing, verdict.summary()
    records = read_topics(kafka.bootstrap_servers, f"{prefix}.event.")
    assert records and all(r.value and r.value[0] == 0 for r in records)  # wire format
    assert all(
        [h[0] for h in r.headers][:3] == ["id", "event_type", "aggregate_type"] for r in records
    )


def test_catch_up_and_cdc_tally_in_avro(
    pg_dsn: str,
    kafka_broker: Any,
    kafka_topic_prefix: str,
    schema_registry: LocalRegistry,
    tmp_path: Path,
) -> None:
    """Backlog via the snapshot catch-up, then streaming: every value decodes to its payload,
    keys, headers and per-aggregate order as in JSON mode (schemas_dir + auto_register)."""
    settings = _demo_schema_outbox(
        pg_dsn, kafka_broker, kafka_topic_prefix, schema_registry, tmp_path
    )
    init_for_catch_up(settings)  # the backlog below is published by the catch-up
    _write_workload(pg_dsn, 300, settings)
    with service_thread(settings) as service:
        wait_until(lambda: service.stats.phase == "STREAMING", timeout=90)
        assert service.stats.catch_ups == 1
        _write_workload(pg_dsn, 300, settings, "invoice")  # streamed (own aggregates, topic)
        _wait_published(service, 600)
    _ok_tally(pg_dsn, settings, kafka_broker, kafka_topic_prefix, schema_registry)


def test_polling_tally_in_avro_with_avro_keys(
    pg_dsn: str,
    kafka_broker: Any,
    kafka_topic_prefix: str,
    schema_registry: LocalRegistry,
    tmp_path: Path,
) -> None:
    """Polling mode, the same serializer: values and keys (``key_format = "avro"``) decode to
    the payload and the aggregate id; topic_record subjects."""
    settings = _demo_schema_outbox(
        pg_dsn,
        kafka_broker,
        kafka_topic_prefix,
        schema_registry,
        tmp_path,
        subject_name_strategy="topic_record",
        _top={"mode": "polling", "key_format": "avro"},
    )
    with service_thread(settings) as service:
        wait_until(lambda: service.stats.phase == "POLLING", timeout=60)
        _write_workload(pg_dsn, 300, settings)
        _wait_published(service, 300)
    _ok_tally(pg_dsn, settings, kafka_broker, kafka_topic_prefix, schema_registry)


def _insert(conn: psycopg.Connection[Any], agg: str, event_type: str, payload: Any) -> str:
    event_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
        " VALUES (%s, 'order', %s, %s, %s)",
        (event_id, agg, event_type, json.dumps(payload)),
    )
    return event_id


def _by_id(records: list[ConsumedRecord]) -> dict[str, ConsumedRecord]:
    return {dict(r.headers)["id"].decode(): r for r in records}


def test_schema_failures_are_dead_lettered_and_redriven(
    pg_dsn: str,
    kafka_broker: Any,
    kafka_topic_prefix: str,
    schema_registry: LocalRegistry,
) -> None:
    """Wrong field type and unknown event type: dead letters with fastavro's reason, the
    aggregate parked, other events flow; after the schemas are fixed, redrive publishes them."""
    settings = _avro_settings(
        pg_dsn,
        kafka_broker,
        kafka_topic_prefix,
        schema_registry,
        subject_name_strategy="topic_record",
    )
    topic = f"{kafka_topic_prefix}.event.order"
    client = registry_client(schema_registry.url)
    v1 = _record("Paid", [("amount", "long")])
    client.register_schema(f"{topic}-Paid-value", Schema(v1, "AVRO"))
    init_outbox(settings)
    bootstrap = kafka_broker.bootstrap_servers
    with relay_thread(settings) as relay:
        with psycopg.connect(pg_dsn) as conn:
            good = _insert(conn, "a", "Paid", {"amount": 1})
            conn.commit()
            bad = _insert(conn, "b", "Paid", {"amount": "ten"})
            conn.commit()
            later = _insert(conn, "b", "Paid", {"amount": 3})  # parked behind `bad`
            unknown = _insert(conn, "c", "Refunded", {"amount": 4})
            other = _insert(conn, "d", "Paid", {"amount": 5})
            conn.commit()
        wait_until(
            lambda: outbox_statuses(pg_dsn).get("FAILED", 0) == 3,
            timeout=60,
            message=lambda: f"{outbox_statuses(pg_dsn)}",
        )
        wait_until(lambda: relay.stats.events_published >= 2, timeout=30)
        dead = _by_id(read_topics(bootstrap, f"{kafka_topic_prefix}.dlq"))
        assert set(dead) == {bad, later, unknown}
        reason = dict(dead[bad].headers)["cdc_outbox.error"].decode()
        assert "Paid.amount is <ten>" in reason and "expected long" in reason, reason
        assert dead[bad].value == b'{"amount": "ten"}'  # the dead letter keeps the JSON
        assert dict(dead[later].headers)["cdc_outbox.error"] == f"blocked_by {bad}".encode()
        assert (
            b"no schema for event type 'Refunded'"
            in dict(dead[unknown].headers)["cdc_outbox.error"]
        )
        read = _reader(schema_registry)
        main = _by_id(read_topics(bootstrap, f"{kafka_topic_prefix}.event."))
        assert set(main) == {good, other}
        assert read(main[good].value) == {"amount": 1}

        # Fix: a BACKWARD-compatible v2 that also takes strings; a schema for Refunded.
        v2 = json.dumps(
            {
                "type": "record",
                "name": "Paid",
                "fields": [{"name": "amount", "type": ["long", "string"]}],
            }
        )
        client.register_schema(f"{topic}-Paid-value", Schema(v2, "AVRO"))
        client.register_schema(
            f"{topic}-Refunded-value", Schema(_record("Refunded", [("amount", "long")]), "AVRO")
        )
        for event_id in (bad, unknown):
            outbox_admin.redrive(settings, outbox_admin.RedriveFilter(ids=(event_id,)))
        wait_until(lambda: outbox_statuses(pg_dsn).get("FAILED", 0) == 0, timeout=60)
        wait_until(
            lambda: relay.stats.events_published >= 5, timeout=60, message=lambda: f"{relay.stats}"
        )
    records = read_topics(bootstrap, f"{kafka_topic_prefix}.event.")
    main = _by_id(records)
    assert {read(main[i].value)["amount"] for i in (bad, later, unknown)} == {"ten", 3, 4}
    order_b = [dict(r.headers)["id"].decode() for r in records if r.key == b"b"]
    assert order_b == [bad, later]


def test_registry_outage_cached_types_flow_new_type_waits(
    pg_dsn: str,
    kafka_broker: Any,
    kafka_topic_prefix: str,
    schema_registry: LocalRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Stop the registry mid-load: the cached Paid type flows, the first Shipped event waits
    (retried, not dead-lettered, the slot not confirmed past it) until the registry is back."""
    caplog.set_level(logging.WARNING)
    settings = _avro_settings(
        pg_dsn,
        kafka_broker,
        kafka_topic_prefix,
        schema_registry,
        subject_name_strategy="topic_record",
        timeout_s=2.0,
    )
    topic = f"{kafka_topic_prefix}.event.order"
    paid, shipped = _record("Paid", [("amount", "long")]), _record("Shipped", [("to", "string")])

    def register_both() -> None:  # in this order: the same ids after the (empty) restart
        client = registry_client(schema_registry.url)
        client.register_schema(f"{topic}-Paid-value", Schema(paid, "AVRO"))
        client.register_schema(f"{topic}-Shipped-value", Schema(shipped, "AVRO"))

    if not schema_registry.durable:  # in-memory (2.x): empty, so both starts give the same ids
        schema_registry.stop()
        schema_registry.start()
    register_both()
    init_outbox(settings)
    bootstrap = kafka_broker.bootstrap_servers
    with relay_thread(settings) as relay:
        with psycopg.connect(pg_dsn) as conn:
            first = _insert(conn, "a", "Paid", {"amount": 1})
            conn.commit()
        wait_until(lambda: relay.stats.events_published >= 1, timeout=60)  # Paid is cached
        schema_registry.stop()
        try:
            with psycopg.connect(pg_dsn) as conn:
                cached = [_insert(conn, "a", "Paid", {"amount": n}) for n in (2, 3)]
                conn.commit()
                wait_until(
                    lambda: relay.stats.events_published >= 3,
                    timeout=60,
                    message=lambda: f"{relay.stats}",
                )
                before_new = current_wal_lsn(pg_dsn)
                new = _insert(conn, "b", "Shipped", {"to": "x"})
                after_b = _insert(conn, "b", "Paid", {"amount": 5})  # cached type, behind `new`
                conn.commit()
                after = _insert(conn, "a", "Paid", {"amount": 4})
                conn.commit()
            restarts = relay.stats.restarts
            wait_until(lambda: relay.stats.restarts >= restarts + 2, timeout=60)  # retried
            assert "no cached schema for Shipped" in caplog.text
            assert outbox_statuses(pg_dsn).get("FAILED", 0) == 0
            assert read_topics(bootstrap, f"{kafka_topic_prefix}.dlq", timeout=30) == []
            confirmed, _ = slot_position(pg_dsn, settings.slot_name)
            assert confirmed <= before_new and confirmed > Lsn(0)
            published = _by_id(read_topics(bootstrap, f"{kafka_topic_prefix}.event."))
            assert {first, *cached} <= set(published)
            assert not {new, after, after_b} & set(published)
        finally:
            schema_registry.start()
        if not schema_registry.durable:  # came back empty (racy: the relay may ask first)
            register_both()
        wait_until(
            lambda: new in _by_id(read_topics(bootstrap, f"{kafka_topic_prefix}.event.")),
            timeout=90,
            message=lambda: f"{relay.stats}",
        )
        wait_until(
            lambda: (
                {after, after_b}
                <= set(_by_id(read_topics(bootstrap, f"{kafka_topic_prefix}.event.")))
            ),
            timeout=30,
        )
    read = _reader(schema_registry)
    main = _by_id(read_topics(bootstrap, f"{kafka_topic_prefix}.event."))
    assert read(main[new].value) == {"to": "x"} and read(main[after].value) == {"amount": 4}
    records = read_topics(bootstrap, f"{kafka_topic_prefix}.event.")
    first_b = list(dict.fromkeys(dict(r.headers)["id"].decode() for r in records if r.key == b"b"))
    assert first_b == [new, after_b]
    assert outbox_statuses(pg_dsn).get("FAILED", 0) == 0


def test_schemas_check_refuses_an_incompatible_change(
    schema_registry: LocalRegistry,
    tmp_path: Path,
    kafka_topic_prefix: str,
) -> None:
    name = "Check" + uuid.uuid4().hex[:8]
    path = tmp_path / f"{name}.avsc"
    path.write_text(_record(name, [("amount", "long")]))
    env = {
        "CDC_OUTBOX_SCHEMA_REGISTRY__URL": schema_registry.url,
        "CDC_OUTBOX_SCHEMA_REGISTRY__SCHEMAS_DIR": str(tmp_path),
        "CDC_OUTBOX_SCHEMA_REGISTRY__AUTO_REGISTER": "true",
        "CDC_OUTBOX_SCHEMA_REGISTRY__SUBJECT_NAME_STRATEGY": "record",
        "CDC_OUTBOX_VALUE_FORMAT": "avro",
    }
    ok = run_cli("schemas", "check", dsn="host=127.0.0.1", **env)
    assert ok.returncode == 0, ok.stderr
    assert f"ok {name}-value" in ok.stdout
    path.write_text(_record(name, [("amount", "string")]))  # long -> string: not BACKWARD
    refused = run_cli("schemas", "check", dsn="host=127.0.0.1", **env)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert f"subject '{name}-value'" in lines[0], lines[0]
    # Apicurio 2.x (the Java 17 fallback) enforces BACKWARD but reports NONE
    rule = "the BACKWARD" if schema_registry.version.startswith("3") else "the registry's"
    assert f"breaks {rule} compatibility rule" in lines[0], lines[0]
