"""A slot PostgreSQL really invalidated (max_slot_wal_keep_size, WAL removed) while the relay
was stopped: auto mode recreates it and catches up with nothing lost; cdc mode exits 8 with
one line naming the cause and the fix, and the fix it names works.

Runs on every PostgreSQL major (``CDC_OUTBOX_PG_VERSION``): the reason is read from
``invalidation_reason`` on 17+ and from ``wal_status`` on 15/16.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from cdc_outbox.config import Settings
from cdc_outbox_dev import workload
from cdc_outbox_dev.sandbox.postgres import LocalPostgres
from tests.helpers import run_cli, wait_until
from tests.relay_support import (
    RelayProcess,
    all_relayed,
    init_outbox,
    outbox_statuses,
    relay_settings,
    service_thread,
    settings_env,
)

EVENTS_BEFORE, EVENTS_WHILE_STOPPED = 200, 300


@pytest.fixture(scope="module")
def own_pg() -> Iterator[LocalPostgres]:
    """A server of its own: shrinking max_slot_wal_keep_size invalidates every slot on it."""
    with LocalPostgres() as server:
        yield server


def _write(dsn: str, settings: Settings, events: int, kind: str) -> None:
    """``events`` rows over 20 aggregates of type ``kind`` (a batch's own: the tally checks
    each aggregate's sequence, which every batch starts at 0)."""
    spec = workload.WorkloadSpec(events=events, writers=1, aggregates=20, aggregate_type=kind)
    workload.write_orders(dsn, spec, columns=settings.column_names())


_SLOT_SQL = (
    "SELECT wal_status, to_jsonb(s) ->> 'invalidation_reason' FROM pg_replication_slots s"
    " WHERE slot_name = %s"
)


def _slot(dsn: str, slot: str) -> tuple[str | None, str | None] | None:
    """(wal_status, invalidation_reason) of ``slot`` (the reason is None before 17)."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(_SLOT_SQL, (slot,)).fetchone()  # type: ignore[return-value]


def _invalidate(dsn: str, slot: str) -> None:
    """Shrink max_slot_wal_keep_size to 1 MB, switch WAL segments and checkpoint until the
    server invalidates ``slot``; then restore the setting (a new slot is not invalidated)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS filler (x text)")
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")

        def lost() -> bool:
            conn.execute("INSERT INTO filler VALUES ('x')")
            conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
            status = _slot(dsn, slot)
            assert status is not None, "the slot disappeared"
            return status[0] == "lost"

        try:
            wait_until(lost, timeout=60, interval=0.1, message=lambda: f"{_slot(dsn, slot)}")
        finally:
            conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            conn.execute("SELECT pg_reload_conf()")
    if (reason := _slot(dsn, slot)) is not None and reason[1] is not None:
        assert reason[1] == "wal_removed"


def _stopped_with_backlog(dsn: str, settings: Settings) -> None:
    """Relay ``EVENTS_BEFORE`` events, stop, write more, then lose the slot."""
    with service_thread(settings) as service:
        _write(dsn, settings, EVENTS_BEFORE, "order")
        wait_until(lambda: outbox_statuses(dsn) == {"PUBLISHED": EVENTS_BEFORE}, timeout=90)
        assert service.stats.mode == "cdc"
    _write(dsn, settings, EVENTS_WHILE_STOPPED, "invoice")  # in the slot's WAL only
    _invalidate(dsn, settings.slot_name)


def test_auto_mode_recreates_an_invalidated_slot_and_loses_nothing(
    own_pg: LocalPostgres, kafka_broker, kafka_topic_prefix: str
) -> None:
    dsn = own_pg.create_database("inv_auto")
    settings = relay_settings(
        dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, mode="auto",
        cdc_probe_interval_s=1.0, slot_name="inv_auto",
    )  # fmt: skip
    init_outbox(settings)
    _stopped_with_backlog(dsn, settings)
    total = EVENTS_BEFORE + EVENTS_WHILE_STOPPED
    with service_thread(settings) as service:
        wait_until(
            lambda: outbox_statuses(dsn) == {"PUBLISHED": total},
            timeout=90,
            message=lambda: f"statuses {outbox_statuses(dsn)}",
        )
        wait_until(lambda: service.stats.mode == "cdc" and service.stats.phase == "STREAMING")
        assert service.stats.slot_invalidations == {"wal_removed": 1}
        assert service.stats.catch_ups == 1
        status = _slot(dsn, settings.slot_name)
        assert status is not None and status[0] != "lost", status  # recreated
    all_relayed(dsn, settings, kafka_broker.bootstrap_servers, kafka_topic_prefix, total)


def test_cdc_mode_exits_8_naming_the_cause_and_the_fix_that_works(
    own_pg: LocalPostgres, kafka_broker, kafka_topic_prefix: str
) -> None:
    dsn = own_pg.create_database("inv_cdc")
    settings = relay_settings(
        dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, slot_name="inv_cdc"
    )
    init_outbox(settings)
    _stopped_with_backlog(dsn, settings)
    relay = RelayProcess(settings, "slot-invalidated-cdc")
    relay.start()
    try:
        code = relay.wait(90)
    finally:
        relay.stop_quietly()
    log = relay.log_tail(20_000)
    assert code == 8, log
    lines = [line for line in log.splitlines() if "was invalidated (wal_removed)" in line]
    assert lines and "max_slot_wal_keep_size" in lines[-1], log
    assert "auto mode" in lines[-1] and "cdc-outbox drop --yes" in lines[-1], lines[-1]
    # The fix the line names: drop, start again in cdc mode, nothing lost.
    dropped = run_cli("drop", "--yes", **settings_env(settings))
    assert dropped.returncode == 0, dropped.stderr
    total = EVENTS_BEFORE + EVENTS_WHILE_STOPPED
    with service_thread(settings):
        wait_until(lambda: outbox_statuses(dsn) == {"PUBLISHED": total}, timeout=90)
    all_relayed(dsn, settings, kafka_broker.bootstrap_servers, kafka_topic_prefix, total)
