"""Preflight verdicts for inspected database states (pure: evaluate_checks, no server)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import SecretStr

from cdc_outbox.admin.checks import Check
from cdc_outbox.admin.preflight import evaluate_checks
from cdc_outbox.config import Settings
from cdc_outbox.store.inspection import DatabaseState, PublicationStatus

SETTINGS = Settings(dsn=SecretStr("host=db.example dbname=shop"))
COLUMNS = {"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers"}
LEAVES = ["public.outbox_2025", "public.outbox_2026"]


def ready(**changes: Any) -> DatabaseState:
    """A PostgreSQL 15 ready for the relay: outbox table, publication; the slot is missing."""
    state = DatabaseState(
        version_num=150013,
        version="15.13",
        wal_level="logical",
        max_slots=10,
        used_slots=0,
        max_senders=10,
        used_senders=0,
        superuser=False,
        replication=True,
        user="owner",
        database="shop",
        can_create_in_db=True,
        can_create_in_schema=True,
        table_oid=16384,
        table_owned=True,
        table_columns=set(COLUMNS),
        publication=PublicationStatus("cdc_outbox_pub", ["public.outbox"], ["insert"], False),
    )
    return dataclasses.replace(state, **changes)


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
