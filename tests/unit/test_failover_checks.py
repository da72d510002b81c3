"""Failover-slot checks (cdc_outbox.admin.failover_checks) and slot creation with failover."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from cdc_outbox.admin.failover_checks import primary_failover_checks, standby_failover_checks
from cdc_outbox.config.settings import Settings
from cdc_outbox.store import schema
from cdc_outbox.store.inspection import StandbyState

READY = StandbyState(
    version_num=170005,
    in_recovery=True,
    sync_replication_slots="on",
    hot_standby_feedback="on",
    primary_slot_name="standby1",
    primary_conninfo="host=10.0.0.1 port=5432 user=rep dbname=postgres",
    slot_synced=True,
)


def _replace(**changes: object) -> StandbyState:
    fields = {name: getattr(READY, name) for name in READY.__slots__}
    return StandbyState(**{**fields, **changes})  # type: ignore[arg-type]


def test_a_standby_set_up_for_failover_slots_passes_every_check() -> None:
    checks = standby_failover_checks(READY, "cdc_outbox")
    assert [c.name for c in checks] == [
        "sync_replication_slots",
        "hot_standby_feedback",
        "primary_slot_name",
        "primary_conninfo_dbname",
        "slot_synced",
    ]
    assert all(c.ok and not c.fix for c in checks)


@pytest.mark.parametrize(
    ("change", "failed"),
    [
        ({"sync_replication_slots": "off"}, "sync_replication_slots"),
        ({"hot_standby_feedback": "off"}, "hot_standby_feedback"),
        ({"primary_slot_name": ""}, "primary_slot_name"),
        ({"primary_conninfo": "host=10.0.0.1 user=rep"}, "primary_conninfo_dbname"),
        ({"primary_conninfo": "not a = valid 'conninfo"}, "primary_conninfo_dbname"),
        ({"slot_synced": False}, "slot_synced"),
        ({"slot_synced": None}, "slot_synced"),
    ],
)
def test_each_missing_piece_fails_its_own_check_with_a_fix(
    change: dict[str, object], failed: str
) -> None:
    checks = standby_failover_checks(_replace(**change), "cdc_outbox")
    bad = [c for c in checks if not c.ok]
    assert [c.name for c in bad] == [failed]
    assert bad[0].fix


def test_a_primary_or_an_old_standby_is_one_failed_check() -> None:
    (primary,) = standby_failover_checks(_replace(in_recovery=False), "s")
    assert not primary.ok and "not a standby" in primary.detail
    (old,) = standby_failover_checks(_replace(version_num=160009), "s")
    assert not old.ok and "PostgreSQL 16 has no failover slots" in old.detail


def test_primary_checks_warn_but_never_fail() -> None:
    assert primary_failover_checks(160009, None, None) == []
    ok = primary_failover_checks(170005, "standby1", True)
    assert [(c.name, c.ok, c.warning) for c in ok] == [
        ("failover_slot", True, False),
        ("synchronized_standby_slots", True, False),
    ]
    unset = primary_failover_checks(180001, "", False)
    assert [(c.name, c.ok, c.warning) for c in unset] == [
        ("failover_slot", True, True),
        ("synchronized_standby_slots", True, True),
    ]
    assert [c.name for c in primary_failover_checks(170005, " , ", None)] == [
        "synchronized_standby_slots"
    ]


@given(
    version=st.integers(100000, 190000),
    names=st.one_of(st.none(), st.text(alphabet="ab, ", max_size=8)),
    failover=st.one_of(st.none(), st.booleans()),
)
def test_primary_checks_are_never_failures(
    version: int, names: str | None, failover: bool | None
) -> None:
    checks = primary_failover_checks(version, names, failover)
    assert all(c.ok for c in checks)
    assert (checks == []) == (version < 170000)


def test_slot_failover_only_on_17_and_later(caplog: pytest.LogCaptureFixture) -> None:
    assert schema.slot_failover(True, 170005) and schema.slot_failover(True, 180001)
    assert not schema.slot_failover(False, 170005)
    with caplog.at_level(logging.INFO, logger="cdc_outbox.store.schema"):
        assert not schema.slot_failover(True, 160009)
    assert "slot_failover ignored: PostgreSQL 16 has no failover slots" in caplog.text


def test_create_slot_sql_with_failover() -> None:
    s = Settings(dsn=SecretStr("host=db dbname=shop"), slot_name="my_slot")
    assert schema.create_slot_sql(s, True).as_string(None) == (
        "SELECT lsn::text FROM pg_create_logical_replication_slot"
        "('my_slot', 'pgoutput', false, false, true)"
    )
    assert s.slot_failover is True
