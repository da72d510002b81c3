"""The wheel is the runtime only: relay and admin CLI, no test/demo harness (cdc_outbox_dev).

Builds the wheel from a copy of the working tree, installs it into a fresh venv (dependencies
from PyPI or pip's cache; built once per session, about a minute) and drives that venv's
``cdc-outbox`` against the session PostgreSQL and Kafka. Every command runs outside the
checkout, so nothing can be imported from it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import psycopg
import pytest

from cdc_outbox import __version__
from cdc_outbox_dev.readback import count_records
from cdc_outbox_dev.sandbox.kafka import LocalKafka
from tests.support.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]
#: Working-tree entries that are not source: never copied into the build tree.
_NOT_SOURCE = {".git", ".venv", "build", "dist", "test-artifacts", ".cache"}
_HARNESS_NAMES = ("cdc_outbox_dev", "sandbox", "workload", "demo")


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything that could reach the checkout or its venv."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("CDC_OUTBOX_")}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def _run(args: list[str | Path], cwd: Path, timeout: float, **env: str) -> str:
    result = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=_clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stderr[-3000:]}"
    return result.stdout


def _ignore(directory: str, names: list[str]) -> set[str]:
    ignored = {n for n in names if n == "__pycache__" or n.endswith((".egg-info", "_cache"))}
    if Path(directory) == REPO:
        ignored |= _NOT_SOURCE & set(names)
    return ignored


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel --no-deps`` of a copy of the working tree (no stale ``build/`` leftovers)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    shutil.copytree(REPO, source, ignore=_ignore, symlinks=True)
    wheelhouse = root / "wheelhouse"
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheelhouse, source],
        cwd=root,
        timeout=300,
    )
    (built,) = wheelhouse.glob("cdc_outbox-*.whl")
    return built


@pytest.fixture(scope="session")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only the wheel and its dependencies installed."""
    path = tmp_path_factory.mktemp("wheel-venv") / "venv"
    _run([sys.executable, "-m", "venv", path], cwd=path.parent, timeout=120)
    _run(
        [path / "bin" / "python", "-m", "pip", "install", "-q", wheel], cwd=path.parent, timeout=600
    )
    return path


def test_wheel_holds_the_runtime_package_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = f"cdc_outbox-{__version__}.dist-info/"
    assert {n.split("/", 1)[0] + "/" for n in names} == {"cdc_outbox/", dist_info}
    leaked = [n for n in names if any(h in n.lower() for h in _HARNESS_NAMES)]
    assert not leaked, f"harness files in the wheel: {leaked}"
    needed_files = (
        "cli/__init__.py",
        "service/relay_service.py",
        "config/settings.py",
        "writer/__init__.py",
        "py.typed",
        "monitoring/static/dashboard.js",
    )
    for needed in needed_files:
        assert f"cdc_outbox/{needed}" in names
    # setup.py's mypyc build of the per-event decode (gcc is there: scripts/bootstrap.sh)
    compiled = [n for n in names if n.startswith("cdc_outbox/pgwire/insert_row")]
    assert any(n.endswith(".so") for n in compiled), compiled
    assert "cdc_outbox/pgwire/insert_row.py" in compiled  # the source ships too
    top_level = zipfile.ZipFile(wheel).read(dist_info + "top_level.txt").decode().split()
    assert top_level == ["cdc_outbox"]


def test_installed_relay_runs_the_compiled_decode(venv: Path, tmp_path: Path) -> None:
    """The wheel's extension is what the installed relay decodes with (not the source)."""
    check = (
        "from cdc_outbox.pgwire import insert_row, pgoutput\n"
        "print(insert_row.COMPILED, pgoutput.decode_insert.__name__)"
    )
    out = _run([venv / "bin" / "python", "-c", check], tmp_path, 60)
    assert out.split() == ["True", "_compiled_insert"]


def test_installed_cli_has_no_dev_commands(venv: Path, tmp_path: Path) -> None:
    cli = venv / "bin" / "cdc-outbox"
    usage = _run([cli, "--help"], cwd=tmp_path, timeout=60)
    assert "run" in usage and "init" in usage
    assert "sandbox" not in usage.lower() and "demo" not in usage.lower()
    for args in (["demo"], ["sandbox", "up"]):
        result = subprocess.run(
            [cli, *args], cwd=tmp_path, env=_clean_env(), capture_output=True, timeout=60
        )
        assert result.returncode == 2, (args, result.stderr)


def test_installed_cli_prints_the_ddl_its_errors_point_to(venv: Path, tmp_path: Path) -> None:
    """The preflight error for a missing table names `cdc-outbox sql outbox`; sql/ is not in
    the wheel, so that command is how an installed relay shows the DDL."""
    ddl = _run([venv / "bin" / "cdc-outbox", "--table", "events", "sql", "outbox"], tmp_path, 60)
    assert ddl.startswith('CREATE TABLE IF NOT EXISTS "public"."events" (')
    assert "cdc_outbox_relay_state" in ddl
    roles = _run([venv / "bin" / "cdc-outbox", "sql", "roles"], tmp_path, 60)
    assert roles.startswith('CREATE ROLE "cdc_outbox" WITH LOGIN REPLICATION;')


def test_writer_only_install_needs_psycopg_only(
    wheel: Path, tmp_path_factory: pytest.TempPathFactory, pg_dsn: str
) -> None:
    """The documented writer-only install (docs/consumers.md): the wheel without its
    dependencies, plus psycopg. write_event works there; no relay dependency is present."""
    path = tmp_path_factory.mktemp("writer-venv") / "venv"
    _run([sys.executable, "-m", "venv", path], cwd=path.parent, timeout=120)
    pip = [path / "bin" / "python", "-m", "pip", "install", "-q"]
    _run([*pip, "--no-deps", wheel], cwd=path.parent, timeout=300)
    _run([*pip, "psycopg[binary]>=3.2,<4"], cwd=path.parent, timeout=600)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregate_type text, aggregate_id text,"
            " event_type text, payload jsonb, headers jsonb)"
        )
    check = (
        "import decimal, importlib.util, sys, psycopg\n"
        "from cdc_outbox.writer import write_event\n"
        "assert write_event.__module__ == 'cdc_outbox.writer'\n"
        "for name in ('confluent_kafka', 'fastavro', 'pydantic', 'typer', 'msgspec'):\n"
        "    assert importlib.util.find_spec(name) is None, name\n"
        "with psycopg.connect(sys.argv[1]) as conn:\n"
        "    write_event(conn, 'order', 42, 'OrderPaid', {'t': decimal.Decimal('1.5')})\n"
    )
    _run(
        [path / "bin" / "python", "-c", check, pg_dsn], cwd=tmp_path_factory.mktemp("w"), timeout=60
    )
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT aggregate_id, payload FROM outbox").fetchone()
    assert row == ("42", {"t": "1.5"})
    installed = _run([path / "bin" / "python", "-m", "pip", "list", "--format=freeze"],
                     cwd=path.parent, timeout=120)  # fmt: skip
    print("writer-only install:", installed.split())


def test_runtime_imports_no_harness(venv: Path, tmp_path: Path) -> None:
    check = (
        "import cdc_outbox, cdc_outbox.cli, cdc_outbox.service.relay_service, importlib.util, sys\n"
        "assert cdc_outbox.__file__.startswith(sys.prefix), cdc_outbox.__file__\n"
        "assert importlib.util.find_spec('cdc_outbox_dev') is None\n"
        "assert not any(m.startswith(('cdc_outbox.sandbox', 'cdc_outbox_dev'))"
        " for m in sys.modules)\n"
    )
    _run([venv / "bin" / "python", "-c", check], cwd=tmp_path, timeout=60)


def test_installed_cli_inits_and_runs_the_relay(
    venv: Path, tmp_path: Path, pg_dsn: str, kafka_broker: LocalKafka, kafka_topic_prefix: str
) -> None:
    cli = venv / "bin" / "cdc-outbox"
    slot = f"wheel_{uuid.uuid4().hex[:12]}"
    env = {
        "CDC_OUTBOX_DSN": pg_dsn,
        "CDC_OUTBOX_SLOT_NAME": slot,
        "CDC_OUTBOX_MODE": "cdc",
        "CDC_OUTBOX_METRICS_PORT": "0",
        "CDC_OUTBOX_TOPIC_TEMPLATE": kafka_topic_prefix + ".event.{aggregate_type}",
        "CDC_OUTBOX_DEAD_LETTER_TOPIC": kafka_topic_prefix + ".dlq",
        "CDC_OUTBOX_KAFKA__BOOTSTRAP_SERVERS": kafka_broker.bootstrap_servers,
    }
    _run([cli, "init", "--create-table"], cwd=tmp_path, timeout=120, **env)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)"
            " VALUES ('order', 'o-1', 'OrderPlaced', '{\"total\": 1}')"
        )

    log_path = tmp_path / "relay.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [cli, "run"], cwd=tmp_path, env=_clean_env(**env), stdout=log, stderr=log
        )
    try:

        def leader() -> str | None:
            assert proc.poll() is None, f"relay exited {proc.returncode}: {log_path.read_text()}"
            with psycopg.connect(pg_dsn) as conn:
                row = conn.execute(
                    "SELECT leader_id FROM cdc_outbox_relay_state WHERE slot_name = %s", (slot,)
                ).fetchone()
            return None if row is None else row[0]

        wait_until(leader, timeout=60, interval=0.25, message=lambda: log_path.read_text())
        wait_until(
            lambda: count_records(kafka_broker.bootstrap_servers, kafka_topic_prefix) == 1,
            timeout=60,
            interval=0.5,
            message="the event written before the start did not reach Kafka",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
