"""When the slot is streamed as it is and when a catch-up is needed (pure rules), and the
order a catch-up reads the backlog in."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr, ValidationError

from cdc_outbox.cdc import catch_up_order
from cdc_outbox.cdc.catch_up_rule import catch_up_reason
from cdc_outbox.cdc.slot_watch import SlotChanged, SlotWatch
from cdc_outbox.config.settings import Settings
from cdc_outbox.lsn import Lsn
from cdc_outbox.store import catch_up_sql
from cdc_outbox.store.inspection import SlotStatus
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.store.relay_state import Phase, RelayState, SlotFacts


def settings(**values: Any) -> Settings:
    return Settings(dsn=SecretStr("host=db.example dbname=shop"), **values)


def slot(flushed: int | None = 1_000, wal_status: str | None = "reserved") -> SlotStatus:
    lsn = None if flushed is None else Lsn(flushed)
    return SlotStatus(
        "cdc_outbox", "logical", False, None, lsn, lsn, 0, 0, wal_status, None, "pgoutput", "shop"
    )


def streaming(point: int | None = 1_000, confirmed: int | None = None) -> RelayState:
    return RelayState(
        Phase.STREAMING,
        None if point is None else Lsn(point),
        confirmed_lsn=None if confirmed is None else Lsn(confirmed),
    )


def test_the_slot_init_made_over_an_empty_table_is_streamed() -> None:
    # init wrote STREAMING at the new slot's consistent point; nobody consumed it since.
    assert catch_up_reason(streaming(point=1_000), slot(flushed=1_000)) is None


def test_a_slot_the_relay_confirmed_is_streamed() -> None:
    state = streaming(point=1_000, confirmed=9_000)
    assert catch_up_reason(state, slot(flushed=9_000)) is None
    # A PostgreSQL crash can move the slot's own position back: still ours.
    assert catch_up_reason(state, slot(flushed=5_000)) is None


def test_a_slot_past_every_recorded_position_was_recreated_by_someone_else() -> None:
    reason = catch_up_reason(streaming(point=1_000, confirmed=9_000), slot(flushed=9_001))
    assert reason is not None and "recreated by someone else" in reason
    # Or (17+) a synchronized copy promoted before the standby had our latest kept position
    # (issue 37 item 6b): indistinguishable here, so the rule stays safe (a catch-up) and
    # the line says so (docs/failover.md, "A synchronized slot ahead of the kept position").
    assert "synchronized copy" in reason and "docs/failover.md" in reason


def test_without_kept_positions_the_slot_is_streamed_as_before() -> None:
    state = streaming(point=1_000)
    assert catch_up_reason(state, slot(flushed=9_000), keeps_position=False) is None
    assert catch_up_reason(streaming(point=None), slot(flushed=9_000)) is None


@pytest.mark.parametrize(
    ("state", "the_slot", "words"),
    [
        (streaming(), None, "does not exist"),
        (streaming(), slot(wal_status="lost"), "invalidated"),
        (RelayState(Phase.CATCHING_UP), slot(), "phase CATCHING_UP"),
        (RelayState(Phase.POLLING), slot(), "phase POLLING"),
        (RelayState(Phase.CATCHING_UP, exists=False), slot(), "no relay state"),
    ],
)
def test_anything_else_needs_a_catch_up(
    state: RelayState, the_slot: SlotStatus | None, words: str
) -> None:
    reason = catch_up_reason(state, the_slot)
    assert reason is not None and words in reason


@given(
    point=st.integers(0, 2**40),
    confirmed=st.none() | st.integers(0, 2**40),
    flushed=st.integers(0, 2**40),
)
def test_streamed_exactly_when_the_slot_is_not_past_what_the_relay_recorded(
    point: int, confirmed: int | None, flushed: int
) -> None:
    """Streaming skips nothing: the slot starts at most where every earlier event is known to
    be in Kafka (the consistent point of its creation, or a confirmed position)."""
    reason = catch_up_reason(streaming(point, confirmed), slot(flushed))
    assert (reason is None) == (flushed <= max(point, confirmed or 0))


def test_the_rule_is_applied_again_at_every_session_start_once_it_held() -> None:
    """cdc/slot_watch.py: the first session start records whether the rule held (the service
    just applied it); later ones raise SlotChanged when it no longer does."""
    facts = [SlotFacts(streaming(point=1_000, confirmed=9_000), slot(flushed=9_000), True)]
    watch = SlotWatch(lambda: facts[-1])
    watch.check()
    watch.check()  # still the relay's own slot
    facts.append(SlotFacts(streaming(point=1_000, confirmed=9_000), slot(flushed=9_500), True))
    with pytest.raises(SlotChanged, match="recreated by someone else"):
        watch.check()
    facts.append(SlotFacts(RelayState(Phase.CATCHING_UP), slot(flushed=9_000), True))
    with pytest.raises(SlotChanged, match="phase CATCHING_UP"):
        watch.check()  # `init` recreated it and left the phase for the catch-up
    facts.append(SlotFacts(streaming(point=1_000, confirmed=9_000), None, True))
    with pytest.raises(SlotChanged, match="does not exist"):
        watch.check()


def test_a_relay_whose_first_session_did_not_pass_the_rule_is_not_checked() -> None:
    """Run outside the service (e.g. right after Relay.catch_up in a test: the phase is still
    CATCHING_UP), the relay streams as before."""
    facts = SlotFacts(RelayState(Phase.CATCHING_UP), slot(flushed=9_000), True)
    watch = SlotWatch(lambda: facts)
    watch.check()
    watch.check()


def render(settings: Settings, commit_ts: bool) -> str:
    return catch_up_sql.order_by(OutboxTable.of(settings), commit_ts).as_string(None)


def test_the_default_layout_orders_by_created_at() -> None:
    s = settings()
    assert render(s, False) == '"created_at", age(xmin) DESC, cmin::text::bigint, ctid'
    assert catch_up_order.table_order_key(OutboxTable.of(s), True) == "column created_at"


def test_the_debezium_layout_orders_by_commit_timestamps_where_the_server_keeps_them() -> None:
    s = settings(columns={"preset": "debezium"})
    assert render(s, True).startswith("pg_xact_commit_timestamp(xmin) NULLS FIRST, age(xmin)")
    assert render(s, False) == "age(xmin) DESC, cmin::text::bigint, ctid"
    # no key: init and preflight warn
    assert catch_up_order.table_order_key(OutboxTable.of(s), False) is None


def test_a_configured_sequence_column_wins() -> None:
    s = settings(columns={"preset": "debezium", "sequence": "version"})
    assert render(s, True).startswith('"version", age(xmin) DESC')
    assert catch_up_order.table_order_key(OutboxTable.of(s), False) == "column version"
    assert settings(columns={"sequence": ""}).columns.sequence is None


def test_a_sequence_column_must_be_an_identifier() -> None:
    with pytest.raises(ValidationError, match=r"columns\.sequence"):
        settings(columns={"sequence": "version; drop table"})
