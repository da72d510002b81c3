"""Slot housekeeping only by the leader, and nothing left holding a snapshot (issue 23)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from cdc_outbox.service.housekeeping import drop_slot_quietly
from cdc_outbox.service.relay_service import Service
from cdc_outbox.service.wiring import build_service
from cdc_outbox.store.relay_state import NotLeader, Phase
from tests.support.helpers import wait_until
from tests.support.relay import init_for_catch_up, init_outbox, relay_settings


def _slot_exists(dsn: str, slot: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
    return row is not None


def _set_lease(dsn: str, slot: str, leader: str, *, valid: bool) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "UPDATE cdc_outbox_relay_state SET leader_id = %s,"
            " lease_until = now() + (CASE WHEN %s THEN 60 ELSE -1 END) * interval '1 second'"
            " WHERE slot_name = %s",
            (leader, valid, slot),
        )


def test_only_the_lease_holder_drops_the_slot(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """A frozen ex-leader that wakes up after a takeover must not drop the slot the new
    leader created (the drop checks the lease in the same statement)."""
    settings = relay_settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    init_outbox(settings)
    slot = settings.slot_name
    assert _slot_exists(pg_dsn, slot)
    _set_lease(pg_dsn, slot, "new-leader", valid=True)
    drop_slot_quietly(settings, leader_id="old-leader")
    assert _slot_exists(pg_dsn, slot)
    _set_lease(pg_dsn, slot, "old-leader", valid=False)  # its lease ran out
    drop_slot_quietly(settings, leader_id="old-leader")
    assert _slot_exists(pg_dsn, slot)
    _set_lease(pg_dsn, slot, "old-leader", valid=True)
    drop_slot_quietly(settings, leader_id="old-leader")
    assert not _slot_exists(pg_dsn, slot)


def test_a_failed_switch_to_streaming_leaves_no_walsender_holding_the_snapshot(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catch-up finished, but writing STREAMING fails (the lease was lost): the catch-up
    relay's walsender, idle with its exported snapshot (holding xmin back), must be closed."""
    settings = relay_settings(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, mode="cdc"
    )
    init_for_catch_up(settings)
    original = Service._write_phase
    failed = threading.Event()

    def write_phase(self: Service, lead: Any, phase: Phase, **kw: Any) -> None:
        if phase is Phase.STREAMING:
            failed.set()
            raise NotLeader("lease lost (test)")
        original(self, lead, phase, **kw)

    monkeypatch.setattr(Service, "_write_phase", write_phase)
    service = build_service(settings)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        wait_until(failed.is_set, timeout=60, message="the catch-up never finished")

        def walsenders() -> int:
            with psycopg.connect(pg_dsn) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'"
                    " AND datname = current_database()"
                ).fetchone()
            return int(row[0]) if row else -1

        # It stands by after losing the lease, takes it again and catches up again (the
        # patched write fails each time); in between, no walsender may stay behind.
        wait_until(lambda: walsenders() == 0, timeout=30, message=lambda: f"{walsenders()}")
    finally:
        service.request_stop()
        thread.join(60)
    assert not thread.is_alive()
