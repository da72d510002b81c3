"""``config import-debezium`` end to end: the example Debezium connector of docs/examples,
converted by the CLI, run by ``cdc-outbox --config FILE run`` against real PostgreSQL and
Kafka, publishes the records the Debezium documentation gives for that configuration."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg

from cdc_outbox.config.settings import load_settings
from cdc_outbox_dev.sandbox.kafka import LocalKafka
from tests.support.helpers import consume_all

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "debezium-outbox.properties"
#: Debezium's outbox table, with the column names the example connector configures.
TABLE = """
CREATE SCHEMA app;
CREATE TABLE app.outboxevent (
    event_id       uuid         PRIMARY KEY,
    aggregate_type varchar(255) NOT NULL,
    aggregate_id   varchar(255) NOT NULL,
    type           varchar(255) NOT NULL,
    payload        jsonb,
    tenant_id      varchar(64)
)"""


def _cli(*args: str | Path, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "cdc_outbox", *map(str, args)],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done.stdout


def test_converted_debezium_connector_publishes_what_debezium_documents(
    pg_dsn: str, kafka_broker: LocalKafka, kafka_topic_prefix: str, tmp_path: Path
) -> None:
    slot = f"dbz_{uuid.uuid4().hex[:12]}"
    connector = tmp_path / "connector.properties"
    connector.write_text(  # this test's own slot and topics, the rest as in docs/examples
        EXAMPLE.read_text()
        .replace("slot.name=shop_outbox", f"slot.name={slot}")
        .replace("replacement=shop.", f"replacement={kafka_topic_prefix}.")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_OUTBOX_")}
    env["PYTHONPATH"] = str(REPO)
    toml = tmp_path / "relay.toml"
    toml.write_text(_cli("config", "import-debezium", connector, env=env, cwd=tmp_path))
    # The settings loader takes the file as it is; the environment supplies what the
    # connector configuration cannot (the real database, the broker, no metrics port).
    assert load_settings(toml, {"dsn": pg_dsn}).topic_template == (
        kafka_topic_prefix + ".{aggregate_type}.events"
    )
    env.update(
        CDC_OUTBOX_DSN=pg_dsn,
        CDC_OUTBOX_KAFKA__BOOTSTRAP_SERVERS=kafka_broker.bootstrap_servers,
        CDC_OUTBOX_METRICS_PORT="0",
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(TABLE)
    _cli("--config", toml, "init", env=env, cwd=tmp_path)
    paid, deleted = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(
            "INSERT INTO app.outboxevent VALUES (%s, 'order', '42', 'OrderPaid', %s, 'acme'),"
            " (%s, 'order', '42', 'OrderDeleted', NULL, 'acme')",
            (paid, '{"id": 42, "lineItems": [{"item": "Debezium in Action", "quantity": 2}],'
             ' "totalPrice": 39.98}', deleted),
        )  # fmt: skip
        conn.commit()
        [(stored,)] = conn.execute("SELECT payload::text FROM app.outboxevent WHERE payload"
                                   " IS NOT NULL").fetchall()  # fmt: skip
    log_path = tmp_path / "relay.log"
    with log_path.open("wb") as log:
        relay = subprocess.Popen(
            [sys.executable, "-m", "cdc_outbox", "--config", str(toml), "run"],
            env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        topic = f"{kafka_topic_prefix}.order.events"
        records = consume_all(kafka_broker.bootstrap_servers, [topic], 2, timeout=90)
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(60) == 0, log_path.read_text()[-3000:]
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait(30)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s", (slot,),
            )  # fmt: skip
    # Debezium, StringConverter key and value: topic = route.topic.replacement with the
    # aggregate_type value, key = the aggregate_id text, value = the payload column's text,
    # header id = the event id; route.tombstone.on.empty.payload: a NULL payload -> tombstone;
    # table.fields.additional.placement=type:header:eventType,tenant_id:header:tenant: the
    # type column's value in header eventType, tenant_id's in header tenant.
    first, second = records
    assert (first.topic, first.key, first.value) == (topic, b"42", stored.encode())
    assert (second.topic, second.key, second.value) == (topic, b"42", None)
    for record, event_id, event_type in ((first, paid, b"OrderPaid"),
                                         (second, deleted, b"OrderDeleted")):  # fmt: skip
        headers = dict(record.headers)
        assert headers["id"] == str(event_id).encode()
        assert (headers["eventType"], headers["tenant"]) == (event_type, b"acme")
        # cdc-outbox adds two headers a Debezium consumer does not read (docs/debezium.md)
        assert record.headers == [
            ("id", str(event_id).encode()), ("event_type", event_type),
            ("aggregate_type", b"order"), ("eventType", event_type), ("tenant", b"acme"),
        ]  # fmt: skip


def test_a_connector_of_several_tables_becomes_outboxes_that_init_sets_up(
    pg_dsn: str, tmp_path: Path
) -> None:
    """table.include.list of two tables: two [[outboxes]] entries; ``init`` checks both and
    puts both in the one publication, ``status`` shows both (streaming both is the CDC
    relay's part)."""
    tag = uuid.uuid4().hex[:12]
    connector = tmp_path / "connector.properties"
    connector.write_text(
        EXAMPLE.read_text()
        .replace("slot.name=shop_outbox", f"slot.name=dbz_{tag}")
        .replace("publication.name=shop_outbox_pub", f"publication.name=dbz_pub_{tag}")
        .replace("table.include.list=app.outboxevent",
                 "table.include.list=app.outboxevent,app.refundevent")
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_OUTBOX_")}
    env["PYTHONPATH"] = str(REPO)
    toml = tmp_path / "relay.toml"
    toml.write_text(_cli("config", "import-debezium", connector, env=env, cwd=tmp_path))
    settings = load_settings(toml, {"dsn": pg_dsn})
    assert [o.name for o in settings.outbox_settings()] == ["app.outboxevent", "app.refundevent"]
    env.update(CDC_OUTBOX_DSN=pg_dsn, CDC_OUTBOX_METRICS_PORT="0")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(TABLE)
        conn.execute("CREATE TABLE app.refundevent (LIKE app.outboxevent INCLUDING ALL)")
    try:
        _cli("--config", toml, "init", env=env, cwd=tmp_path)
        with psycopg.connect(pg_dsn) as conn:
            tables = conn.execute(
                "SELECT schemaname || '.' || tablename FROM pg_publication_tables"
                " WHERE pubname = %s ORDER BY 1",
                (f"dbz_pub_{tag}",),
            ).fetchall()
        assert tables == [("app.outboxevent",), ("app.refundevent",)]
        status = json.loads(_cli("--config", toml, "status", "--json", env=env, cwd=tmp_path))
        assert [o["outbox"] for o in status["outboxes"]] == ["app.outboxevent", "app.refundevent"]
        assert all(o["exists"] and o["unpublished_rows"] == 0 for o in status["outboxes"])
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s", (f"dbz_{tag}",),
            )  # fmt: skip
