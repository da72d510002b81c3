"""Shared fixtures: a real PostgreSQL and a real Kafka from cdc_outbox.sandbox.

- ``pg_server`` (session): running ``LocalPostgres`` (wal_level=logical, trust on 127.0.0.1).
- ``pg_dsn``: a fresh empty database per test, dropped afterwards (slots and sessions first).
- ``kafka_broker`` (session): running single-node KRaft ``LocalKafka``.
- ``kafka_topic_prefix``: a unique ``[a-z0-9-]`` string per test to build topic names from.

Fault tests may stop, kill or reconfigure the session servers: after each test that used them,
stopped servers are started again and PostgreSQL settings (including ALTER SYSTEM) are restored,
so one test cannot poison the next. Helper functions are in tests/helpers.py.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from cdc_outbox.sandbox.kafka import LocalKafka
from cdc_outbox.sandbox.postgres import LocalPostgres

logger = logging.getLogger("tests.conftest")

_pg_baseline: dict[int, dict[str, str]] = {}


@pytest.fixture(scope="session")
def pg_server() -> Iterator[LocalPostgres]:
    pg = LocalPostgres()
    pg.start()
    _pg_baseline[id(pg)] = dict(pg.settings)
    try:
        yield pg
    finally:
        pg.close()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[LocalKafka]:
    kafka = LocalKafka()
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.close()


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
    _heal(pg, kafka)
    yield
    _heal(pg, kafka)


def _heal(pg: LocalPostgres | None, kafka: LocalKafka | None) -> None:
    if pg is not None:
        _heal_postgres(pg)
    if kafka is not None and not kafka.is_running():
        logger.warning("session Kafka was left stopped; starting it again")
        kafka.start()
    elif kafka is not None:
        kafka.wait_ready(60)


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
    auto_conf = pg.datadir / "postgresql.auto.conf"
    lines = auto_conf.read_text().splitlines() if auto_conf.exists() else []
    if any(line.strip() and not line.lstrip().startswith("#") for line in lines):
        logger.warning("undoing ALTER SYSTEM on session PostgreSQL")
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET ALL")
        restart = True
    if restart:
        pg.restart()


def _slug(text: str, sep: str, limit: int) -> str:
    return re.sub(r"[^a-z0-9]+", sep, text.lower())[:limit].strip(sep) or "test"
