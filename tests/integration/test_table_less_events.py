"""Table-less events (``message_prefix``): events emitted as transactional logical messages,
mixed with rows, reach Kafka as the same records rows give, in commit order; refused,
foreign-prefix and poison messages are handled as the contract says (real PostgreSQL/Kafka)."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg

from cdc_outbox.admin import lifecycle
from cdc_outbox.cdc.message_events import NON_TRANSACTIONAL
from cdc_outbox.writer import write_event, write_event_async, write_event_sqlalchemy
from cdc_outbox_dev.readback import read_topics
from tests.support.helpers import ConsumedMessage, consume_all, wait_until
from tests.support.relay import (
    init_outbox,
    outbox_statuses,
    relay_settings,
    service_thread,
    wait_streamed_past_now,
)
from tests.support.relay_process import RelayProcess

PREFIX = "app.outbox"
PAYLOAD = {"b": 1, "a": [1, 2.5], "z": {"y": None, "x": "é"}}  # jsonb reorders and respaces
HEADERS = {"tenant": "t-1", "n": 7, "flag": True}


def _without_id(record: ConsumedMessage) -> tuple[Any, ...]:
    headers = [(k, v) for k, v in record.headers if k != "id"]
    return record.topic, record.key, record.value, headers


def _event_ids(records: list[ConsumedMessage]) -> list[str]:
    return [dict(r.headers)["id"].decode() for r in records]  # type: ignore[union-attr]


def test_messages_and_rows_mixed_reach_kafka_as_rows_do(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    settings = relay_settings(pg_dsn, bootstrap, kafka_topic_prefix, message_prefix=PREFIX)
    init_outbox(settings)
    order: list[str] = []  # the event ids in commit order (one aggregate)
    with psycopg.connect(pg_dsn) as conn:
        for i in range(3):  # rows and messages interleaved inside each transaction
            order.append(str(write_event(conn, "order", "o-1", "Created", PAYLOAD, HEADERS)))
            order.append(
                str(
                    write_event(
                        conn, "order", "o-1", "Created", PAYLOAD, HEADERS, message_prefix=PREFIX
                    )
                )
            )
            order.append(
                str(write_event(conn, "order", "o-1", f"N{i}", {"i": i}, message_prefix=PREFIX))
            )
            conn.commit()
        write_event(conn, "order", "o-1", "RolledBack", {}, message_prefix=PREFIX)
        conn.rollback()

    async def write_async() -> str:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as aconn:
            eid = await write_event_async(
                aconn, "order", "o-1", "Async", {"a": 1}, message_prefix=PREFIX
            )
            await aconn.commit()
            return str(eid)

    order.append(asyncio.run(write_async()))
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(pg_dsn))
    with Session(engine) as session:
        eid = write_event_sqlalchemy(
            session, "order", "o-1", "Sa", {}, HEADERS, message_prefix=PREFIX
        )
        order.append(str(eid))
        session.commit()
    engine.dispose()
    topic = f"{kafka_topic_prefix}.event.order"
    with service_thread(settings) as service:
        records = consume_all(bootstrap, [topic], expected_count=len(order), timeout=120)
        wait_streamed_past_now(pg_dsn, settings.slot_name, 60, lambda: f"{service.stats}")
    records += consume_all(bootstrap, [topic], until_idle_s=1.0)[len(records) :]
    assert _event_ids(records) == order  # each once, per-aggregate commit order
    row, message = records[0], records[1]
    assert _without_id(message) == _without_id(row)  # byte-identical value, key, headers
    assert row.value == '{"a": [1, 2.5], "b": 1, "z": {"x": "é", "y": null}}'.encode()
    assert [(k, v) for k, v in row.headers if k not in ("id", "event_type")] == [
        ("aggregate_type", b"order"),
        ("n", b"7"),
        ("flag", b"true"),
        ("tenant", b"t-1"),
    ]  # the headers in jsonb's key order, as a row's
    with psycopg.connect(pg_dsn) as conn:  # messages leave nothing in the table
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (3,)


def _emit_raw(dsn: str, transactional: bool, prefix: str, content: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_logical_emit_message(%s, %s, %s)", (transactional, prefix, content))


def test_refused_foreign_and_poison_messages(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    settings = relay_settings(pg_dsn, bootstrap, kafka_topic_prefix, message_prefix=PREFIX)
    init_outbox(settings)
    report = lifecycle.status(settings)
    warned = {c.name: c for c in report.checks if c.warning}
    with psycopg.connect(pg_dsn) as conn:
        failover_slots = conn.info.server_version >= 170000  # init made a failover slot
        row = conn.execute(
            "SELECT setting FROM pg_settings WHERE name = 'max_slot_wal_keep_size'"
        ).fetchone()
    assert ("table_less_failover" in warned) is not failover_slots
    assert ("table_less_wal_keep" in warned) is (row is not None and row[0] != "-1")
    good = {"id": "", "aggregate_type": "order", "aggregate_id": "o-2", "event_type": "E"}
    dlq, topic = f"{kafka_topic_prefix}.dlq", f"{kafka_topic_prefix}.event.order"
    with service_thread(settings) as service:
        wait_streamed_past_now(pg_dsn, settings.slot_name, 120, lambda: f"{service.stats}")
        nontx = str(uuid.uuid4())
        _emit_raw(pg_dsn, False, PREFIX, json.dumps({**good, "id": nontx, "payload": "{}"}))
        _emit_raw(pg_dsn, True, "cdc_outbox.heartbeat", "{}")  # the relay's own: ignored
        _emit_raw(pg_dsn, True, "other.app", json.dumps({**good, "payload": "{}"}))  # ignored
        _emit_raw(pg_dsn, True, PREFIX, "not json")  # poison: dead-lettered
        poison_null_key = str(uuid.uuid4())
        _emit_raw(pg_dsn, True, PREFIX, json.dumps({"id": poison_null_key, "payload": "{}"}))
        # An id that would not cast to the id column: never handed to the row markers.
        _emit_raw(pg_dsn, True, PREFIX, json.dumps({**good, "id": "42", "payload": "{}"}))
        later = []
        with psycopg.connect(pg_dsn) as conn:
            for i in range(2):
                later.append(
                    str(write_event(conn, "order", "o-3", "L", {"i": i}, message_prefix=PREFIX))
                )
                conn.commit()
            later.append(str(write_event(conn, "order", "o-3", "Row", {})))  # marked as ever
            conn.commit()
        example = (Path(__file__).parents[2] / "sql" / "example_emit_message.sql").read_text()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(example)  # the plain-SQL example: creates orders, emits one event
            order_text = conn.execute("SELECT to_jsonb(o)::text FROM orders o").fetchone()
        published = consume_all(bootstrap, [topic], expected_count=4, timeout=120)
        dead = consume_all(bootstrap, [dlq], expected_count=4, timeout=120)
        wait_streamed_past_now(pg_dsn, settings.slot_name, 60, lambda: f"{service.stats}")
        wait_until(lambda: outbox_statuses(pg_dsn) == {"PUBLISHED": 1}, timeout=60)
        assert service.stats.refused_messages == {NON_TRANSACTIONAL: 1}
        assert service.stats.ignored.get("message", 0) >= 2  # the heartbeat and other.app
    from_sql = [r for r in published if r.key != b"o-3"]
    assert _event_ids([r for r in published if r.key == b"o-3"]) == later  # events still flow
    assert [(r.value, dict(r.headers)["event_type"]) for r in from_sql] == [
        (order_text[0].encode() if order_text else None, b"OrderUpdated")
    ]  # and nothing else was published
    by_error = {dict(r.headers)["cdc_outbox.error"].decode(): r for r in dead}  # type: ignore[union-attr]
    assert len(by_error) == 4, list(by_error)  # the DLQ has partitions: no order across them
    refused = by_error.pop(NON_TRANSACTIONAL)
    assert json.loads(refused.value or b"")["id"] == nontx  # the content kept as the value
    (not_json,) = [r for e, r in by_error.items() if e.startswith("message content is not valid")]
    assert not_json.value == b"not json"
    (null_key,) = [r for e, r in by_error.items() if "column 'aggregate_id' is null" in e]
    assert (dict(null_key.headers)["id"] or b"").decode() == poison_null_key
    (bad_id,) = [r for e, r in by_error.items() if "message field 'id' is not a UUID" in e]
    assert json.loads(bad_id.value or b"")["id"] == "42"
    assert len(consume_all(bootstrap, [dlq], until_idle_s=1.0)) == 4


def test_exactly_once_across_a_relay_kill(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    settings = relay_settings(
        pg_dsn,
        bootstrap,
        kafka_topic_prefix,
        message_prefix=PREFIX,
        delivery="exactly_once",
        # A long Kafka transaction: the kill lands while one holds acknowledged records.
        eos={
            "checkpoint_topic": f"{kafka_topic_prefix}.checkpoints",
            "commit_interval_ms": 2_000,
            "min_commit_interval_ms": 2_000,
        },
    )
    init_outbox(settings)
    written: dict[str, list[str]] = {}  # aggregate -> event ids in commit order
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(pg_dsn) as conn:
            n = 0
            while not stop.is_set():
                agg = f"a-{n % 5}"
                ids = [
                    str(write_event(conn, "order", agg, "M", {"n": n}, message_prefix=PREFIX)),
                    str(write_event(conn, "order", agg, "R", {"n": n})),
                    str(write_event(conn, "order", agg, "M2", {"n": n}, message_prefix=PREFIX)),
                ]
                conn.commit()
                written.setdefault(agg, []).extend(ids)
                n += 1
                stop.wait(0.01)

    def committed() -> list[Any]:
        return read_topics(bootstrap, f"{kafka_topic_prefix}.event.", timeout=60)

    writer = threading.Thread(target=write, name="writer")
    refused = json.dumps({"id": str(uuid.uuid4()), "aggregate_id": "x"})
    _emit_raw(pg_dsn, False, PREFIX, refused)  # dead-lettered in a Kafka transaction too
    relay = RelayProcess(settings, f"table-less-eos-{kafka_topic_prefix}")
    relay.start()
    writer.start()
    try:
        wait_until(lambda: len(committed()) >= 60, timeout=120, interval=0.5)
        relay.kill()  # kill -9 between or inside Kafka transactions
        relay = RelayProcess(settings, f"table-less-eos-{kafka_topic_prefix}-2")
        relay.start()
        wait_until(lambda: len(committed()) >= 150, timeout=120, interval=0.5)
        stop.set()
        writer.join(60)
        expected = sum(len(ids) for ids in written.values())
        wait_until(
            lambda: len(committed()) >= expected,
            timeout=120,
            interval=0.5,
            message=lambda: relay.log_tail(),
        )
        assert relay.alive, relay.log_tail()
    finally:
        stop.set()
        relay.stop_quietly()
        if writer.ident is not None:
            writer.join(60)
    records = committed()
    seen: dict[str, list[str]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        seen.setdefault((r.key or b"").decode(), []).append(dict(r.headers)["id"].decode())
    assert seen == written  # each event exactly once, each aggregate's in commit order
    dead = read_topics(bootstrap, f"{kafka_topic_prefix}.dlq", timeout=60)
    assert [(r.value, dict(r.headers)["cdc_outbox.error"]) for r in dead] == [
        (refused.encode(), NON_TRANSACTIONAL.encode())
    ]
