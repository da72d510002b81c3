"""sql/*.sql (hand-readable) and cdc_outbox.store.schema (generated) create the same objects."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import SecretStr

from cdc_outbox.config.settings import Settings
from cdc_outbox.store import schema
from cdc_outbox_dev.sandbox.postgres import LocalPostgres
from examples.cache_invalidation.orders import ORDERS_DDL, create_order, update_order

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"


def execute(dsn: str, text: Any, params: tuple[Any, ...] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(text, params)
        return cur.fetchall() if cur.description is not None else []


def shape(dsn: str, table: str) -> dict[str, Any]:
    """Columns, indexes and constraints of ``public.<table>``, comparable across databases."""
    return {
        "columns": execute(
            dsn,
            "SELECT ordinal_position, column_name, data_type, is_nullable, column_default"
            " FROM information_schema.columns WHERE table_schema = 'public'"
            " AND table_name = %s ORDER BY ordinal_position",
            (table,),
        ),
        "indexes": execute(
            dsn,
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
            " AND tablename = %s ORDER BY indexname",
            (table,),
        ),
        "constraints": execute(
            dsn,
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = to_regclass(%s) ORDER BY conname",
            (f"public.{table}",),
        ),
    }


@pytest.fixture
def second_dsn(pg_server: LocalPostgres) -> Iterator[str]:
    name = f"t_schema_{uuid.uuid4().hex[:10]}"
    dsn = pg_server.create_database(name)
    yield dsn
    pg_server.drop_database(name)


def settings_for(dsn: str, **kwargs: Any) -> Settings:
    return Settings(dsn=SecretStr(dsn), **kwargs)


def test_outbox_sql_matches_generated_ddl(pg_dsn: str, second_dsn: str) -> None:
    execute(pg_dsn, (SQL_DIR / "outbox.sql").read_text())
    for stmt in schema.outbox_table_ddl(settings_for(second_dsn)):
        execute(second_dsn, stmt)
    from_file, generated = shape(pg_dsn, "outbox"), shape(second_dsn, "outbox")
    assert len(from_file["columns"]) == 14
    assert [i[0] for i in from_file["indexes"]] == [
        "outbox_failed_idx",
        "outbox_pending_idx",
        "outbox_pkey",
        "outbox_unpublished_idx",
    ]
    assert from_file == generated
    for stmt in schema.relay_state_ddl(settings_for(second_dsn)):
        execute(second_dsn, stmt)
    state_file = shape(pg_dsn, schema.RELAY_STATE_TABLE)
    assert len(state_file["columns"]) == 9
    assert state_file == shape(second_dsn, schema.RELAY_STATE_TABLE)


def test_processed_events_sql_matches_generated_ddl(pg_dsn: str, second_dsn: str) -> None:
    execute(pg_dsn, (SQL_DIR / "processed_events.sql").read_text())
    for stmt in schema.processed_events_ddl():
        execute(second_dsn, stmt)
    from_file = shape(pg_dsn, "processed_events")
    assert [c[1] for c in from_file["columns"]] == ["consumer_name", "event_id", "processed_at"]
    assert from_file == shape(second_dsn, "processed_events")


def test_example_write_commits_business_row_and_event(pg_dsn: str) -> None:
    execute(pg_dsn, (SQL_DIR / "outbox.sql").read_text())
    execute(pg_dsn, (SQL_DIR / "example_write.sql").read_text())
    [order] = execute(pg_dsn, "SELECT to_jsonb(o) FROM orders o")
    rows = execute(
        pg_dsn, "SELECT aggregate_type, aggregate_id, event_type, payload, status FROM outbox"
    )
    assert rows == [("order", order[0]["id"], "OrderUpdated", order[0], "PENDING")]
    assert order[0] == {
        "id": order[0]["id"], "customer": "c-42", "status": "NEW", "total_cents": 1999,
        "version": 1,
    }  # fmt: skip


def test_example_write_and_the_examples_share_one_orders_table(
    pg_dsn: str, second_dsn: str
) -> None:
    """Issue 27: sql/example_write.sql and examples/ created different ``orders`` tables, so
    following both failed with UndefinedColumn "customer". Both orders work here, and the
    event of the script is the one the example's consumer applies."""
    script = (SQL_DIR / "example_write.sql").read_text()
    with psycopg.connect(pg_dsn) as conn:  # the script first, then the example
        conn.execute((SQL_DIR / "outbox.sql").read_text())
        conn.execute(script)
        conn.execute(ORDERS_DDL)
        create_order(conn, "o-1", "c-1", 500)
        update_order(conn, "o-1", status="PAID")
        conn.commit()
    with psycopg.connect(second_dsn) as conn:  # the example first, then the script
        conn.execute((SQL_DIR / "outbox.sql").read_text())
        conn.execute(ORDERS_DDL)
        create_order(conn, "o-1", "c-1", 500)
        conn.commit()
        conn.execute(script)
        conn.commit()
    assert shape(pg_dsn, "orders") == shape(second_dsn, "orders")
    for dsn in (pg_dsn, second_dsn):
        events = execute(dsn, "SELECT aggregate_id, event_type, payload FROM outbox")
        assert len(events) == (3 if dsn == pg_dsn else 2)
        for aggregate_id, event_type, payload in events:
            # what examples/cache_invalidation/consumer.py needs: the row, with its version
            assert event_type == "OrderUpdated" and payload["id"] == aggregate_id
            assert {"id", "customer", "status", "total_cents", "version"} == set(payload)
            [(row,)] = execute(
                dsn, "SELECT to_jsonb(o) FROM orders o WHERE id = %s", (aggregate_id,)
            )
            assert payload["version"] <= row["version"]


def grants(dsn: str, role: str) -> set[tuple[str, str]]:
    table = execute(
        dsn,
        "SELECT privilege_type, '' FROM information_schema.role_table_grants"
        " WHERE grantee = %s AND table_name = 'outbox'",
        (role,),
    )
    column = execute(
        dsn,
        "SELECT privilege_type, column_name FROM information_schema.column_privileges"
        " WHERE grantee = %s AND table_name = 'outbox' AND privilege_type = 'UPDATE'",
        (role,),
    )
    return {(str(p), str(c)) for p, c in table + column}


def test_roles_sql_is_least_privilege_and_matches_generated(pg_dsn: str) -> None:
    tag = uuid.uuid4().hex[:8]
    file_role, gen_role = f"t_relay_{tag}", f"t_relay_gen_{tag}"
    execute(pg_dsn, (SQL_DIR / "outbox.sql").read_text())
    roles_sql = (SQL_DIR / "roles.sql").read_text()
    assert roles_sql.count("TO cdc_outbox;") == 5
    try:
        execute(pg_dsn, re.sub(r"\bcdc_outbox\b", file_role, roles_sql))
        for stmt in schema.role_ddl(settings_for(pg_dsn), gen_role):
            execute(pg_dsn, stmt)
        file_grants = grants(pg_dsn, file_role)
        assert ("SELECT", "") in file_grants and ("DELETE", "") in file_grants
        assert ("INSERT", "") not in file_grants
        assert ("UPDATE", "") not in file_grants  # column-wise only:
        assert {c for p, c in file_grants if p == "UPDATE"} == set(schema.POLLING_COLUMNS)
        assert file_grants == grants(pg_dsn, gen_role)
        assert execute(
            pg_dsn,
            "SELECT rolreplication, rolcanlogin FROM pg_roles WHERE rolname = %s",
            (file_role,),
        ) == [(True, True)]

        execute(
            pg_dsn,
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)"
            " VALUES ('a', '1', 'E', '{}')",
        )
        relay = make_conninfo(pg_dsn, user=file_role)
        assert execute(relay, "SELECT count(*) FROM outbox") == [(1,)]
        execute(relay, "UPDATE outbox SET status = 'PUBLISHED', published_at = now()")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            execute(relay, "UPDATE outbox SET payload = '{}'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            execute(
                relay,
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type)"
                " VALUES ('a', '2', 'E')",
            )
        execute(relay, "DELETE FROM outbox WHERE status = 'PUBLISHED'")
        assert execute(pg_dsn, "SELECT count(*) FROM outbox") == [(0,)]
        assert conninfo_to_dict(relay)["user"] == file_role
    finally:
        for role in (file_role, gen_role):
            if execute(pg_dsn, "SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)):
                execute(pg_dsn, f'DROP OWNED BY "{role}"')
                execute(pg_dsn, f'DROP ROLE "{role}"')
