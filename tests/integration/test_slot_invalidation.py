"""A slot PostgreSQL really invalidated while the relay was stopped: auto mode recreates it and
catches up with nothing lost; cdc mode exits 8 with one line naming the cause and the fix, and
the fix it names works.

Each test runs once per cause the server can really produce (:data:`CAUSES`, from the major
``CDC_OUTBOX_PG_VERSION`` selects): ``wal_removed`` (``max_slot_wal_keep_size``) on every major,
read from ``invalidation_reason`` on 17+ and from ``wal_status`` on 15/16; ``idle_timeout``
(``idle_replication_slot_timeout``, seconds, checked at checkpoints) on 18+. A recovery
conflict invalidates a standby's slot only: on 16+ (logical decoding on a standby) the last
test keeps a copy of the relay's slot on a standby without ``hot_standby_feedback`` (as HA
tools' standby slots are kept, there with the feedback on), removes catalog rows on the
primary, promotes the standby and runs the relay on it: 17+ says ``rows_removed``, 16 only
that it conflicted with recovery. ``wal_level_insufficient`` cannot be caused with the relay's
slot: a primary refuses to start with ``wal_level < logical`` while a logical slot exists.
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest

from cdc_outbox.config.settings import Settings
from cdc_outbox_dev import workload
from cdc_outbox_dev.sandbox import standby as sb
from cdc_outbox_dev.sandbox._pg_os import find_bindir
from cdc_outbox_dev.sandbox.postgres import LocalPostgres
from tests.support.helpers import run_cli, wait_until
from tests.support.relay import (
    all_relayed,
    init_outbox,
    outbox_statuses,
    relay_settings,
    service_thread,
    wait_streamed_past_now,
)
from tests.support.relay_process import RelayProcess, settings_env

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


def _invalidate_by(
    dsn: str,
    slot: str,
    reason: str,
    setting: str,
    value: str,
    churn: Callable[[psycopg.Connection], None],
) -> None:
    """Set ``setting`` to ``value``, run ``churn`` and checkpoint until the server invalidates
    ``slot``; then reset the setting (so the recreated slot is not invalidated) and check that
    17+ names ``reason``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")

        def lost() -> bool:
            churn(conn)
            conn.execute("CHECKPOINT")
            status = _slot(dsn, slot)
            assert status is not None, "the slot disappeared"
            return status[0] == "lost"

        try:
            wait_until(lost, timeout=60, interval=0.1, message=lambda: f"{_slot(dsn, slot)}")
        finally:
            conn.execute(f"ALTER SYSTEM RESET {setting}")
            conn.execute("SELECT pg_reload_conf()")
    if (status := _slot(dsn, slot)) is not None and status[1] is not None:
        assert status[1] == reason


def _remove_wal(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS filler (x text)")
    conn.execute("INSERT INTO filler VALUES ('x')")
    conn.execute("SELECT pg_switch_wal()")


def _invalidate(dsn: str, slot: str, cause: str) -> None:
    """Make the server invalidate the inactive ``slot`` for ``cause``: ``wal_removed`` shrinks
    max_slot_wal_keep_size to 1 MB and switches WAL segments; ``idle_timeout`` sets
    idle_replication_slot_timeout to 1 s (the least non-zero value: seconds on 18.1, 0 is off) and
    waits for a checkpoint past it."""
    if cause == "wal_removed":
        _invalidate_by(dsn, slot, cause, "max_slot_wal_keep_size", "1MB", _remove_wal)
    else:
        _invalidate_by(dsn, slot, cause, "idle_replication_slot_timeout", "1s", lambda _: None)


def _server_major() -> int:
    """The major of the server binaries the sandbox runs (``postgres --version``)."""
    out = subprocess.run(
        [str(find_bindir() / "postgres"), "--version"], capture_output=True, text=True, check=True
    )
    match = re.search(r"\) (\d+)", out.stdout)
    assert match is not None, out.stdout
    return int(match.group(1))


MAJOR = _server_major()
#: The causes this server can really produce; a cause is a case only where it exists.
CAUSES = ("wal_removed", "idle_timeout") if MAJOR >= 18 else ("wal_removed",)
#: The setting the cdc-mode line names as the way to keep it from happening again.
_PREVENTED_BY = {
    "wal_removed": "max_slot_wal_keep_size",
    "idle_timeout": "idle_replication_slot_timeout",
    "rows_removed": "hot_standby_feedback",
    "recovery_conflict": "hot_standby_feedback",
}


def _stopped_with_backlog(dsn: str, settings: Settings, cause: str) -> None:
    """Relay ``EVENTS_BEFORE`` events, stop, write more, then lose the slot to ``cause``."""
    with service_thread(settings) as service:
        _write(dsn, settings, EVENTS_BEFORE, "order")
        wait_until(lambda: outbox_statuses(dsn) == {"PUBLISHED": EVENTS_BEFORE}, timeout=90)
        assert service.stats.mode == "cdc"
    _write(dsn, settings, EVENTS_WHILE_STOPPED, "invoice")  # in the slot's WAL only
    _invalidate(dsn, settings.slot_name, cause)


@pytest.mark.parametrize("cause", CAUSES)
def test_auto_mode_recreates_an_invalidated_slot_and_loses_nothing(
    own_pg: LocalPostgres, kafka_broker, kafka_topic_prefix: str, cause: str
) -> None:
    dsn = own_pg.create_database(f"inv_auto_{cause}")
    settings = relay_settings(
        dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, mode="auto",
        cdc_probe_interval_s=1.0, slot_name=f"inv_auto_{cause}",
    )  # fmt: skip
    init_outbox(settings)
    _stopped_with_backlog(dsn, settings, cause)
    total = EVENTS_BEFORE + EVENTS_WHILE_STOPPED
    with service_thread(settings) as service:
        wait_until(
            lambda: outbox_statuses(dsn) == {"PUBLISHED": total},
            timeout=90,
            message=lambda: f"statuses {outbox_statuses(dsn)}",
        )
        wait_until(lambda: service.stats.mode == "cdc" and service.stats.phase == "STREAMING")
        assert service.stats.slot_invalidations == {cause: 1}
        assert service.stats.catch_ups == 1
        status = _slot(dsn, settings.slot_name)
        assert status is not None and status[0] != "lost", status  # recreated
    all_relayed(dsn, settings, kafka_broker.bootstrap_servers, kafka_topic_prefix, total)


@pytest.mark.parametrize("cause", CAUSES)
def test_cdc_mode_exits_8_naming_the_cause_and_the_fix_that_works(
    own_pg: LocalPostgres, kafka_broker, kafka_topic_prefix: str, cause: str
) -> None:
    dsn = own_pg.create_database(f"inv_cdc_{cause}")
    settings = relay_settings(
        dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, slot_name=f"inv_cdc_{cause}"
    )
    init_outbox(settings)
    _stopped_with_backlog(dsn, settings, cause)
    _expect_cdc_exit_8(settings, "slot-invalidated-cdc", cause)
    # The fix the line names: drop, start again in cdc mode, nothing lost.
    dropped = run_cli("drop", "--yes", **settings_env(settings))
    assert dropped.returncode == 0, dropped.stderr
    total = EVENTS_BEFORE + EVENTS_WHILE_STOPPED
    with service_thread(settings):
        wait_until(lambda: outbox_statuses(dsn) == {"PUBLISHED": total}, timeout=90)
    all_relayed(dsn, settings, kafka_broker.bootstrap_servers, kafka_topic_prefix, total)


def _expect_cdc_exit_8(settings: Settings, name: str, cause: str) -> None:
    """A cdc-mode ``run`` exits 8 with the one line naming ``cause`` and its prevention."""
    relay = RelayProcess(settings, name)
    relay.start()
    try:
        code = relay.wait(90)
    finally:
        relay.stop_quietly()
    log = relay.log_tail(20_000)
    assert code == 8, log
    lines = [line for line in log.splitlines() if f"was invalidated ({cause})" in line]
    assert lines and _PREVENTED_BY[cause] in lines[-1], log
    assert "auto mode" in lines[-1] and "cdc-outbox drop --yes" in lines[-1], lines[-1]


def _copy_slot_to_standby(
    primary: LocalPostgres, standby: LocalPostgres, db: str, slot: str
) -> None:
    """Create logical slot ``slot`` on the standby (16+); its creation waits for a snapshot of
    the primary's running transactions, which ``pg_log_standby_snapshot()`` writes."""
    created: list[object] = []
    thread = threading.Thread(
        target=lambda: created.append(
            _one(
                standby.dsn_for(db),
                "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                slot,
            )
        )
    )
    thread.start()

    def done() -> bool:
        _one(primary.dsn_for(db), "SELECT pg_log_standby_snapshot()")
        return not thread.is_alive()

    wait_until(done, timeout=60, interval=0.1)
    thread.join()
    assert created, "the standby's slot was not created"


def _one(dsn: str, query: str, *args: object) -> object:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, args or None).fetchone()
    return None if row is None else row[0]


def _remove_catalog_rows(
    primary: LocalPostgres, standby: LocalPostgres, dsn: str, db: str, slot: str
) -> None:
    """Leave dead catalog rows on the primary (a table created and dropped, two transactions),
    let the relay confirm past them (the primary's own slot then no longer keeps them), vacuum
    pg_class, until the standby, replaying the removal, invalidates its copy of ``slot``."""

    def invalidated() -> bool:
        with psycopg.connect(primary.dsn_for(db), autocommit=True) as conn:
            conn.execute("CREATE TABLE conflict_test (x int)")
            conn.execute("DROP TABLE conflict_test")
            conn.execute("SELECT pg_log_standby_snapshot()")
            wait_streamed_past_now(dsn, slot, timeout=60)
            conn.execute("VACUUM pg_class")
        sb.wait_replayed(standby, sb.current_lsn(primary))
        status = _slot(standby.dsn_for(db), slot)
        assert status is not None, "the standby's slot disappeared"
        return status[0] == "lost"

    wait_until(
        invalidated, timeout=90, interval=0.1, message=lambda: f"{_slot(standby.dsn_for(db), slot)}"
    )


if MAJOR >= 16:  # logical decoding (so a logical slot) on a standby exists from 16 on

    def test_a_slot_lost_to_a_recovery_conflict_on_the_promoted_standby_is_handled(
        pg_primary_standby: tuple[LocalPostgres, LocalPostgres],
        kafka_broker,
        kafka_topic_prefix: str,
    ) -> None:
        primary, standby = pg_primary_standby
        db, slot = "inv_conflict", "inv_conflict"
        primary.create_database(db)
        dsn = sb.multi_host_dsn([primary, standby], db, connect_timeout="3")
        servers = kafka_broker.bootstrap_servers
        settings = relay_settings(
            dsn, servers, kafka_topic_prefix, mode="auto", cdc_probe_interval_s=1.0, slot_name=slot
        )
        init_outbox(settings)
        sb.wait_replayed(standby, sb.current_lsn(primary))
        with service_thread(settings) as service:
            _copy_slot_to_standby(primary, standby, db, slot)
            _write(dsn, settings, EVENTS_BEFORE, "order")
            wait_until(lambda: outbox_statuses(dsn) == {"PUBLISHED": EVENTS_BEFORE}, timeout=90)
            assert service.stats.mode == "cdc"
            _remove_catalog_rows(primary, standby, dsn, db, slot)
        _write(dsn, settings, EVENTS_WHILE_STOPPED, "invoice")
        sb.wait_replayed(standby, sb.current_lsn(primary))
        primary.crash()
        sb.promote(standby)
        cause = "rows_removed" if MAJOR >= 17 else "recovery_conflict"
        _expect_cdc_exit_8(settings.model_copy(update={"mode": "cdc"}), "conflict-cdc", cause)
        total = EVENTS_BEFORE + EVENTS_WHILE_STOPPED
        with service_thread(settings) as service:
            wait_until(lambda: outbox_statuses(dsn) == {"PUBLISHED": total}, timeout=90)
            wait_until(lambda: service.stats.mode == "cdc" and service.stats.phase == "STREAMING")
            assert service.stats.slot_invalidations == {cause: 1}
            assert service.stats.catch_ups == 1
        all_relayed(dsn, settings, servers, kafka_topic_prefix, total)
