"""The testcontainers backend without Docker: backend selection and container configuration.

testcontainers' constructors create a Docker API client that asks the daemon for its version
(docker.from_env), so the client is replaced here; nothing is started.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import testcontainers.core.container as tc_container

from cdc_outbox_dev.sandbox import containers
from cdc_outbox_dev.sandbox.containers import BackendError, backend_from_env


class _NoDocker:
    def __init__(self, **kwargs: object) -> None:
        pass


@pytest.fixture(autouse=True)
def _no_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tc_container, "DockerClient", _NoDocker)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "local"),
        ({"CDC_OUTBOX_TEST_BACKEND": ""}, "local"),
        ({"CDC_OUTBOX_TEST_BACKEND": "local"}, "local"),
        ({"CDC_OUTBOX_TEST_BACKEND": " TestContainers "}, "testcontainers"),
    ],
)
def test_backend_selection(env: dict[str, str], expected: str) -> None:
    assert backend_from_env(env) == expected


def test_unknown_backend_is_one_clear_line() -> None:
    with pytest.raises(BackendError) as info:
        backend_from_env({"CDC_OUTBOX_TEST_BACKEND": "docker"})
    message = str(info.value)
    assert "\n" not in message
    assert "CDC_OUTBOX_TEST_BACKEND='docker'" in message
    assert "local, testcontainers" in message


def test_pytest_refuses_an_unknown_backend_in_one_line() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--co",
         "tests/unit/test_lsn.py"],
        env={"CDC_OUTBOX_TEST_BACKEND": "nope", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 4, run.stdout + run.stderr
    errors = [line for line in run.stderr.splitlines() if "CDC_OUTBOX_TEST_BACKEND" in line]
    assert len(errors) == 1 and "is not a test backend" in errors[0]


def test_postgres_container_configuration() -> None:
    settings = {"wal_level": "logical", "max_replication_slots": "7", "max_wal_senders": "8"}
    pg = containers.postgres_container(settings, 15432, "vol-1")
    pg._configure()  # what start() applies: the POSTGRES_* variables
    assert pg.image.endswith(containers.POSTGRES_IMAGE)
    assert pg._command == [
        "postgres", "-c", "wal_level=logical", "-c", "max_replication_slots=7",
        "-c", "max_wal_senders=8",
    ]  # fmt: skip
    assert pg.ports == {"5432": 15432}
    assert pg.env["POSTGRES_USER"] == pg.env["POSTGRES_PASSWORD"] == "postgres"
    assert pg.env["POSTGRES_DB"] == "postgres"
    assert pg.volumes["vol-1"]["bind"] == containers.PG_DATA
    assert pg.volumes["vol-1"]["mode"] == "rw"
    (script, path, _mode), *_ = pg._transferable_specs
    assert path.startswith("/docker-entrypoint-initdb.d/") and b"replication" in script


def test_container_postgres_defaults_and_limits() -> None:
    pg = containers.ContainerPostgres(settings={"max_wal_senders": "12"})
    assert pg.settings["wal_level"] == "logical"
    assert pg.settings["max_wal_senders"] == "12"
    assert f"port={pg.port}" in pg.dsn and "dbname=postgres" in pg.dsn
    assert "dbname=t1" in pg.dsn_for("t1")
    assert not pg.is_running()
    with pytest.raises(NotImplementedError, match="datadir"):
        _ = pg.datadir


def test_kafka_container_configuration() -> None:
    kafka = containers.kafka_container({"auto.create.topics.enable": "false"}, 19092)
    kafka.configure()  # what start() applies: KRaft
    assert kafka.image.endswith(containers.KAFKA_IMAGE)
    assert kafka.kraft_enabled
    assert kafka.env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert kafka.env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert kafka.ports == {str(kafka.port): 19092}


def test_container_kafka_interface() -> None:
    kafka = containers.ContainerKafka({"allow.everyone.if.no.acl.found": "true"})
    assert kafka.bootstrap_servers == f"127.0.0.1:{kafka.port}"
    assert not kafka.is_running()
    with pytest.raises(NotImplementedError, match=r"ContainerKafka\.pid"):
        _ = kafka.pid
