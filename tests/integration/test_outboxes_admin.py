"""Several outbox tables ([[outboxes]]) through the real CLI: init, status, drop, redrive and
cleanup against a real PostgreSQL."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support.catalog import flags, publication_row, query
from tests.support.helpers import run_cli

BILLING = {"schema": "billing", "table": "events"}
PUBLIC = {"schema": "public", "table": "outbox"}


def outboxes(*entries: dict[str, Any]) -> str:
    return json.dumps(list(entries))


@pytest.fixture
def names(pg_dsn: str) -> Iterator[dict[str, str]]:
    """Unique slot/publication names; the slot is dropped afterwards."""
    tag = uuid.uuid4().hex[:10]
    got = {"slot": f"t_slot_{tag}", "publication": f"t_pub_{tag}"}
    yield got
    query(
        pg_dsn,
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
        " WHERE slot_name = %s AND NOT active",
        (got["slot"],),
    )


def cli(names: dict[str, str], dsn: str, *args: str, entries: str) -> Any:
    return run_cli(*flags(names), *args, dsn=dsn, CDC_OUTBOX_OUTBOXES=entries)


def insert(dsn: str, table: str, aggregate: str, status: str = "PENDING") -> None:
    statement = sql.SQL(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, status)"
        " VALUES ('order', %s, 'Created', '{{}}', %s)"
    ).format(sql.Identifier(*table.split(".")))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement, (aggregate, status))


def phase(dsn: str, slot: str) -> str:
    [(value,)] = query(
        dsn, "SELECT phase FROM public.cdc_outbox_relay_state WHERE slot_name = %s", (slot,)
    )
    return str(value)


def test_init_creates_every_table_and_one_publication_status_and_drop_cover_them(
    pg_dsn: str, names: dict[str, str]
) -> None:
    both = outboxes(PUBLIC, BILLING)
    init = cli(names, pg_dsn, "init", "--create-table", "--json", entries=both)
    assert init.returncode == 0, init.stderr
    actions = [a["name"] for a in json.loads(init.stdout)["actions"]]
    assert actions.count("create_table") == 2 and actions.count("create_schema") == 1
    [(_, ins, upd, dele, trunc, tables)] = publication_row(pg_dsn, names["publication"])
    assert (ins, upd, dele, trunc) == (True, False, False, False)
    assert sorted(tables) == ["billing.events", "public.outbox"]

    insert(pg_dsn, "billing.events", "b1")
    insert(pg_dsn, "billing.events", "b2", "FAILED")
    insert(pg_dsn, "public.outbox", "p1")
    insert(pg_dsn, "public.outbox", "p2")
    insert(pg_dsn, "public.outbox", "p3", "PUBLISHED")
    status = cli(names, pg_dsn, "status", "--json", entries=both)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    by_name = {o["outbox"]: o for o in report["outboxes"]}
    assert list(by_name) == ["public.outbox", "billing.events"]
    assert by_name["public.outbox"]["unpublished_rows"] == 2
    assert by_name["billing.events"]["unpublished_rows"] == 1
    assert (by_name["billing.events"]["failed_rows"], by_name["public.outbox"]["failed_rows"]) == (
        1,
        0,
    )
    assert by_name["billing.events"]["parked_aggregates"] == 1
    assert all(o["oldest_unpublished_age_seconds"] >= 0 for o in by_name.values())
    assert (report["pending_rows"], report["failed_rows"]) == (3, 1)
    assert all(check["ok"] for check in report["checks"]), report["checks"]
    human = cli(names, pg_dsn, "status", entries=both)
    assert "billing.events" in human.stdout and "public.outbox" in human.stdout

    drop = cli(names, pg_dsn, "drop", "--yes", entries=both)
    assert drop.returncode == 0, drop.stderr
    assert publication_row(pg_dsn, names["publication"]) == []
    assert query(pg_dsn, "SELECT count(*) FROM billing.events") == [(2,)]


def test_init_again_adds_a_new_outbox_entry_to_the_publication(
    pg_dsn: str, names: dict[str, str]
) -> None:
    first = cli(names, pg_dsn, "init", "--create-table", entries=outboxes(PUBLIC))
    assert first.returncode == 0, first.stderr
    assert phase(pg_dsn, names["slot"]) == "STREAMING"
    query(pg_dsn, "CREATE SCHEMA billing")
    query(pg_dsn, "CREATE TABLE billing.events (LIKE public.outbox INCLUDING ALL)")
    insert(pg_dsn, "billing.events", "b1")  # written before the table joins the publication

    both = outboxes(PUBLIC, BILLING)
    lacking = cli(names, pg_dsn, "status", "--json", entries=both)
    [pub_check] = [c for c in json.loads(lacking.stdout)["checks"] if c["name"] == "publication"]
    assert not pub_check["ok"] and "lacks billing.events" in pub_check["detail"]

    second = cli(names, pg_dsn, "init", "--json", entries=both)
    assert second.returncode == 0, second.stderr
    assert [a["name"] for a in json.loads(second.stdout)["actions"]] == ["add_to_publication"]
    [(*_, tables)] = publication_row(pg_dsn, names["publication"])
    assert sorted(tables) == ["billing.events", "public.outbox"]
    # The existing slot never streams b1: billing.events is not among the tables it has
    # streamed, so the relay's next start catches that table up (cdc/new_tables.py).
    assert phase(pg_dsn, names["slot"]) == "STREAMING"
    [(streamed,)] = query(
        pg_dsn,
        "SELECT streamed_tables FROM public.cdc_outbox_relay_state WHERE slot_name = %s",
        (names["slot"],),
    )
    assert set(streamed) == {"public.outbox"}

    third = cli(names, pg_dsn, "init", entries=both)
    assert third.returncode == 0 and "nothing to do" in third.stdout


def test_message_prefix_needs_a_first_outbox_id_column_holding_a_uuid(
    pg_dsn: str, names: dict[str, str]
) -> None:
    query(pg_dsn, "CREATE SCHEMA billing")
    query(
        pg_dsn,
        "CREATE TABLE billing.events (id bigint PRIMARY KEY, aggregate_type text,"
        " aggregate_id text, event_type text, payload jsonb, headers jsonb)",
    )
    entries = outboxes({**BILLING, "cdc_mark_published": "off"}, PUBLIC)
    result = run_cli(
        *flags(names), "init", "--create-table", dsn=pg_dsn, CDC_OUTBOX_OUTBOXES=entries,
        CDC_OUTBOX_MESSAGE_PREFIX="app", CDC_OUTBOX_MODE="cdc",
    )  # fmt: skip
    assert result.returncode == 3, result.stdout
    assert "message_prefix_id" in result.stderr and "id is bigint" in result.stderr
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT to_regclass('public.outbox')").fetchone() == (None,)


def _statuses(dsn: str, table: str) -> dict[str, str]:
    """``{aggregate_id: status}`` of ``table``'s rows."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT aggregate_id, status FROM {}").format(sql.Identifier(*table.split(".")))
        ).fetchall()
    return {str(a): str(s) for a, s in rows}


def _age_published(dsn: str, table: str, days: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {} SET published_at = now() - %s * interval '1 day'"
                " WHERE status = 'PUBLISHED'"
            ).format(sql.Identifier(*table.split("."))),
            (days,),
        )


def test_redrive_and_cleanup_take_a_table_and_default_to_every_table(pg_dsn: str) -> None:
    debezium = {"schema": "cdc", "table": "raw", "columns": {"preset": "debezium"}}
    entries = outboxes(PUBLIC, BILLING, {**debezium, "cdc_mark_published": "delete"})
    env = {"CDC_OUTBOX_OUTBOXES": entries, "CDC_OUTBOX_MODE": "cdc"}
    ddl = run_cli("sql", "outbox", dsn=pg_dsn, **env)  # every table, and its schema
    assert ddl.returncode == 0, ddl.stderr
    query(pg_dsn, ddl.stdout)
    for table in ("public.outbox", "billing.events"):
        insert(pg_dsn, table, "shared", "FAILED")  # the same aggregate id in both tables
        insert(pg_dsn, table, "done", "PUBLISHED")
        _age_published(pg_dsn, table, 10)

    one = run_cli("redrive", "--all", "--table", "billing.events", "--json", dsn=pg_dsn, **env)
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["tables"] == {"billing.events": 1}
    assert _statuses(pg_dsn, "billing.events")["shared"] == "PENDING"
    assert _statuses(pg_dsn, "public.outbox")["shared"] == "FAILED"  # another sequence

    dry = run_cli("redrive", "--all", "--dry-run", "--json", dsn=pg_dsn, **env)
    doc = json.loads(dry.stdout)
    assert doc["tables"] == {"public.outbox": 1, "billing.events": 0}  # not the debezium one
    assert [r["table"] for r in doc["sample"]] == ["public.outbox"]
    every = run_cli("redrive", "--all", dsn=pg_dsn, **env)
    assert every.returncode == 0 and "public.outbox: 1" in every.stdout, every.stdout
    assert _statuses(pg_dsn, "public.outbox")["shared"] == "PENDING"

    refused = run_cli("redrive", "--all", "--table", "cdc.raw", dsn=pg_dsn, **env)
    assert refused.returncode == 2 and "the debezium preset has none (cdc.raw)" in refused.stderr
    unknown = run_cli("cleanup", "--older-than", "7d", "--table", "nope.x", dsn=pg_dsn, **env)
    assert unknown.returncode == 2 and "no outbox 'nope.x'" in unknown.stderr

    only = run_cli("cleanup", "--older-than", "7d", "--table", "public.outbox", "--json",
                   dsn=pg_dsn, **env)  # fmt: skip
    assert json.loads(only.stdout)["tables"] == {"public.outbox": 1}
    assert "done" in _statuses(pg_dsn, "billing.events")
    rest = run_cli("cleanup", "--older-than", "7d", "--json", dsn=pg_dsn, **env)
    assert json.loads(rest.stdout)["tables"] == {"public.outbox": 0, "billing.events": 1}
    assert "done" not in _statuses(pg_dsn, "billing.events")


def test_metrics_and_lag_show_each_outbox_table(pg_dsn: str) -> None:
    from cdc_outbox.config.settings import Settings
    from cdc_outbox.monitoring import start_monitoring
    from cdc_outbox.telemetry.relay_stats import RelayStats
    from cdc_outbox_dev.sandbox._proc import free_port
    from tests.support.helpers import wait_until
    from tests.support.monitoring import scrape

    entries = [PUBLIC, BILLING]
    settings = Settings.model_validate(
        {"dsn": pg_dsn, "mode": "polling", "metrics_port": free_port(),
         "monitor_interval_s": 0.5, "outboxes": entries}
    )  # fmt: skip
    ddl = run_cli("sql", "outbox", dsn=pg_dsn, CDC_OUTBOX_OUTBOXES=outboxes(*entries))
    query(pg_dsn, ddl.stdout)
    insert(pg_dsn, "public.outbox", "p1")
    insert(pg_dsn, "billing.events", "b1")
    insert(pg_dsn, "billing.events", "b2")
    insert(pg_dsn, "billing.events", "b3", "FAILED")
    query(pg_dsn, "UPDATE billing.events SET created_at = now() - interval '1 hour'")
    with start_monitoring(settings, lambda: RelayStats(mode="polling")):
        m = wait_until(
            lambda: (
                (v := scrape(settings)).get(
                    "cdc_outbox_outbox_unpublished_rows{outbox=billing.events}"
                )
                and v
            )
        )
    assert m["cdc_outbox_outbox_unpublished_rows{outbox=public.outbox}"] == 1
    assert m["cdc_outbox_outbox_unpublished_rows{outbox=billing.events}"] == 2
    assert m["cdc_outbox_outbox_failed_rows{outbox=billing.events}"] == 1
    assert m["cdc_outbox_outbox_parked_aggregates{outbox=public.outbox}"] == 0
    assert m["cdc_outbox_outbox_oldest_unpublished_age_seconds{outbox=billing.events}"] >= 3600
    assert m["cdc_outbox_outbox_oldest_unpublished_age_seconds{outbox=public.outbox}"] < 600
    assert m["cdc_outbox_polling_rows{status=pending}"] == 3  # summed over the tables
    lag = run_cli("lag", "--json", dsn=pg_dsn, CDC_OUTBOX_OUTBOXES=outboxes(*entries),
                  CDC_OUTBOX_MODE="polling", CDC_OUTBOX_METRICS_PORT="0")  # fmt: skip
    assert lag.returncode == 0, lag.stderr
    doc = json.loads(lag.stdout)
    by_name = {f["outbox"]: f for f in doc["outboxes"]}
    assert (
        by_name["billing.events"]["unpublished_rows"],
        by_name["public.outbox"]["unpublished_rows"],
    ) == (2, 1)
    assert doc["polling_pending"] == 3 and doc["oldest_unpublished_age_seconds"] >= 3600
    human = run_cli("lag", dsn=pg_dsn, CDC_OUTBOX_OUTBOXES=outboxes(*entries),
                    CDC_OUTBOX_MODE="polling", CDC_OUTBOX_METRICS_PORT="0")  # fmt: skip
    assert "outbox billing.events" in human.stdout and "1 FAILED" in human.stdout


def test_init_of_a_new_slot_records_every_table_as_streamed_from_its_point(
    pg_dsn: str, names: dict[str, str]
) -> None:
    """A table configured when ``init`` creates the slot is the slot's own, not one added
    later: its rows must never go through a catch-up (which, with nothing telling published
    rows from unpublished ones in a statusless layout or with marking off, publishes them
    twice)."""
    tag = names["slot"]
    both = outboxes(
        {"schema": "public", "table": f"o_{tag}"}, {"schema": "billing", "table": f"e_{tag}"}
    )
    init = cli(names, pg_dsn, "init", "--create-table", entries=both)
    assert init.returncode == 0, init.stderr
    [(recorded, point)] = query(
        pg_dsn,
        "SELECT streamed_tables, consistent_point::text FROM public.cdc_outbox_relay_state"
        " WHERE slot_name = %s",
        (names["slot"],),
    )
    assert recorded == {f"public.o_{tag}": point, f"billing.e_{tag}": point}
