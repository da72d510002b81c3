"""The test harness's container backend (for machines with Docker): PostgreSQL and Kafka in
testcontainers instead of local processes.

``CDC_OUTBOX_TEST_BACKEND=testcontainers`` makes tests/conftest.py use :class:`ContainerPostgres`
and :class:`ContainerKafka`; ``local`` (the default) keeps ``LocalPostgres``/``LocalKafka``.
:func:`backend_from_env` reads the choice; an unknown value is a :class:`BackendError` (one line).

The classes offer the interface the fixtures and tests use from the local servers: ``dsn``,
``dsn_for``, ``create_database``, ``drop_database``, ``start``/``stop``/``kill``/``crash``/
``restart``/``is_running``, ``settings`` (restart applies them), ``bootstrap_servers``,
``wait_ready``, ``close``. Host ports are fixed when the object is made, so DSNs survive a
restart; PostgreSQL's data lives in a named volume, so a restart with other settings (a new
container, since ``-c`` options are its command line) keeps every database. What a container
cannot offer (a local ``datadir``, a ``pid``) raises ``NotImplementedError`` naming it.

Nothing here talks to Docker until ``start()``: the ``*_container`` functions only build the
testcontainers objects (their constructor does create a Docker API client, which asks the
daemon for its API version; unit tests replace that client).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal

import psycopg
from psycopg.conninfo import make_conninfo
from testcontainers.community.kafka import KafkaContainer
from testcontainers.community.postgres import PostgresContainer

from cdc_outbox_dev.sandbox import _proc
from cdc_outbox_dev.sandbox._lifecycle import LocalServer
from cdc_outbox_dev.sandbox.kafka import api_versions_ok
from cdc_outbox_dev.sandbox.postgres import (
    SettingValue,
    _conf_value,
    create_database,
    drop_database,
)

logger = logging.getLogger(__name__)

Backend = Literal["local", "testcontainers"]
BACKENDS: tuple[Backend, ...] = ("local", "testcontainers")
BACKEND_ENV = "CDC_OUTBOX_TEST_BACKEND"
POSTGRES_IMAGE = "postgres:16"
KAFKA_IMAGE = "confluentinc/cp-kafka:7.9.0"
PG_USER = PG_PASSWORD = "postgres"
PG_DATA = "/var/lib/postgresql/data"
#: Server settings given as ``postgres -c key=value`` (what the local sandbox sets too).
PG_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "10",
    "max_wal_senders": "10",
    "max_slot_wal_keep_size": "256MB",
    "wal_sender_timeout": "60s",
    "max_connections": "100",
}
#: The image's pg_hba.conf lets "all" databases in with a password, but not replication.
_HBA_SCRIPT = b'echo "host replication all all scram-sha-256" >> "$PGDATA/pg_hba.conf"\n'


class BackendError(ValueError):
    """``CDC_OUTBOX_TEST_BACKEND`` names no backend."""


def backend_from_env(environ: Mapping[str, str]) -> Backend:
    """``local`` (unset or empty) or ``testcontainers``; anything else raises BackendError."""
    value = environ.get(BACKEND_ENV, "").strip().lower()
    if not value:
        return "local"
    for backend in BACKENDS:
        if value == backend:
            return backend
    raise BackendError(
        f"{BACKEND_ENV}={value!r} is not a test backend (use one of: {', '.join(BACKENDS)})"
    )


def _not_in_container(what: str) -> NotImplementedError:
    return NotImplementedError(f"{what} is not available with the testcontainers backend")


# -- PostgreSQL --------------------------------------------------------------------------------


def postgres_container(
    settings: Mapping[str, str], host_port: int, volume: str, image: str = POSTGRES_IMAGE
) -> PostgresContainer:
    """The (unstarted) PostgreSQL container: ``postgres -c k=v ...``, data in ``volume``."""
    command = ["postgres"]
    for key, value in settings.items():
        command += ["-c", f"{key}={value}"]
    container = PostgresContainer(
        image, username=PG_USER, password=PG_PASSWORD, dbname="postgres", driver=None
    )
    container.with_command(command)
    container.with_bind_ports(5432, host_port)
    container.with_volume_mapping(volume, PG_DATA, "rw")
    container.with_copy_into_container(
        _HBA_SCRIPT, "/docker-entrypoint-initdb.d/replication-hba.sh", 0o755
    )
    return container


class ContainerPostgres(LocalServer):
    """PostgreSQL in a container, used like ``LocalPostgres`` (see the module docstring)."""

    _owns_dir = True  # close() removes the container and its volume

    def __init__(self, settings: dict[str, str] | None = None, image: str = POSTGRES_IMAGE) -> None:
        self.settings: dict[str, str] = {**PG_SETTINGS, **(settings or {})}
        self.image = image
        self.port = _proc.free_port()
        self.volume = f"cdc-outbox-test-pg-{uuid.uuid4().hex[:12]}"
        self._container: PostgresContainer | None = None
        self._command_settings: dict[str, str] | None = None

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        return make_conninfo(
            "", host="127.0.0.1", port=self.port, user=PG_USER, password=PG_PASSWORD,
            dbname=dbname,
        )  # fmt: skip

    @property
    def datadir(self) -> Any:
        raise _not_in_container("ContainerPostgres.datadir (the data is in a Docker volume)")

    @property
    def pid(self) -> int | None:
        raise _not_in_container("ContainerPostgres.pid")

    def is_running(self) -> bool:
        if self._container is None:
            return False
        wrapped = self._container.get_wrapped_container()
        wrapped.reload()
        return bool(wrapped.status == "running")

    def start(self, timeout: float = 120.0) -> None:
        if self._container is not None and self._command_settings != self.settings:
            self._remove()  # -c options are the command line: a new container, same volume
        if self._container is None:
            self._command_settings = dict(self.settings)
            self._container = postgres_container(self.settings, self.port, self.volume, self.image)
            self._container.start()
        elif not self.is_running():
            self._container.get_wrapped_container().start()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            try:
                with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return True
            except psycopg.OperationalError:
                return False

        _proc.wait_for(ready, timeout, f"PostgreSQL container on port {self.port}")

    def stop(self, timeout: float = 60.0) -> None:
        """Fast shutdown (docker stop: SIGINT to the postmaster, per the image)."""
        if self.is_running():
            assert self._container is not None
            self._container.get_wrapped_container().stop(timeout=int(timeout))

    def kill(self) -> None:
        if self.is_running():
            assert self._container is not None
            self._container.get_wrapped_container().kill()

    def crash(self, timeout: float = 60.0) -> None:
        """Immediate shutdown (SIGQUIT to the postmaster); the next start recovers."""
        if self.is_running():
            assert self._container is not None
            wrapped = self._container.get_wrapped_container()
            wrapped.kill(signal="SIGQUIT")
            deadline = time.monotonic() + timeout
            while self.is_running() and time.monotonic() < deadline:
                time.sleep(0.2)

    def restart(self, **overrides: SettingValue) -> None:
        self.settings.update({k: _conf_value(v) for k, v in overrides.items()})
        self.stop()
        self.start()

    def destroy(self) -> None:
        container = self._container
        self._remove()
        if container is not None:
            container.get_docker_client().client.volumes.get(self.volume).remove(force=True)
        self._command_settings = None

    def create_database(self, name: str) -> str:
        create_database(self.dsn, name)
        return self.dsn_for(name)

    def drop_database(self, name: str, timeout: float = 30.0) -> None:
        drop_database(self.dsn, name, timeout)

    def _remove(self) -> None:
        if self._container is not None:
            self._container.get_wrapped_container().remove(force=True, v=False)
            self._container = None


# -- Kafka -------------------------------------------------------------------------------------


def kafka_container(
    broker_settings: Mapping[str, str], host_port: int, image: str = KAFKA_IMAGE
) -> KafkaContainer:
    """The (unstarted) single-node KRaft Kafka container; ``broker_settings`` (Kafka property
    names) become the image's ``KAFKA_*`` environment variables."""
    container = KafkaContainer(image).with_kraft()
    container.with_bind_ports(container.port, host_port)
    for key, value in broker_settings.items():
        container.with_env("KAFKA_" + key.upper().replace(".", "_"), value)
    return container


class ContainerKafka(LocalServer):
    """Kafka (KRaft) in a container, used like ``LocalKafka`` (see the module docstring)."""

    _owns_dir = True  # close() removes the container

    def __init__(
        self, broker_settings: Mapping[str, str] | None = None, image: str = KAFKA_IMAGE
    ) -> None:
        self.broker_settings = dict(broker_settings or {})
        self.port = _proc.free_port()
        self._container = kafka_container(self.broker_settings, self.port, image)
        self._started = False

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        raise _not_in_container("ContainerKafka.pid")

    def is_running(self) -> bool:
        if not self._started:
            return False
        wrapped = self._container.get_wrapped_container()
        wrapped.reload()
        return bool(wrapped.status == "running")

    def start(self, timeout: float = 120.0) -> None:
        if not self._started:
            self._container.start(timeout=int(timeout))
            self._started = True
        elif not self.is_running():
            self._container.get_wrapped_container().start()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60.0) -> None:
        _proc.wait_for(
            lambda: api_versions_ok("127.0.0.1", self.port),
            timeout,
            f"Kafka container on port {self.port}",
        )

    def stop(self, timeout: float = 60.0) -> None:
        if self.is_running():
            self._container.get_wrapped_container().stop(timeout=int(timeout))

    def kill(self) -> None:
        if self.is_running():
            self._container.get_wrapped_container().kill()

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        if self._started:
            self._container.stop()
            self._started = False
