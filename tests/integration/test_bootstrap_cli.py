"""`cdc-outbox init/status/drop` through the real CLI against real PostgreSQL servers."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import pq
from psycopg.conninfo import make_conninfo
from psycopg.pq.abc import PGconn as PGconnType

from cdc_outbox_dev.sandbox.postgres import LocalPostgres
from tests.support.catalog import flags, publication_row, query, slot_row
from tests.support.helpers import run_cli, wait_until

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def names(pg_dsn: str) -> Iterator[dict[str, str]]:
    """Unique slot/publication names (slots are cluster-wide); slot dropped afterwards."""
    tag = uuid.uuid4().hex[:10]
    got = {"slot": f"t_slot_{tag}", "publication": f"t_pub_{tag}"}
    yield got
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
            " WHERE slot_name = %s AND active",
            (got["slot"],),
        )
        wait_until(
            lambda: (
                not conn.execute(
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active",
                    (got["slot"],),
                ).fetchall()
            ),
            timeout=30,
        )
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (got["slot"],),
        )


def table_exists(dsn: str) -> bool:
    return query(dsn, "SELECT to_regclass('public.outbox') IS NOT NULL")[0][0] is True


def test_init_status_drop_round_trip(pg_dsn: str, names: dict[str, str]) -> None:
    init = run_cli(*flags(names), "init", "--create-table", dsn=pg_dsn)
    assert init.returncode == 0, init.stderr
    assert (
        "done: create_table, create_index, create_index, create_index, \ncreate_publication,"
        " create_state_table, create_slot" in init.stdout
    )
    assert table_exists(pg_dsn)
    [(_, ins, upd, dele, trunc, tables)] = publication_row(pg_dsn, names["publication"])
    assert (ins, upd, dele, trunc, tables) == (True, False, False, False, ["public.outbox"])
    [slot] = slot_row(pg_dsn, names["slot"])
    assert slot[1] == "pgoutput"

    query(
        pg_dsn,
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)"
        " VALUES ('order', '1', 'Created', '{}'), ('order', '2', 'Created', '{}')",
    )
    status = run_cli(*flags(names), "status", "--json", dsn=pg_dsn)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["slot"]["name"] == names["slot"]
    assert report["slot"]["active"] is False
    assert report["slot"]["confirmed_flush_lsn"] == slot[4]
    assert report["slot"]["lag_bytes"] > 0  # the two inserts are behind the slot
    assert report["slot"]["retained_wal_bytes"] >= report["slot"]["lag_bytes"]
    assert report["slot"]["wal_status"] == "reserved"
    assert report["publication"]["tables"] == ["public.outbox"]
    assert report["publication"]["operations"] == ["insert"]
    assert report["pending_rows"] == 2
    assert all(check["ok"] for check in report["checks"])

    human = run_cli(*flags(names), "status", dsn=pg_dsn)
    assert human.returncode == 0
    assert names["slot"] in human.stdout and "inactive" in human.stdout

    drop = run_cli(*flags(names), "drop", "--yes", dsn=pg_dsn)
    assert drop.returncode == 0, drop.stderr
    assert slot_row(pg_dsn, names["slot"]) == []
    assert publication_row(pg_dsn, names["publication"]) == []
    assert table_exists(pg_dsn)  # the table (and its rows) are kept
    assert query(pg_dsn, "SELECT count(*) FROM outbox") == [(2,)]

    again = run_cli(*flags(names), "drop", "--yes", dsn=pg_dsn)
    assert again.returncode == 0
    assert "nothing to do" in again.stdout


def test_init_twice_is_idempotent(pg_dsn: str, names: dict[str, str]) -> None:
    first = run_cli(*flags(names), "init", "--create-table", dsn=pg_dsn)
    assert first.returncode == 0, first.stderr
    slot_before = slot_row(pg_dsn, names["slot"])
    pub_before = publication_row(pg_dsn, names["publication"])

    second = run_cli(*flags(names), "init", "--create-table", dsn=pg_dsn)
    assert second.returncode == 0, second.stderr
    assert "nothing to do" in second.stdout
    as_json = run_cli(*flags(names), "init", "--json", dsn=pg_dsn)
    assert json.loads(as_json.stdout)["actions"] == []

    assert slot_row(pg_dsn, names["slot"]) == slot_before
    assert publication_row(pg_dsn, names["publication"]) == pub_before


def test_dry_run_changes_nothing(pg_dsn: str, names: dict[str, str]) -> None:
    result = run_cli(*flags(names), "init", "--create-table", "--dry-run", dsn=pg_dsn)
    assert result.returncode == 0, result.stderr
    assert 'CREATE TABLE IF NOT EXISTS "public"."outbox"' in result.stdout
    assert (
        f'CREATE PUBLICATION "{names["publication"]}" FOR TABLE "public"."outbox" '
        "WITH (publish = 'insert', publish_via_partition_root = true);" in result.stdout
    )
    assert f"pg_create_logical_replication_slot('{names['slot']}', 'pgoutput')" in result.stdout
    assert "nothing was changed" in result.stdout
    assert not table_exists(pg_dsn)
    assert publication_row(pg_dsn, names["publication"]) == []
    assert slot_row(pg_dsn, names["slot"]) == []


def test_existing_table_without_create_table(pg_dsn: str, names: dict[str, str]) -> None:
    missing = run_cli(*flags(names), "init", dsn=pg_dsn)
    assert missing.returncode == 3
    assert "outbox_table" in missing.stderr
    query(pg_dsn, (REPO / "sql" / "outbox.sql").read_text())
    ok = run_cli(*flags(names), "init", dsn=pg_dsn)
    assert ok.returncode == 0, ok.stderr
    assert "create_table" not in ok.stdout
    assert len(slot_row(pg_dsn, names["slot"])) == 1


def test_mismatched_publication_is_reported_not_altered(pg_dsn: str, names: dict[str, str]) -> None:
    query(pg_dsn, (REPO / "sql" / "outbox.sql").read_text())
    query(pg_dsn, f'CREATE PUBLICATION "{names["publication"]}" FOR TABLE outbox')
    before = publication_row(pg_dsn, names["publication"])
    result = run_cli(*flags(names), "init", dsn=pg_dsn)
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1
    assert "publication" in result.stderr and "publishes insert, update, delete" in result.stderr
    assert publication_row(pg_dsn, names["publication"]) == before
    assert slot_row(pg_dsn, names["slot"]) == []


def test_wrong_columns_fail_preflight(pg_dsn: str, names: dict[str, str]) -> None:
    query(pg_dsn, (REPO / "sql" / "outbox.sql").read_text())
    result = run_cli(*flags(names), "init", dsn=pg_dsn, CDC_OUTBOX_COLUMNS__PRESET="debezium")
    assert result.returncode == 3
    assert "outbox_columns: missing column(s): aggregatetype, aggregateid, type" in result.stderr


def hold_slot(dsn: str, slot: str, publication: str) -> PGconnType:
    """Stream from the slot over a walsender connection so that it is active."""
    pgconn = pq.PGconn.connect(make_conninfo(dsn, replication="database").encode())
    assert pgconn.status == pq.ConnStatus.OK, pgconn.error_message
    command = (
        f"START_REPLICATION SLOT {slot} LOGICAL 0/0 "
        f"(proto_version '1', publication_names '{publication}')"
    )
    result = pgconn.exec_(command.encode())
    assert result.status == pq.ExecStatus.COPY_BOTH, pgconn.error_message
    return pgconn


def test_drop_refuses_active_slot_unless_forced(pg_dsn: str, names: dict[str, str]) -> None:
    assert run_cli(*flags(names), "init", "--create-table", dsn=pg_dsn).returncode == 0
    pgconn = hold_slot(pg_dsn, names["slot"], names["publication"])
    try:
        wait_until(
            lambda: bool(
                query(
                    pg_dsn,
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active",
                    (names["slot"],),
                )
            ),
            timeout=30,
        )
        [(pid,)] = query(
            pg_dsn,
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
            (names["slot"],),
        )
        status = json.loads(run_cli(*flags(names), "status", "--json", dsn=pg_dsn).stdout)
        assert status["slot"]["active"] is True
        assert status["slot"]["active_pid"] == pid

        refused = run_cli(*flags(names), "drop", "--yes", dsn=pg_dsn)
        assert refused.returncode == 3
        assert refused.stderr.strip() == (
            f"cdc-outbox: error: slot '{names['slot']}' is active for PID {pid}; "
            "stop the relay first (or pass --force to terminate it)"
        )
        assert len(slot_row(pg_dsn, names["slot"])) == 1
        assert len(publication_row(pg_dsn, names["publication"])) == 1

        forced = run_cli(*flags(names), "drop", "--yes", "--force", dsn=pg_dsn)
        assert forced.returncode == 0, forced.stderr
        assert f"terminated PID {pid}" in forced.stdout
        assert slot_row(pg_dsn, names["slot"]) == []
        assert publication_row(pg_dsn, names["publication"]) == []
    finally:
        pgconn.finish()


# -- preflight failures --------------------------------------------------------------------


@pytest.fixture(scope="module")
def replica_pg() -> Iterator[LocalPostgres]:
    """A separate server with wal_level=replica (never the shared session server)."""
    pg = LocalPostgres(settings={"wal_level": "replica"})
    pg.start()
    try:
        yield pg
    finally:
        pg.close()


def test_preflight_fails_on_wal_level_replica(replica_pg: LocalPostgres) -> None:
    result = run_cli("init", "--create-table", dsn=replica_pg.dsn)
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("cdc-outbox: error: preflight failed: wal_level: ")
    assert "'replica'" in result.stderr
    assert "(fix: ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL)" in result.stderr
    assert query(replica_pg.dsn, "SELECT to_regclass('public.outbox') IS NULL") == [(True,)]
    assert query(replica_pg.dsn, "SELECT count(*) FROM pg_publication") == [(0,)]

    status = run_cli("status", "--json", dsn=replica_pg.dsn)
    assert status.returncode == 0
    checks = {c["name"]: c["ok"] for c in json.loads(status.stdout)["checks"]}
    assert checks["wal_level"] is False


def test_preflight_fails_without_replication_privilege(
    pg_server: LocalPostgres, pg_dsn: str, names: dict[str, str]
) -> None:
    role = f"t_norepl_{uuid.uuid4().hex[:8]}"
    query(pg_dsn, f'CREATE ROLE "{role}" LOGIN')
    try:
        query(pg_dsn, (REPO / "sql" / "outbox.sql").read_text())
        query(pg_dsn, f'ALTER TABLE public.outbox OWNER TO "{role}"')
        dbname = query(pg_dsn, "SELECT current_database()")[0][0]
        query(pg_dsn, f'GRANT CREATE ON DATABASE "{dbname}" TO "{role}"')

        result = run_cli(*flags(names), "init", dsn=make_conninfo(pg_dsn, user=role))
        assert result.returncode == 3
        assert result.stderr.count("\n") == 1
        assert result.stderr.startswith(
            f"cdc-outbox: error: preflight failed: replication_privilege: role '{role}' "
            "lacks REPLICATION"
        )
        assert "publication:" not in result.stderr  # the owner may create it: only one failure
        assert publication_row(pg_dsn, names["publication"]) == []
        assert slot_row(pg_dsn, names["slot"]) == []
    finally:
        query(pg_dsn, f'DROP OWNED BY "{role}"')
        query(pg_dsn, f'DROP ROLE "{role}"')


def test_unreachable_server_is_one_line_exit_1() -> None:
    dsn = "host=127.0.0.1 port=1 user=x password=pa55word connect_timeout=5"
    result = run_cli("status", dsn=dsn)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("cdc-outbox: error: cannot connect to PostgreSQL")
    assert "pa55word" not in result.stderr


def test_owner_inits_least_privilege_role_runs_status(pg_dsn: str, names: dict[str, str]) -> None:
    role = f"t_relay_{uuid.uuid4().hex[:8]}"
    query(pg_dsn, (REPO / "sql" / "outbox.sql").read_text())
    query(pg_dsn, re.sub(r"\bcdc_outbox\b", role, (REPO / "sql" / "roles.sql").read_text()))
    relay_dsn = make_conninfo(pg_dsn, user=role)
    try:
        refused = run_cli(*flags(names), "init", dsn=relay_dsn)
        assert refused.returncode == 3
        assert f"publication: publication '{names['publication']}' is missing and role" in (
            refused.stderr
        )
        assert slot_row(pg_dsn, names["slot"]) == []

        assert run_cli(*flags(names), "init", dsn=pg_dsn).returncode == 0  # the owner
        status = run_cli(*flags(names), "status", "--json", dsn=relay_dsn)
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["slot"]["plugin"] == "pgoutput"
        assert report["pending_rows"] == 0
        assert all(check["ok"] for check in report["checks"])
    finally:
        query(pg_dsn, f'DROP OWNED BY "{role}"')
        query(pg_dsn, f'DROP ROLE "{role}"')
