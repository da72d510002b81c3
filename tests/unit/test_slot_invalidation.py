"""Why a slot was invalidated, from the catalog row or the server's error (pure), and the one
line cdc mode ends with. The error texts are the ones PostgreSQL 15-18 sent here."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.cdc.catch_up_rule import catch_up_reason
from cdc_outbox.errors import FailureClass, SlotInvalidated, classify
from cdc_outbox.ha.slot_invalidation import REASONS, Invalidation, of_error, of_slot
from cdc_outbox.lsn import Lsn
from cdc_outbox.store.inspection import SlotStatus
from cdc_outbox.store.relay_state import Phase, RelayState

#: What START_REPLICATION answered on an invalidated slot (libpq's text, on one line).
MEASURED_ERRORS = {
    "15": 'START_REPLICATION failed: ERROR: cannot read from logical replication slot "s"'
    " DETAIL: This slot has been invalidated because it exceeded the maximum reserved size.",
    "16/17": "START_REPLICATION failed: ERROR: can no longer get changes from replication slot"
    ' "s" DETAIL: This slot has been invalidated because it exceeded the maximum reserved size.',
    "18": 'START_REPLICATION failed: ERROR: can no longer access replication slot "s"'
    ' DETAIL: This replication slot has been invalidated due to "wal_removed".',
    "relay": "replication slot 's' was invalidated (wal_status=lost)",
}


@pytest.mark.parametrize(
    ("wal_status", "reason", "expected"),
    [
        ("reserved", None, None),  # 15/16: healthy
        ("unreserved", None, None),  # in danger, not lost yet
        ("lost", None, "wal_removed"),  # 15/16 on a primary
        ("lost", "wal_removed", "wal_removed"),  # 17+
        ("lost", "rows_removed", "rows_removed"),
        ("lost", "wal_level_insufficient", "wal_level_insufficient"),
        ("lost", "idle_timeout", "idle_timeout"),  # 18
        ("lost", "some_future_reason", "unknown"),
        ("reserved", "idle_timeout", "idle_timeout"),  # the reason wins
    ],
)
def test_the_catalog_row_tells_the_reason(
    wal_status: str, reason: str | None, expected: str | None
) -> None:
    found = of_slot(wal_status, reason)
    assert (found and found.reason) == expected


@pytest.mark.parametrize(("version", "text"), sorted(MEASURED_ERRORS.items()))
def test_every_versions_error_is_recognised(version: str, text: str) -> None:
    found = of_error(text)
    assert found is not None, version
    assert found.reason == ("unknown" if version == "relay" else "wal_removed")


@pytest.mark.parametrize(
    "text",
    [
        "replication connection failed: connection refused",
        'START_REPLICATION failed: ERROR: replication slot "s" does not exist',
        'ERROR: replication slot "s" is active for PID 42',
    ],
)
def test_other_errors_are_not_invalidations(text: str) -> None:
    assert of_error(text) is None


def test_a_recovery_conflict_in_the_error_text() -> None:
    text = (
        'ERROR: can no longer get changes from replication slot "s" DETAIL: This slot has been'
        " invalidated because it was conflicting with recovery."
    )
    assert of_error(text) == Invalidation("recovery_conflict")


@given(st.sampled_from(REASONS), st.text(min_size=1, max_size=30).filter(str.isprintable))
def test_the_line_is_one_line_naming_slot_reason_cause_and_fix(reason: str, slot: str) -> None:
    line = Invalidation(reason).line(slot)
    assert "\n" not in line
    assert f"'{slot}'" in line and f"({reason})" in line and Invalidation(reason).cause in line
    assert "auto mode" in line and "cdc-outbox drop --yes" in line


def test_the_line_says_how_to_prevent_each_known_cause() -> None:
    assert "raise max_slot_wal_keep_size" in Invalidation("wal_removed").line("s")
    assert "raise idle_replication_slot_timeout" in Invalidation("idle_timeout").line("s")
    for conflict in ("rows_removed", "recovery_conflict"):
        assert "keep hot_standby_feedback on" in Invalidation(conflict).line("s")
    assert "keep wal_level = logical" in Invalidation("wal_level_insufficient").line("s")
    assert "from happening" not in Invalidation("unknown").line("s")


def test_cdc_modes_error_cannot_heal_and_exits_8() -> None:
    exc = SlotInvalidated(Invalidation("wal_removed").line("s"))
    assert exc.exit_code == 8 and classify(exc).kind is FailureClass.HALT


def test_an_invalidation_reason_alone_makes_the_catch_up_rule_recreate_the_slot() -> None:
    slot = SlotStatus(
        "s", "logical", False, None, Lsn(1), None, 0, None, "unreserved", None, "pgoutput", "db",
        invalidation_reason="idle_timeout",
    )  # fmt: skip
    state = RelayState(Phase.STREAMING, Lsn(1))
    assert catch_up_reason(state, slot) == "the slot was invalidated (idle_timeout)"
