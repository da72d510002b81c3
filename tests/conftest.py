"""Shared fixtures: a real PostgreSQL and a real Kafka from cdc_outbox_dev.sandbox.

``CDC_OUTBOX_TEST_BACKEND`` picks them: ``local`` (default: local processes, no Docker) or
``testcontainers`` (containers, for machines with Docker; cdc_outbox_dev/sandbox/containers.py).
``CDC_OUTBOX_PG_VERSION`` (15, 16, 17 or 18) picks the local PostgreSQL major
(cdc_outbox_dev/sandbox/pg_versions.py); a bad value is a usage error (exit 2).

- ``pg_server`` (session): running ``LocalPostgres`` (wal_level=logical, trust on 127.0.0.1).
- ``pg_dsn``: a fresh empty database per test, dropped afterwards (slots and sessions first).
- ``pg_primary_standby``: a fresh ``LocalPostgres`` primary and its asynchronous physical
  standby (cdc_outbox_dev/sandbox/standby.py; physical slot ``standby1``), local processes on
  every backend, for failover tests that kill the primary; both deleted afterwards.
- ``kafka_broker`` (session): running single-node KRaft ``LocalKafka``.
- ``kafka_cluster`` (session, started only by tests that use it): a three-node KRaft
  ``LocalKafkaCluster`` (local processes on every backend; replication factor 3,
  ``min.insync.replicas=2``, cdc_outbox_dev/sandbox/kafka_cluster.py) for replicated-cluster
  faults (docs/kafka-faults.md). After each test killed or stopped nodes are started again and
  every partition is back in full replication.
- ``kafka_strict_broker`` (session): a second ``LocalKafka`` with topic auto-creation off and
  an ACL authorizer, for missing-topic and authorization faults (docs/kafka-faults.md).
- ``redis_server`` (session): running ``LocalRedis`` (loopback, no persistence);
  ``redis_url``: its URL, with the database flushed before the test.
- ``schema_registry`` (session): running ``LocalRegistry`` (Apicurio, Confluent API at
  ``.url``, BACKWARD; tests register what they need under subjects of their own). A test may
  ``stop()``/``start()`` it (same port; on Apicurio 3.x ``durable``: content survives, as in
  production); a stopped registry is started again after the test.
- ``kafka_topic_prefix``: a unique ``[a-z0-9-]`` string per test to build topic names from.

Fault tests may stop, kill or reconfigure the session servers: after each test that used them,
stopped servers are started again and PostgreSQL settings (including ALTER SYSTEM) are restored,
and ACLs left on the strict broker are deleted, so one test cannot poison the next. Helper
functions are in tests/support/helpers.py.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings

from cdc_outbox_dev.sandbox import pg_versions
from cdc_outbox_dev.sandbox.containers import BackendError, backend_from_env
from cdc_outbox_dev.sandbox.kafka import LocalKafka
from cdc_outbox_dev.sandbox.kafka_cluster import LocalKafkaCluster
from cdc_outbox_dev.sandbox.postgres import LocalPostgres
from cdc_outbox_dev.sandbox.redis import LocalRedis
from cdc_outbox_dev.sandbox.registry import LocalRegistry
from cdc_outbox_dev.sandbox.standby import make_standby
from tests.support.helpers import delete_all_acls, wait_until

# Property tests check rules, not speed: no per-example deadline and no "too slow" health check,
# which would make a result depend on the machine's load (CI shares its cores with PostgreSQL
# and Kafka). Examples stay random; a failure prints its seed and the shrunk example.
settings.register_profile("cdc-outbox", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("cdc-outbox")

logger = logging.getLogger("tests.conftest")

_pg_baseline: dict[int, dict[str, str]] = {}

#: Broker settings of ``kafka_strict_broker`` (measured on Kafka 4.1.1, docs/kafka-faults.md).
#: Every PLAINTEXT client is User:ANONYMOUS, and so is the broker itself on its CONTROLLER
#: listener, where registration and heartbeats need CLUSTER_ACTION on the cluster. With
#: ``allow.everyone.if.no.acl.found=false`` the broker never registers
#: (CLUSTER_AUTHORIZATION_FAILED), and ``super.users=User:ANONYMOUS`` would let the test clients
#: bypass every DENY; so neither is set, and tests put ACLs on topics only, never on the cluster.
#: Even a DENY WRITE on every topic (``*``) leaves the broker working, across restarts too.
STRICT_BROKER_SETTINGS = {
    "auto.create.topics.enable": "false",
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "allow.everyone.if.no.acl.found": "true",
}


def pytest_configure(config: pytest.Config) -> None:
    try:
        config.stash[_BACKEND] = backend_from_env(os.environ)
    except BackendError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        pg_versions.selected_major(os.environ)
    except pg_versions.VersionError as exc:  # one line, exit 2, before any server starts
        pytest.exit(str(exc), returncode=2)


def pytest_report_header(config: pytest.Config) -> str:
    major = pg_versions.selected_major(os.environ)
    chosen = f"{pg_versions.VERSION_ENV}={major}" if major else "the default binaries"
    return f"postgresql: {chosen}"


_BACKEND = pytest.StashKey[str]()


def _containers(request: pytest.FixtureRequest) -> bool:
    return request.config.stash[_BACKEND] == "testcontainers"


def _new_postgres(request: pytest.FixtureRequest) -> LocalPostgres:
    if _containers(request):
        from cdc_outbox_dev.sandbox.containers import ContainerPostgres

        pg: Any = ContainerPostgres()  # the same interface (duck-typed)
        return pg  # type: ignore[no-any-return]
    return LocalPostgres()


def _new_kafka(
    request: pytest.FixtureRequest, settings: dict[str, str] | None = None
) -> LocalKafka:
    if _containers(request):
        from cdc_outbox_dev.sandbox.containers import ContainerKafka

        kafka: Any = ContainerKafka(broker_settings=settings)
        return kafka  # type: ignore[no-any-return]
    return LocalKafka(broker_settings=settings)


@pytest.fixture(scope="session")
def pg_server(request: pytest.FixtureRequest) -> Iterator[LocalPostgres]:
    pg = _new_postgres(request)
    pg.start()
    _pg_baseline[id(pg)] = dict(pg.settings)
    try:
        yield pg
    finally:
        pg.close()


@pytest.fixture
def pg_primary_standby() -> Iterator[tuple[LocalPostgres, LocalPostgres]]:
    with LocalPostgres() as primary:
        standby = make_standby(primary, application_name="standby1", slot="standby1")
        try:
            yield primary, standby
        finally:
            standby.close()


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[LocalKafka]:
    kafka = _new_kafka(request)
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.close()


@pytest.fixture(scope="session")
def kafka_strict_broker(request: pytest.FixtureRequest) -> Iterator[LocalKafka]:
    """A broker where missing topics stay missing and ACLs are enforced (STRICT_BROKER_SETTINGS).

    Create topics with ``tests.support.helpers.create_topic``; cause authorization failures with
    ``deny_topic_writes`` / ``allow_topic_writes``.
    """
    kafka = _new_kafka(request, STRICT_BROKER_SETTINGS)
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.close()


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[LocalKafkaCluster]:
    cluster = LocalKafkaCluster(n=3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(autouse=True)
def _heal_kafka_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """Before and after a test using ``kafka_cluster``: every node runs, every partition is
    fully replicated (a node killed by one test must not make the next one's fault worse)."""
    if "kafka_cluster" not in request.fixturenames:
        yield
        return
    cluster: LocalKafkaCluster = request.getfixturevalue("kafka_cluster")
    _heal_cluster(cluster)
    yield
    _heal_cluster(cluster)


def _heal_cluster(cluster: LocalKafkaCluster) -> None:
    stopped = [i for i in cluster.nodes if i not in cluster.running_nodes()]
    if stopped:
        logger.warning("Kafka cluster nodes %s were left stopped; starting them again", stopped)
        cluster.start_nodes(stopped)
    cluster.wait_brokers(set(cluster.nodes))
    wait_until(cluster.fully_replicated, timeout=120, interval=0.2,
               message="Kafka cluster partitions not fully replicated")  # fmt: skip


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    redis = LocalRedis()
    redis.start()
    try:
        yield redis
    finally:
        redis.close()


@pytest.fixture
def redis_url(redis_server: LocalRedis) -> str:
    import redis

    redis_server.start()  # a test may have stopped it
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushdb()
    return redis_server.url


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[LocalRegistry]:
    registry = LocalRegistry(durable=True)
    registry.start()
    try:
        yield registry
    finally:
        registry.close()


@pytest.fixture(autouse=True)
def _heal_registry(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that stopped the session registry leaves it running again (empty)."""
    yield
    if "schema_registry" in request.fixturenames:
        registry = request.getfixturevalue("schema_registry")
        if not registry.running:
            logger.warning("session schema registry was left stopped; starting it again")
            registry.start()


@pytest.fixture
def pg_dsn(pg_server: LocalPostgres, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"t_{_slug(request.node.name, '_', 40)}_{uuid.uuid4().hex[:8]}"
    dsn = pg_server.create_database(name)
    yield dsn
    _heal_postgres(pg_server)
    pg_server.drop_database(name)


@pytest.fixture
def kafka_topic_prefix(request: pytest.FixtureRequest) -> str:
    return f"{_slug(request.node.name, '-', 60)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def _heal_session_servers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Before and after each test using a session server: make sure it runs as configured."""
    pg = request.getfixturevalue("pg_server") if "pg_server" in request.fixturenames else None
    kafka = (
        request.getfixturevalue("kafka_broker") if "kafka_broker" in request.fixturenames else None
    )
    strict = (
        request.getfixturevalue("kafka_strict_broker")
        if "kafka_strict_broker" in request.fixturenames
        else None
    )
    _heal(pg, kafka, strict)
    yield
    _heal(pg, kafka, strict)


def _heal(pg: LocalPostgres | None, kafka: LocalKafka | None, strict: LocalKafka | None) -> None:
    if pg is not None:
        _heal_postgres(pg)
    for broker in (kafka, strict):
        if broker is not None and not broker.is_running():
            logger.warning("session Kafka on %s was left stopped; starting it again", broker.port)
            broker.start()
        elif broker is not None:
            broker.wait_ready(60)
    if strict is not None and (left := delete_all_acls(strict.bootstrap_servers)):
        logger.warning("deleted %d ACLs left on the strict session Kafka: %s", len(left), left)


def _heal_postgres(pg: LocalPostgres) -> None:
    """Start ``pg`` if stopped; restore its baseline settings and undo ALTER SYSTEM."""
    baseline = _pg_baseline.get(id(pg), pg.settings)
    restart = pg.settings != baseline
    if restart:
        logger.warning("session PostgreSQL settings were changed; restoring them")
        pg.settings = dict(baseline)
    if not pg.is_running():
        logger.warning("session PostgreSQL was left stopped; starting it again")
        pg.start()
    if _alter_system_left(pg):
        logger.warning("undoing ALTER SYSTEM on session PostgreSQL")
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET ALL")
        restart = True
    if restart:
        pg.restart()


def _alter_system_left(pg: LocalPostgres) -> bool:
    """Does postgresql.auto.conf hold a setting? (A container's data directory is not local:
    ask the server.)"""
    if isinstance(pg, LocalPostgres):
        auto_conf = pg.datadir / "postgresql.auto.conf"
        lines = auto_conf.read_text().splitlines() if auto_conf.exists() else []
        return any(line.strip() and not line.lstrip().startswith("#") for line in lines)
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_file_settings WHERE sourcefile LIKE '%postgresql.auto.conf'"
        ).fetchone()
    return bool(row and row[0])


def _slug(text: str, sep: str, limit: int) -> str:
    return re.sub(r"[^a-z0-9]+", sep, text.lower())[:limit].strip(sep) or "test"
