"""The global options (--config, --dsn, --slot, --publication, --table, --schema,
--log-level) through the real CLI: accepted after the command too, for every command, and
the value after the command wins over the one before it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import run_cli

#: Every command of the CLI (sub-group commands by their full path).
COMMANDS = [
    ["init"], ["status"], ["drop"], ["run"], ["demo"], ["lag"], ["redrive"], ["cleanup"],
    ["sandbox", "up"], ["sandbox", "down"], ["sandbox", "status"],
]  # fmt: skip
GLOBAL_ARGS = [
    "--config", "x.toml", "--dsn", "host=h", "--slot", "s", "--publication", "p",
    "--table", "t", "--schema", "sc", "--log-level", "debug",
]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_accepts_the_global_options_after_it(command: list[str]) -> None:
    result = run_cli(*command, *GLOBAL_ARGS, "--help")
    assert result.returncode == 0, result.stderr
    assert "Global options (also before the command)" in result.stdout
    for flag in GLOBAL_ARGS[::2]:
        assert flag in result.stdout, flag


def dry_run(*args: str) -> dict[str, Any]:
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def sql_of(report: dict[str, Any]) -> str:
    return "\n".join(action["sql"] for action in report["actions"])


def test_dsn_after_the_command(pg_dsn: str) -> None:
    result = run_cli("status", "--dsn", pg_dsn, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["slot"] is None
    assert run_cli("status", "--json").returncode == 2  # without it: dsn is required


def test_the_value_after_the_command_wins(pg_dsn: str, tmp_path: Path) -> None:
    init = ("init", "--dry-run", "--create-table", "--json")
    before = dry_run("--dsn", pg_dsn, "--slot", "slot_before", "--table", "tbl_before", *init)
    assert "slot_before" in sql_of(before) and "tbl_before" in sql_of(before)
    both = dry_run(
        "--slot", "slot_before", "--publication", "pub_before", "--schema", "public",
        *init,
        "--dsn", pg_dsn, "--slot", "slot_after", "--publication", "pub_after",
    )  # fmt: skip
    assert "slot_after" in sql_of(both) and "pub_after" in sql_of(both)
    assert "slot_before" not in sql_of(both) and "pub_before" not in sql_of(both)

    # --config after the command (and the flag still beats the file)
    toml = tmp_path / "relay.toml"
    toml.write_text(f'dsn = "{pg_dsn}"\nslot_name = "slot_toml"\noutbox_table = "tbl_toml"\n')
    from_file = dry_run(*init, "--config", str(toml))
    assert "slot_toml" in sql_of(from_file) and "tbl_toml" in sql_of(from_file)
    flag_wins = dry_run("--config", "missing.toml", *init, "--config", str(toml), "--slot", "s2")
    assert "s2" in sql_of(flag_wins) and "slot_toml" not in sql_of(flag_wins)


def test_log_level_after_the_command_is_applied() -> None:
    result = run_cli("status", "--dsn", "host=127.0.0.1", "--log-level", "chatty")
    assert result.returncode == 2
    assert result.stderr.startswith("cdc-outbox: error: config: log_level 'chatty' must be")
    nowhere = "host=127.0.0.1 port=1 connect_timeout=2"
    replaced = run_cli("--log-level", "chatty", "status", "--log-level", "info", "--dsn", nowhere)
    assert replaced.returncode == 1, replaced.stderr  # got as far as connecting: level valid
    assert "cannot connect to PostgreSQL" in replaced.stderr


def test_a_global_option_without_its_value_is_a_usage_error() -> None:
    result = run_cli("status", "--dsn")
    assert result.returncode == 2
    assert "--dsn" in result.stderr and "requires an argument" in result.stderr
