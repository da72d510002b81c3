"""Preflight verdicts for inspected database states (pure: evaluate_checks, no server)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import SecretStr

from cdc_outbox.admin.checks import Check
from cdc_outbox.admin.preflight import evaluate_checks
from cdc_outbox.config.settings import Settings
from cdc_outbox.store.inspection import DatabaseState, PublicationStatus, TableState
from tests.support.preflight import COLUMNS, LEAVES, SETTINGS, ready


def publication(**changes: Any) -> PublicationStatus:
    pub = ready().publication
    assert pub is not None
    return dataclasses.replace(pub, **changes)


def check(state: DatabaseState, name: str) -> Check:
    [found] = [c for c in evaluate_checks(state, SETTINGS, create_table=False) if c.name == name]
    return found


def test_ready_state_passes_every_check() -> None:
    failed = [c for c in evaluate_checks(ready(), SETTINGS, create_table=False) if not c.ok]
    assert failed == []


def test_postgresql_14_fails_the_server_version_check() -> None:
    result = check(ready(version_num=140013, version="14.13"), "server_version")
    assert not result.ok
    assert result.detail == "PostgreSQL 14.13"
    assert result.fix == "upgrade to PostgreSQL 15 or later"
    others = evaluate_checks(ready(version_num=140013), SETTINGS, create_table=False)
    assert [c.name for c in others if not c.ok] == ["server_version"]


def test_postgresql_15_passes_the_server_version_check() -> None:
    assert check(ready(version_num=150000, version="15.0"), "server_version").ok


def test_partitioned_outbox_without_publish_via_partition_root_fails_with_the_fix() -> None:
    # pg_publication_tables lists a partitioned table's leaves when via_root is off.
    state = ready(
        table_partitioned=True,
        table_partitions=LEAVES,
        publication=publication(tables=list(reversed(LEAVES)), via_root=False),
    )
    result = check(state, "publication")
    assert not result.ok
    assert "lacks publish_via_partition_root" in result.detail
    assert "public.outbox is partitioned" in result.detail
    assert "covers" not in result.detail  # the leaves are exactly the outbox's partitions
    assert result.fix == (
        "ALTER PUBLICATION cdc_outbox_pub"
        " SET (publish = 'insert', publish_via_partition_root = true)"
    )


def test_partitioned_outbox_without_via_root_and_other_problems_gets_the_full_fix() -> None:
    state = ready(
        table_partitioned=True,
        table_partitions=LEAVES,
        publication=publication(tables=LEAVES[:1], operations=["insert", "update"]),
    )
    result = check(state, "publication")
    assert not result.ok
    for part in ("covers public.outbox_2025", "publishes insert, update", "lacks publish_via"):
        assert part in result.detail
    assert result.fix.startswith("`cdc-outbox drop --yes` then init again")
    assert "publish_via_partition_root = true" in result.fix


def test_partitioned_outbox_published_via_its_root_passes() -> None:
    pub = publication(via_root=True)  # pg_publication_tables then lists the root itself
    state = ready(table_partitioned=True, table_partitions=LEAVES, publication=pub)
    assert check(state, "publication").ok


def test_plain_outbox_publication_without_via_root_still_passes() -> None:
    assert check(ready(publication=publication(via_root=False)), "publication").ok


DEBEZIUM = Settings(dsn=SecretStr("host=db.example dbname=shop"), columns={"preset": "debezium"})
DEBEZIUM_COLUMNS = {"id", "aggregatetype", "aggregateid", "type", "payload"}


def order_check(state: DatabaseState, settings: Settings) -> Check:
    [found] = [
        c
        for c in evaluate_checks(state, settings, create_table=False)
        if c.name == "catch_up_order"
    ]
    return found


def test_a_layout_without_a_commit_order_key_gets_a_warning_not_a_failure() -> None:
    result = order_check(ready(table_columns=DEBEZIUM_COLUMNS), DEBEZIUM)
    assert result.ok and result.warning
    assert "transaction id only" in result.detail
    assert "columns.sequence" in result.fix and "track_commit_timestamp" in result.fix


def test_commit_timestamps_or_a_sequence_column_give_the_commit_order() -> None:
    state = ready(table_columns=DEBEZIUM_COLUMNS, commit_timestamps=True)
    assert not order_check(state, DEBEZIUM).warning
    versioned = DEBEZIUM.model_copy(
        update={"columns": DEBEZIUM.columns.model_copy(update={"sequence": "version"})}
    )
    result = order_check(ready(table_columns=DEBEZIUM_COLUMNS | {"version"}), versioned)
    assert result.ok and not result.warning and "column version" in result.detail
    missing = order_check(ready(table_columns=DEBEZIUM_COLUMNS), versioned)
    assert not missing.ok and "no column 'version'" in missing.detail


def test_the_default_layout_orders_by_created_at_without_a_warning() -> None:
    result = check(ready(), "catch_up_order")
    assert result.ok and not result.warning and "created_at" in result.detail


# -- several outbox tables ([[outboxes]]) ------------------------------------------------------

TWO = Settings(
    dsn=SecretStr("host=db.example dbname=shop"),
    outboxes=[{"schema": "public", "table": "outbox"}, {"schema": "billing", "table": "outbox"}],
)


def two_tables(**billing: Any) -> DatabaseState:
    """Both tables exist; the publication lists only public.outbox (billing added later)."""
    state = ready()
    fields = {"oid": 16999, "owned": True, "columns": set(COLUMNS), **billing}
    state.tables.append(TableState("billing", "outbox", **fields))
    return state


def test_each_configured_table_is_checked_and_named() -> None:
    state = two_tables(columns={"id", "payload"})
    checks = evaluate_checks(state, TWO, create_table=False)
    tables = [c.detail for c in checks if c.name == "outbox_table"]
    assert tables == ["table public.outbox exists", "table billing.outbox exists"]
    [bad] = [c for c in checks if c.name == "outbox_columns" and not c.ok]
    assert bad.detail.startswith("missing column(s): aggregate_type")
    assert bad.detail.endswith("(table billing.outbox)")
    gone = evaluate_checks(ready(), TWO, create_table=False)  # billing.outbox never inspected
    assert [c.detail for c in gone if c.name == "outbox_table" and not c.ok] == [
        "table billing.outbox does not exist"
    ]


def test_a_table_missing_from_the_publication_is_added_by_init_and_fails_elsewhere() -> None:
    state = two_tables()
    [running] = [c for c in evaluate_checks(state, TWO, False) if c.name == "publication"]
    assert not running.ok
    assert "lacks billing.outbox" in running.detail
    assert running.fix == "run `cdc-outbox init` (it adds them)"
    [init] = [c for c in evaluate_checks(state, TWO, False, adding=True) if c.name == "publication"]
    assert init.ok and init.detail == "publication 'cdc_outbox_pub': billing.outbox will be added"
    foreign = two_tables(owned=False)
    [refused] = [
        c for c in evaluate_checks(foreign, TWO, False, adding=True) if c.name == "publication"
    ]
    assert not refused.ok and "may not add them" in refused.detail
    listed = publication(tables=["billing.outbox", "public.outbox"])
    both = dataclasses.replace(two_tables(), publication=listed)
    assert check_of(both, TWO, "publication").ok


def check_of(state: DatabaseState, settings: Settings, name: str) -> Check:
    [found] = [c for c in evaluate_checks(state, settings, create_table=False) if c.name == name]
    return found


def test_a_new_schema_is_created_when_the_role_may() -> None:
    state = ready()
    state.tables.append(TableState("billing", "outbox", schema_exists=False))
    checks = evaluate_checks(state, TWO, create_table=True, adding=True)
    [billing] = [c for c in checks if c.name == "outbox_table" and "billing" in c.detail]
    assert (
        billing.ok and billing.detail == "schema billing and table billing.outbox will be created"
    )
    denied = dataclasses.replace(state, can_create_in_db=False)
    checks = evaluate_checks(denied, TWO, create_table=True, adding=True)
    [billing] = [c for c in checks if c.name == "outbox_table" and "billing" in c.detail]
    assert not billing.ok and "may not create it" in billing.detail


@pytest.mark.parametrize(
    ("id_type", "ok"),
    [("uuid", True), ("text", True), ("character varying(36)", True),
     ("character varying(20)", False), ("bigint", False)],
)  # fmt: skip
def test_table_less_events_need_a_first_outbox_id_column_that_holds_a_uuid(
    id_type: str, ok: bool
) -> None:
    on = SETTINGS.model_copy(update={"message_prefix": "app"})
    result = check_of(ready(table_id_type=id_type), on, "message_prefix_id")
    assert result.ok is ok
    assert f"its id column id is {id_type}" in result.detail
    assert [
        c for c in evaluate_checks(ready(), SETTINGS, False) if c.name == "message_prefix_id"
    ] == []
