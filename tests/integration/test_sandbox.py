"""The local services are real and survive restarts: Kafka round trips, PostgreSQL settings,
restart/kill recovery, self-healing session fixtures, in-process use and the sandbox CLI."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
from confluent_kafka import Producer
from psycopg import pq
from typer.testing import CliRunner

from cdc_outbox.avro.registry import RegistryClient
from cdc_outbox_dev import sandbox
from cdc_outbox_dev.cli import sandbox_app
from cdc_outbox_dev.sandbox.kafka import LocalKafka, api_versions_ok
from cdc_outbox_dev.sandbox.postgres import LocalPostgres
from cdc_outbox_dev.sandbox.registry import LocalRegistry
from tests.support.helpers import consume_all, wait_until


def produce(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
    """Produce one record with acks=all and fail unless the broker acknowledged it."""
    acked: list[str | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    producer.produce(
        topic,
        key=key,
        value=value,
        headers=[("id", key), ("kind", b"test")],
        on_delivery=lambda err, _msg: acked.append(None if err is None else str(err)),
    )
    assert producer.flush(30) == 0
    assert acked == [None]


def scalar(dsn: str, query: str, *params: object) -> object:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query, params or None).fetchone()
    assert row is not None
    return row[0]


# -- Kafka ---------------------------------------------------------------------------------


def test_kafka_round_trip_keeps_key_value_headers(
    kafka_broker: LocalKafka, kafka_topic_prefix: str
) -> None:
    topic = f"{kafka_topic_prefix}.orders"
    produce(kafka_broker.bootstrap_servers, topic, b"order-1", b'{"total": 42}')

    [record] = consume_all(kafka_broker.bootstrap_servers, [topic], expected_count=1)
    assert (record.key, record.value) == (b"order-1", b'{"total": 42}')
    assert record.headers == [("id", b"order-1"), ("kind", b"test")]
    assert record.topic == topic and record.offset == 0


def test_kafka_restart_keeps_data(kafka_broker: LocalKafka, kafka_topic_prefix: str) -> None:
    topic = f"{kafka_topic_prefix}.durable"
    produce(kafka_broker.bootstrap_servers, topic, b"k", b"before-stop")
    port = kafka_broker.port

    kafka_broker.stop()
    assert not kafka_broker.is_running()
    assert not api_versions_ok("127.0.0.1", port, timeout=0.5)
    kafka_broker.start()
    assert kafka_broker.port == port
    produce(kafka_broker.bootstrap_servers, topic, b"k", b"after-restart")

    kafka_broker.kill()
    assert not kafka_broker.is_running()
    kafka_broker.start()
    produce(kafka_broker.bootstrap_servers, topic, b"k", b"after-kill")

    records = consume_all(kafka_broker.bootstrap_servers, [topic], expected_count=3)
    assert [r.value for r in records] == [b"before-stop", b"after-restart", b"after-kill"]


def test_kafka_stop_left_by_a_test(kafka_broker: LocalKafka) -> None:
    kafka_broker.stop()  # deliberately left stopped: the fixture must heal it
    assert not kafka_broker.is_running()


def test_session_kafka_was_healed(kafka_broker: LocalKafka, kafka_topic_prefix: str) -> None:
    assert kafka_broker.is_running()
    topic = f"{kafka_topic_prefix}.healed"
    produce(kafka_broker.bootstrap_servers, topic, b"k", b"v")
    assert len(consume_all(kafka_broker.bootstrap_servers, [topic], expected_count=1)) == 1


# -- PostgreSQL ----------------------------------------------------------------------------


def test_postgres_is_ready_for_logical_replication(pg_server: LocalPostgres, pg_dsn: str) -> None:
    assert scalar(pg_dsn, "SHOW wal_level") == "logical"
    assert scalar(pg_dsn, "SHOW max_slot_wal_keep_size") == "256MB"
    assert scalar(pg_dsn, "SHOW wal_sender_timeout") == "1min"
    assert scalar(pg_dsn, "SHOW fsync") == "on"
    assert scalar(pg_dsn, "SELECT current_database()") != "postgres"
    assert scalar(pg_dsn, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
    assert f"port={pg_server.port}" in pg_server.dsn

    # pg_hba allows walsender connections on 127.0.0.1.
    walsender = pq.PGconn.connect(f"{pg_dsn} replication=database".encode())
    try:
        assert walsender.status == pq.ConnStatus.OK, walsender.get_error_message()
        result = walsender.exec_(b"IDENTIFY_SYSTEM")
        assert result.status == pq.ExecStatus.TUPLES_OK
    finally:
        walsender.finish()


def test_extra_login_role_without_replication(pg_dsn: str) -> None:
    role = f"app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN").format(psycopg.sql.Identifier(role)))
    try:
        as_role = psycopg.conninfo.make_conninfo(pg_dsn, user=role)
        assert (
            scalar(as_role, "SELECT rolreplication FROM pg_roles WHERE rolname = current_user")
            is False
        )
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(role)))


def test_postgres_restart_and_crash_recovery_keep_data(
    pg_server: LocalPostgres, pg_dsn: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (v int)")
        conn.execute("INSERT INTO t VALUES (1)")

    pg_server.restart()
    assert scalar(pg_dsn, "SELECT sum(v) FROM t") == 1

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (2)")  # committed, then the server crashes
    pg_server.kill()
    assert not pg_server.is_running()
    pg_server.start()
    assert scalar(pg_dsn, "SELECT sum(v) FROM t") == 3
    assert "redo done" in pg_server.logfile.read_text()  # crash recovery ran


def test_postgres_changes_left_by_a_test(pg_server: LocalPostgres, pg_dsn: str) -> None:
    pg_server.restart(wal_level="replica")
    assert scalar(pg_dsn, "SHOW wal_level") == "replica"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_wal_senders = 3")
    pg_server.kill()  # deliberately left down and misconfigured: the fixtures must heal it


def test_session_postgres_was_healed(pg_server: LocalPostgres, pg_dsn: str) -> None:
    assert pg_server.is_running()
    assert scalar(pg_dsn, "SHOW wal_level") == "logical"
    assert scalar(pg_dsn, "SHOW max_wal_senders") == "10"


def test_pg_dsn_drops_database_with_active_slot(pg_server: LocalPostgres) -> None:
    name = f"t_slot_{uuid.uuid4().hex[:8]}"
    dsn = pg_server.create_database(name)
    walsender = pq.PGconn.connect(f"{dsn} replication=database".encode())
    try:
        result = walsender.exec_(b"CREATE_REPLICATION_SLOT s1 LOGICAL pgoutput")
        assert result.status == pq.ExecStatus.TUPLES_OK
        walsender.send_query(
            b"START_REPLICATION SLOT s1 LOGICAL 0/0 (proto_version '1', publication_names 'p')"
        )
        wait_until(
            lambda: scalar(pg_server.dsn, "SELECT active FROM pg_replication_slots"),
            message="slot never became active",
        )
        pg_server.drop_database(name)
    finally:
        walsender.finish()
    assert scalar(pg_server.dsn, "SELECT count(*) FROM pg_database WHERE datname = %s", name) == 0
    assert scalar(pg_server.dsn, "SELECT count(*) FROM pg_replication_slots") == 0


# -- in-process and CLI use ----------------------------------------------------------------


def test_in_process_servers_clean_up_after_themselves() -> None:
    with LocalPostgres() as pg, LocalKafka() as kafka:
        assert scalar(pg.dsn, "SHOW wal_level") == "logical"
        produce(kafka.bootstrap_servers, "in-process", b"k", b"v")
        dirs = (pg.base_dir, kafka.base_dir)
    assert not pg.is_running() and not kafka.is_running()
    assert not any(d.exists() for d in dirs)


def test_sandbox_cli_up_status_down(tmp_path: Path) -> None:
    state = tmp_path / "sandbox"  # unreachable for the postgres OS user: data goes to $TMPDIR
    runner = CliRunner()
    try:
        first = runner.invoke(sandbox_app, ["up", "--dir", str(state)])
        assert first.exit_code == 0, first.output
        info = sandbox.status(state)
        assert info is not None and info.running
        assert info.export_line() in first.output
        assert scalar(info.dsn, "SHOW wal_level") == "logical"
        produce(info.bootstrap_servers, "cli-topic", b"k", b"v")
        registry = RegistryClient(info.registry_url)
        schema_id = registry.register("cli-value", '{"type": "record", "name": "R", "fields": []}')

        again = runner.invoke(sandbox_app, ["up", "--dir", str(state)])  # idempotent
        assert again.exit_code == 0, again.output
        assert sandbox.status(state) == info

        shown = runner.invoke(sandbox_app, ["status", "--dir", str(state), "--json"])
        assert shown.exit_code == 0
        assert json.loads(shown.output)["postgres"]["pid"] == info.postgres_pid

        stopped = runner.invoke(sandbox_app, ["down", "--dir", str(state)])
        assert stopped.exit_code == 0
        assert runner.invoke(sandbox_app, ["status", "--dir", str(state)]).exit_code == 1

        restarted = sandbox.up(state)  # same ports, data kept
        assert (restarted.postgres_port, restarted.kafka_port) == (
            info.postgres_port,
            info.kafka_port,
        )
        records = consume_all(restarted.bootstrap_servers, ["cli-topic"], expected_count=1)
        assert records[0].value == b"v"
        assert restarted.registry_url == info.registry_url
        if LocalRegistry(state / "registry", durable=True).durable:  # Apicurio 3.x
            assert registry.latest("cli-value")[0] == schema_id
    finally:
        purged = runner.invoke(sandbox_app, ["down", "--dir", str(state), "--purge"])
    assert purged.exit_code == 0
    assert not state.exists()
    assert not info.postgres_datadir.exists()
    assert sandbox.status(state) is None


def test_sandbox_cli_up_with_three_brokers(tmp_path: Path) -> None:
    """``sandbox up --brokers 3``: a three-node cluster (every topic replicated 3 times),
    kept on a later ``up``, refused with another count, stopped all at once by ``down``."""
    from cdc_outbox_dev.sandbox.kafka_cluster import LocalKafkaCluster

    state = tmp_path / "sandbox3"
    runner = CliRunner()
    try:
        first = runner.invoke(sandbox_app, ["up", "--dir", str(state), "--brokers", "3"])
        assert first.exit_code == 0, first.output
        assert "3 brokers, all running" in first.output
        info = sandbox.status(state)
        assert info is not None and info.running and info.kafka_brokers == 3
        assert len(info.bootstrap_servers.split(",")) == 3
        cluster = LocalKafkaCluster(state / "kafka-cluster")
        assert cluster.brokers() == {1, 2, 3}
        produce(info.bootstrap_servers, "cli3-topic", b"k", b"v")
        wait_until(lambda: cluster.partitions("cli3-topic"), timeout=30)
        assert all(len(r) == 3 for _l, r, _i in cluster.partitions("cli3-topic").values())

        other = runner.invoke(sandbox_app, ["up", "--dir", str(state), "--brokers", "1"])
        assert other.exit_code == 1 and "has 3 Kafka broker(s)" in other.output
        assert runner.invoke(sandbox_app, ["up", "--brokers", "2"]).exit_code == 2
        again = runner.invoke(sandbox_app, ["up", "--dir", str(state)])  # keeps 3
        assert again.exit_code == 0, again.output
        assert sandbox.status(state) == info

        stopped = runner.invoke(sandbox_app, ["down", "--dir", str(state)])
        assert stopped.exit_code == 0
        assert cluster.running_nodes() == []
    finally:
        purged = runner.invoke(sandbox_app, ["down", "--dir", str(state), "--purge"])
    assert purged.exit_code == 0
    assert not state.exists()
