"""``run`` ends at once, with one line naming the object and the fix and a distinct exit code,
on errors that cannot heal (issue 27, item 1); transient ones are retried.

Every case runs the real CLI in a child process against the real PostgreSQL; ``run_cli``'s
timeout bounds the wait (a relay stuck retrying fails the test instead of hanging it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.helpers import run_cli

#: No metrics endpoint (the default port may be taken on a shared machine).
NO_METRICS = {"CDC_OUTBOX_METRICS_PORT": "0"}
PREFIX = "cdc-outbox: error: "


def one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The single error line of a run that ended with ``code``; nothing retried."""
    lines = [line for line in result.stderr.splitlines() if line.startswith(PREFIX)]
    assert result.returncode == code, result.stderr[-3000:]
    assert len(lines) == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "retrying" not in result.stderr and "relaying by polling" not in result.stderr
    return lines[0].removeprefix(PREFIX)


def sql_exec(dsn: str, statement: str | sql.Composable) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


def test_missing_columns_end_run_in_auto_mode_without_falling_back(pg_dsn: str) -> None:
    sql_exec(pg_dsn, "CREATE TABLE badbox (id uuid PRIMARY KEY, payload jsonb)")
    args = ("--table", "badbox", "--slot", "s_bad", "--publication", "p_bad", "run")
    line = one_error_line(run_cli(*args, dsn=pg_dsn, **NO_METRICS), 4)
    assert line.startswith("schema: table public.badbox: missing column(s): aggregate_type"), line
    assert "fix:" in line


def test_missing_polling_columns_end_run_in_polling_mode(pg_dsn: str) -> None:
    sql_exec(
        pg_dsn,
        "CREATE TABLE cdconly (id uuid PRIMARY KEY, aggregate_type text, aggregate_id text,"
        " event_type text, payload jsonb, headers jsonb)",
    )
    result = run_cli("--table", "cdconly", "run", "--mode", "polling", dsn=pg_dsn, **NO_METRICS)
    line = one_error_line(result, 4)
    assert line.startswith("schema: table public.cdconly lacks the polling column(s) status,"), line


def test_missing_table_ends_run_in_cdc_mode(pg_dsn: str) -> None:
    result = run_cli("--table", "nosuch", "run", "--mode", "cdc", dsn=pg_dsn, **NO_METRICS)
    line = one_error_line(result, 4)
    assert line.startswith("schema: table public.nosuch does not exist (fix: "), line
    assert "cdc-outbox init --create-table" in line


@pytest.fixture
def weak_role(pg_dsn: str) -> Iterator[str]:
    """A login role with no privileges on anything; the DSN of ``pg_dsn`` as that role."""
    role = f"weak_{uuid.uuid4().hex[:8]}"
    sql_exec(pg_dsn, sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'right'").format(sql.Identifier(role)))
    sql_exec(pg_dsn, sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role)))
    run_cli("init", "--create-table", dsn=pg_dsn).check_returncode()
    yield make_conninfo(pg_dsn, user=role, password="right")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.parametrize("mode", ["polling", "cdc"])
def test_missing_table_privileges_end_run(weak_role: str, mode: str) -> None:
    result = run_cli("--slot", "s_weak", "run", "--mode", mode, dsn=weak_role, **NO_METRICS)
    line = one_error_line(result, 5)
    role = conninfo_to_dict(weak_role)["user"]
    assert line == (
        f"privileges: role '{role}' lacks SELECT, UPDATE on public.outbox"
        f' (fix: GRANT SELECT, UPDATE ON public.outbox TO "{role}")'
    )


def test_missing_replication_privilege_ends_run_in_cdc_mode(pg_dsn: str, weak_role: str) -> None:
    role = conninfo_to_dict(weak_role)["user"]
    sql_exec(pg_dsn, sql.SQL("GRANT SELECT, UPDATE ON outbox TO {}").format(sql.Identifier(role)))
    line = one_error_line(run_cli("run", "--mode", "cdc", dsn=weak_role, **NO_METRICS), 5)
    assert line == (
        f"privileges: role '{role}' lacks REPLICATION (fix: as a superuser:"
        f' ALTER ROLE "{role}" REPLICATION)'
    )


@pytest.fixture
def password_required(pg_dsn: str, weak_role: str) -> Iterator[str]:
    """``weak_role`` must log in with its password (scram), all other roles as before: one
    pg_hba.conf line in front, written and reloaded through SQL (works for any backend)."""
    role = conninfo_to_dict(weak_role)["user"]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('hba_file')").fetchone()
        assert row is not None
        hba = str(row[0])
        original = conn.execute("SELECT pg_read_file(%s)", (hba,)).fetchone()
        assert original is not None
        _write_server_file(conn, hba, f"host all {role} all scram-sha-256\n{original[0]}")
        try:
            yield weak_role
        finally:
            _write_server_file(conn, hba, str(original[0]))


def _write_server_file(conn: psycopg.Connection[tuple[object, ...]], path: str, text: str) -> None:
    lines = text.rstrip("\n").split("\n")
    assert not any("\\" in line or "\t" in line for line in lines)  # COPY text would escape
    values = sql.SQL(", ").join(sql.SQL("({})").format(sql.Literal(line)) for line in lines)
    conn.execute(
        sql.SQL("COPY (SELECT l FROM (VALUES {}) v(l)) TO {}").format(values, sql.Literal(path))
    )
    conn.execute("SELECT pg_reload_conf()")


def test_wrong_password_ends_run(password_required: str) -> None:
    dsn = make_conninfo(password_required, password="wrong")
    with pytest.raises(psycopg.OperationalError):  # the fault is real
        psycopg.connect(dsn).close()
    line = one_error_line(run_cli("run", dsn=dsn, **NO_METRICS), 6)
    role = conninfo_to_dict(dsn)["user"]
    assert line.startswith("authentication: PostgreSQL refused the login ("), line
    assert f'password authentication failed for user "{role}"' in line
    assert "wrong" not in line
    assert line.endswith("(fix: the user and password in dsn / CDC_OUTBOX_DSN, or pg_hba.conf)")


def test_unknown_role_ends_run(pg_dsn: str) -> None:
    dsn = make_conninfo(pg_dsn, user="nobody_" + uuid.uuid4().hex[:8])
    line = one_error_line(run_cli("run", dsn=dsn, **NO_METRICS), 6)
    assert 'role "nobody_' in line and "does not exist" in line, line


def test_invalid_kafka_setting_is_one_config_line() -> None:
    env = {"CDC_OUTBOX_KAFKA__CONFIG__LINGER.MS": "abc", **NO_METRICS}
    result = run_cli("run", "--mode", "polling", dsn="host=127.0.0.1 port=1", **env)
    line = one_error_line(result, 2)
    assert line.startswith("config: kafka.config 'linger.ms' is refused by librdkafka: "), line
    result = run_cli(
        "run",
        dsn="host=127.0.0.1 port=1",
        CDC_OUTBOX_KAFKA__CONFIG__NOT__A__SETTING="1",
        CDC_OUTBOX_METRICS_PORT="9",  # not started: the check comes first
    )
    line = one_error_line(result, 2)
    assert "kafka.config 'not.a.setting'" in line and "No such configuration property" in line


def test_database_down_is_retried_with_a_throttled_line(pg_server, pg_dsn: str) -> None:
    """Connection refused heals once the server is back: ``run`` waits (one WARNING line, not
    one per attempt) and then goes on (here: to the missing outbox table, exit 4)."""
    pg_server.stop()
    try:
        with subprocess.Popen(
            [sys.executable, "-m", "cdc_outbox", "--log-level", "DEBUG", "run"],
            env=_cli_env(pg_dsn),
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            assert proc.stderr is not None
            seen: list[str] = []
            for line in proc.stderr:
                seen.append(line)
                if "PostgreSQL attempt 3 failed" in line:
                    break
            assert proc.poll() is None, "".join(seen)
            pg_server.start()
            rest = proc.stderr.read()
            code = proc.wait(120)
    finally:
        if not pg_server.is_running():
            pg_server.start()
    text = "".join(seen) + rest
    warnings = [line for line in text.splitlines() if "PostgreSQL not usable yet" in line]
    assert len(warnings) == 1, text
    assert "Connection refused" in warnings[0] or "could not connect" in warnings[0], text
    assert code == 4, text
    assert "PostgreSQL reachable after" in text


def _cli_env(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_OUTBOX_")}
    return {**env, "CDC_OUTBOX_DSN": dsn, **NO_METRICS}
