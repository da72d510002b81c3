"""Failover slots (PostgreSQL 17+, issue 24): the slot survives promotion, no catch-up.

A primary and a standby set up for slot synchronization (``make_standby(failover_slots=True)``:
physical slot, ``sync_replication_slots``, ``hot_standby_feedback``, ``dbname`` in
``primary_conninfo``, ``synchronized_standby_slots`` on the primary). ``init`` creates the slot
with ``failover = true``; the standby shows it ``synced``; the relay publishes, the primary is
killed (``-m immediate``), the standby promoted, and the relay (multi-host DSN) streams the
synchronized slot on the new primary: 0 lost, no catch-up (``stats.catch_ups``), duplicates
printed. On PostgreSQL 15/16 (``CDC_OUTBOX_PG_VERSION``) the same test checks that the
setting is ignored cleanly: the slot is created without failover and ``status --standby``'s
checks say the version has no failover slots.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import psycopg
import pytest

from cdc_outbox.admin import lifecycle
from cdc_outbox_dev import workload
from cdc_outbox_dev.sandbox import standby as sb
from cdc_outbox_dev.sandbox.postgres import LocalPostgres
from tests.support.helpers import run_cli, wait_until
from tests.support.relay import (
    init_outbox,
    outbox_statuses,
    relay_settings,
    service_thread,
    tally_topics,
    wait_streamed_past_now,
)


def _one(dsn: str, query: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return None if row is None else row[0]


def _synced(standby: LocalPostgres, slot: str, *, persistent: bool = False) -> bool:
    """``slot`` is synced on the standby (``persistent``: and no longer temporary: a synced
    slot stays temporary, and is dropped at promotion, until the primary's slot has moved past
    where the copy started). The standby's slot sync worker (``sync_replication_slots = on``)
    copies the slot periodically; while it runs ``pg_sync_replication_slots()`` is refused, so
    the test waits on the worker."""
    with psycopg.connect(standby.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT synced AND (NOT temporary OR NOT %s) FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (persistent, slot),
        ).fetchone()
    return row is not None and bool(row[0])


def test_a_synchronized_failover_slot_is_resumed_after_promotion_without_a_catch_up(
    kafka_broker: Any, kafka_topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with LocalPostgres() as primary:
        version = int(_one(primary.dsn, "SHOW server_version_num"))
        standby = sb.make_standby(
            primary, application_name="standby1", slot="standby1", failover_slots=version >= 170000
        )
        try:
            primary.create_database("fslots")
            sb.wait_replayed(standby, sb.current_lsn(primary))
            dsn = sb.multi_host_dsn([primary, standby], "fslots", connect_timeout="3")
            settings = relay_settings(dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
            with caplog.at_level(logging.INFO, logger="cdc_outbox.store.schema"):
                init_outbox(settings)
            slot = settings.slot_name
            checks = {c.name: c for c in lifecycle.standby_checks(settings, standby.dsn)}
            if version < 170000:
                assert "slot_failover ignored" in caplog.text
                assert _one(primary.dsn_for("fslots"), "SELECT count(*) FROM pg_replication_slots"
                            " WHERE slot_type = 'logical'") == 1  # fmt: skip
                assert list(checks) == ["standby"]
                assert not checks["standby"].ok and "no failover slots" in checks["standby"].detail
                return
            failover = "SELECT failover FROM pg_replication_slots WHERE slot_name = 'cdc_outbox'"
            assert _one(primary.dsn, failover) is True
            primary_checks = {c.name: c for c in lifecycle.status(settings).checks}
            assert not primary_checks["synchronized_standby_slots"].warning
            wait_until(lambda: _synced(standby, slot), timeout=120)
            servers = kafka_broker.bootstrap_servers
            _failover_with_the_relay(primary, standby, dsn, settings, servers, kafka_topic_prefix)
        finally:
            standby.close()


def _failover_with_the_relay(
    primary: LocalPostgres,
    standby: LocalPostgres,
    dsn: str,
    settings: Any,
    servers: str,
    prefix: str,
) -> None:
    spec = workload.WorkloadSpec(events=3_000, writers=2, aggregates=50, txn_sizes=(1, 5, 20))
    columns = settings.column_names()
    with service_thread(settings) as service:
        workload.write_orders(dsn, spec, columns=columns)
        wait_until(lambda: service.stats.events_published >= 3_000, timeout=180)
        # The relay's confirmations made the standby's copy persistent: usable after promotion.
        wait_until(lambda: _synced(standby, settings.slot_name, persistent=True), timeout=120)
        cli = run_cli("status", "--json", "--standby", standby.dsn, dsn=dsn)
        assert cli.returncode == 0, cli.stderr
        rows = json.loads(cli.stdout)["standby_checks"]
        assert [r["name"] for r in rows if r["ok"]] == [
            "sync_replication_slots",
            "hot_standby_feedback",
            "primary_slot_name",
            "primary_conninfo_dbname",
            "slot_synced",
        ], rows
        primary.crash()
        sb.promote(standby)
        # Other aggregates: versions restart at 1 per aggregate in each write_orders call.
        after = dataclasses.replace(spec, aggregate_type="invoice")
        workload.write_orders(dsn, after, columns=columns)
        wait_streamed_past_now(dsn, settings.slot_name, timeout=240)
        wait_until(lambda: "PENDING" not in outbox_statuses(dsn), timeout=120)
        catch_ups = service.stats.catch_ups
    verdict = tally_topics(dsn, settings, servers, prefix)
    print(
        f"failover slot: {verdict.expected} rows on the new primary; lost {len(verdict.missing)},"
        f" duplicates {verdict.duplicates}, phantoms {len(verdict.unexpected)}, catch-ups"
        f" {catch_ups}"
    )
    assert catch_ups == 0
    assert verdict.missing == []
    assert verdict.mismatched == []
    assert verdict.order_violations == []
