"""A slot dropped and recreated while the relay is between sessions (issue 37, item 3).

The walsender is terminated; before the relay's next session starts, someone drops the slot,
commits rows, and creates the slot again: its consistent point is past those rows (the relay's
next session is held back in-process until then, so the timing is always this one). The
service-start rule (:mod:`cdc_outbox.cdc.catch_up_rule`: the slot confirmed past every
position the relay kept) must hold at that session start too, so the service catches up and
publishes them; streaming the new slot would skip them for good.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from cdc_outbox.cdc.relay import Relay
from cdc_outbox_dev import workload
from tests.support.helpers import wait_until
from tests.support.relay import (
    all_relayed,
    init_outbox,
    outbox_statuses,
    relay_settings,
    service_thread,
    wait_streamed_past_now,
)

_GAP = 10


def _recreate_slot(dsn: str, slot: str) -> None:
    """Terminate the walsender, drop the slot, commit ``_GAP`` rows, create the slot again."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
            " WHERE slot_name = %s AND active",
            (slot,),
        )

        def dropped() -> bool:
            try:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            except psycopg.errors.ObjectInUse:  # the walsender is still exiting
                return False
            return True

        wait_until(dropped, timeout=10.0, interval=0.01, message="the walsender did not exit")
        conn.execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
            " SELECT gen_random_uuid(), 'order', 'gap-' || g, 'Placed',"
            " jsonb_build_object('seq', 1) FROM generate_series(1, %s) g",
            (_GAP,),
        )
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def test_a_slot_recreated_while_the_relay_restarts_is_caught_up(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    settings = relay_settings(pg_dsn, bootstrap, kafka_topic_prefix, mode="cdc")
    init_outbox(settings)
    # The relay's next session waits (in this process) until the slot was recreated, so that
    # it starts on the new slot whatever the timing; everything else is real.
    gate, waiting = threading.Event(), threading.Event()
    gate.set()
    session = Relay._stream_session

    def gated_session(relay: Relay) -> None:
        if not gate.is_set():
            waiting.set()
            gate.wait(30)
        session(relay)

    monkeypatch.setattr(Relay, "_stream_session", gated_session)
    spec = workload.WorkloadSpec(events=200, writers=1, aggregates=20, txn_sizes=(1, 5))
    with service_thread(settings) as service:
        workload.write_orders(pg_dsn, spec, columns=settings.column_names())
        wait_streamed_past_now(pg_dsn, settings.slot_name, 60)
        catch_ups = service.stats.catch_ups
        gate.clear()
        _recreate_slot(pg_dsn, settings.slot_name)
        wait_until(waiting.is_set, timeout=30, message="the relay did not restart")
        gate.set()
        wait_until(
            lambda: outbox_statuses(pg_dsn).get("PENDING", 0) == 0,
            timeout=60,
            message=lambda: (
                f"rows committed while the slot was recreated still PENDING: "
                f"{outbox_statuses(pg_dsn)}, catch-ups {service.stats.catch_ups - catch_ups}"
            ),
        )
        assert service.stats.catch_ups == catch_ups + 1
    all_relayed(pg_dsn, settings, bootstrap, kafka_topic_prefix, 200 + _GAP)
