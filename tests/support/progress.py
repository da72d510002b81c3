"""A relay's progress seen from outside (rows marked, the slot confirmed past now) and the
walsender fault struck from outside."""

from __future__ import annotations

import psycopg

from cdc_outbox.config.settings import Settings
from tests.support.helpers import wait_until
from tests.support.relay import outbox_statuses, slot_holder, wait_streamed_past_now
from tests.support.relay_process import RelayProcess


def wait_relayed(dsn: str, settings: Settings, relay: RelayProcess | None, timeout: float) -> None:
    """Every transaction committed so far is relayed: the phase is STREAMING (for a process)
    and the slot is confirmed past the WAL end as of now."""
    wait_streamed_past_now(
        dsn,
        settings.slot_name,
        timeout,
        message=lambda: relay.log_tail() if relay else "",
        phase=relay is not None,
    )


def relay_events_marked(dsn: str) -> int:
    """Outbox rows marked PUBLISHED so far (the relay's progress, seen from outside)."""
    return outbox_statuses(dsn).get("PUBLISHED", 0)


def terminate_walsender(dsn: str, slot: str, relay: RelayProcess) -> int:
    """Terminate the slot's walsender once it streams again; returns its pid."""
    wait_until(lambda: slot_holder(dsn, slot) is not None, timeout=60, message=relay.log_tail)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT active_pid, pg_terminate_backend(active_pid) FROM pg_replication_slots"
            " WHERE slot_name = %s AND active",
            (slot,),
        ).fetchone()
    assert row is not None and row[1], "the walsender was not terminated"
    return int(row[0])


def status_updates_after(dsn: str, slot: str, since: float, count: int) -> None:
    """Wait until the walsender of ``slot`` has received ``count`` standby status updates sent
    after ``since`` (unix time; the relay's clock is the test's: one host)."""
    seen: set[float] = set()

    def enough() -> bool:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM r.reply_time)::float8 FROM pg_stat_replication r"
                " JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = %s",
                (slot,),
            ).fetchone()
        if row is not None and row[0] is not None and row[0] > since:
            seen.add(row[0])
        return len(seen) >= count

    wait_until(enough, timeout=30, interval=0.1, message=f"{len(seen)} status updates")
