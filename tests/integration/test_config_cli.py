"""Configuration through the real CLI: bad input exits 2 with one line; secrets never shown."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.support.helpers import run_cli

DSN_PASSWORD = "pg-Secret-4711"
KAFKA_PASSWORD = "kafka-Secret-0815"
JAAS_SECRET = "jaas-Secret-1234"


def assert_config_error(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0] == f"cdc-outbox: error: {expected}"


def test_unknown_toml_key(tmp_path: Path) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text('dsn = "host=127.0.0.1"\nslott_name = "x"\n')
    result = run_cli("--config", str(toml), "status")
    assert_config_error(result, f"config: unknown key 'slott_name' (in {toml})")
    from_env = run_cli("status", CDC_OUTBOX_CONFIG=str(toml))
    assert_config_error(from_env, f"config: unknown key 'slott_name' (in {toml})")


def test_unknown_env_setting() -> None:
    result = run_cli("status", CDC_OUTBOX_DSN="host=127.0.0.1", CDC_OUTBOX_SLOTT="x")
    assert_config_error(result, "config: unknown setting CDC_OUTBOX_SLOTT")


def test_missing_dsn() -> None:
    assert_config_error(run_cli("init"), "config: dsn is required (set CDC_OUTBOX_DSN or --dsn)")


def test_malformed_dsn_hides_password() -> None:
    dsn = f"postgresql://app:{DSN_PASSWORD}@[::1/db"
    result = run_cli("--dsn", dsn, "status")
    assert result.returncode == 2
    assert result.stderr.startswith("cdc-outbox: error: config: dsn is malformed: ")
    assert DSN_PASSWORD not in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_invalid_slot_name_flag_and_env() -> None:
    expected = (
        "config: slot_name 'x;drop table' is not a valid identifier "
        "(lowercase letters, digits, underscore; max 63)"
    )
    assert_config_error(
        run_cli("--dsn", "host=127.0.0.1", "--slot", "x;drop table", "status"), expected
    )
    assert_config_error(
        run_cli("init", CDC_OUTBOX_DSN="host=127.0.0.1", CDC_OUTBOX_SLOT_NAME="x;drop table"),
        expected,
    )


def test_negative_interval() -> None:
    result = run_cli("status", CDC_OUTBOX_DSN="host=127.0.0.1", CDC_OUTBOX_STATUS_INTERVAL_S="-1")
    assert_config_error(result, "config: status_interval_s must be > 0")


def test_drop_requires_yes() -> None:
    result = run_cli("--dsn", "host=127.0.0.1", "drop")
    assert_config_error(
        result, "drop: pass --yes to drop slot 'cdc_outbox' and publication 'cdc_outbox_pub'"
    )


def test_usage_error_exit_2() -> None:
    result = run_cli("init", "--no-such-flag")
    assert result.returncode == 2
    assert "No such option" in result.stderr


def test_help_lists_commands_and_global_options() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for word in (
        "init",
        "status",
        "drop",
        "--config",
        "--dsn",
        "--slot",
        "--publication",
        "--table",
        "--schema",
        "--log-level",
    ):
        assert word in result.stdout
    init_help = run_cli("init", "--help")
    assert "--create-table" in init_help.stdout and "--dry-run" in init_help.stdout


def test_precedence_flag_env_toml(tmp_path: Path, pg_dsn: str) -> None:
    """The slot name init would create shows which source won."""
    toml = tmp_path / "c.toml"
    toml.write_text(f'dsn = "{pg_dsn}"\nslot_name = "from_toml"\npublication_name = "p_toml"\n')

    def planned_slot(*args: str, **env: str) -> str:
        result = run_cli(
            "--config", str(toml), *args, "init", "--create-table", "--dry-run", "--json", **env
        )
        assert result.returncode == 0, result.stderr
        [action] = [a for a in json.loads(result.stdout)["actions"] if a["name"] == "create_slot"]
        return str(action["sql"]).split("'")[1]

    assert planned_slot() == "from_toml"
    assert planned_slot(CDC_OUTBOX_SLOT_NAME="from_env") == "from_env"
    assert planned_slot("--slot", "from_flag", CDC_OUTBOX_SLOT_NAME="from_env") == "from_flag"


@pytest.fixture
def secret_env(tmp_path: Path, pg_dsn: str) -> Iterator[dict[str, str]]:
    """DSN with a password (trust auth ignores it) and Kafka secrets via env and TOML."""
    toml = tmp_path / "secrets.toml"
    toml.write_text(f'[kafka.config]\n"sasl.jaas.config" = "{JAAS_SECRET}"\n')
    slot = f"t_slot_{uuid.uuid4().hex[:10]}"
    yield {
        "CDC_OUTBOX_DSN": f"{pg_dsn} password={DSN_PASSWORD}",
        "CDC_OUTBOX_KAFKA__CONFIG__SASL.PASSWORD": KAFKA_PASSWORD,
        "CDC_OUTBOX_CONFIG": str(toml),
        "CDC_OUTBOX_SLOT_NAME": slot,
    }
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (slot,),
        )


def test_secrets_never_in_output_or_logs(secret_env: dict[str, str]) -> None:
    unreachable = make_conninfo(secret_env["CDC_OUTBOX_DSN"], port=1)
    runs = [
        run_cli("--log-level", "DEBUG", "init", **secret_env),  # exit 3: no table
        run_cli("--log-level", "DEBUG", "init", "--create-table", **secret_env),
        run_cli("--log-level", "DEBUG", "status", **secret_env),
        run_cli("status", "--json", **secret_env),
        run_cli("--log-level", "DEBUG", "drop", "--yes", **secret_env),
        run_cli("status", **{**secret_env, "CDC_OUTBOX_DSN": unreachable}),
    ]
    assert [r.returncode for r in runs] == [3, 0, 0, 0, 0, 1]
    assert "init: create_slot" in runs[1].stderr or "created slot" in runs[1].stderr  # logs ran
    assert "password=***" in runs[2].stdout  # the DSN is shown, masked
    for result in runs:
        for secret in (DSN_PASSWORD, KAFKA_PASSWORD, JAAS_SECRET):
            assert secret not in result.stdout
            assert secret not in result.stderr
