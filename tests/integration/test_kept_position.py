"""The confirmed position kept in the state table (``cdc_outbox.store.relay_state``).

PostgreSQL 15 saves a logical slot's confirmed position to disk only now and then, and never
while a transaction older than the slot's restart point is open; after a crash the slot is
back at its last saved position. Without a position of its own the relay would re-send
everything since then.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest

from cdc_outbox.admin import lifecycle
from cdc_outbox.lsn import Lsn
from cdc_outbox_dev import workload
from tests.support.helpers import wait_until
from tests.support.relay import (
    all_relayed,
    current_wal_lsn,
    init_outbox,
    relay_settings,
    relay_thread,
    service_thread,
    slot_position,
    tally_topics,
    wait_streamed_past_now,
)
from tests.support.relay_process import RelayProcess


def _kept(dsn: str, slot: str) -> Lsn:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT confirmed_lsn::text FROM cdc_outbox_relay_state WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    return Lsn.parse(row[0]) if row and row[0] else Lsn(0)


def test_a_postgres_crash_does_not_send_the_relay_back_to_the_slots_saved_position(
    pg_dsn: str, pg_server: Any, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    settings = relay_settings(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, mode="cdc"
    )
    init_outbox(settings)
    columns = settings.column_names()
    spec = workload.WorkloadSpec(events=3_000, writers=2, aggregates=40, txn_sizes=(1, 10, 50))
    old = psycopg.connect(pg_dsn)
    relay = RelayProcess(settings, "kept-position")
    try:
        relay.start()
        wait_streamed_past_now(pg_dsn, settings.slot_name, 60, relay.log_tail)
        # An open transaction with an xid pins the slot's restart point: PostgreSQL saves
        # (nearly) none of the confirmations below, so the crash takes the slot back.
        old.execute("SELECT txid_current()")
        workload.write_orders(pg_dsn, spec, columns=columns)
        target = current_wal_lsn(pg_dsn)
        wait_until(
            lambda: slot_position(pg_dsn, settings.slot_name)[0] >= target,
            timeout=120,
            message=relay.log_tail,
        )
        wait_until(  # a lease renewal kept it (every leader_lease_s / 5)
            lambda: _kept(pg_dsn, settings.slot_name) >= target,
            timeout=30,
            message=relay.log_tail,
        )
        pg_server.crash()
        old.close()
        pg_server.start()
        rewound = slot_position(pg_dsn, settings.slot_name)[0]
        print(f"confirmed {target}, the slot after the crash {rewound}")
        assert rewound < target  # the fault this test is about did happen
        after = workload.WorkloadSpec(events=1_000, writers=2, aggregate_type="refund")
        workload.write_orders(pg_dsn, after, columns=columns)  # seqs of new aggregates
        wait_streamed_past_now(pg_dsn, settings.slot_name, 120, relay.log_tail)
        assert relay.alive, relay.log_tail()
    finally:
        old.close()
        relay.stop_quietly()
    verdict = all_relayed(
        pg_dsn, settings, kafka_broker.bootstrap_servers, kafka_topic_prefix, 4_000
    )
    assert verdict.duplicates == 0  # without the kept position: the first 3,000 again


def _drop_column(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE cdc_outbox_relay_state DROP COLUMN confirmed_lsn")


def _has_column(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'cdc_outbox_relay_state' AND column_name = 'confirmed_lsn'"
        ).fetchone()
    return bool(row and row[0])


def test_a_state_table_made_by_an_older_init_gets_the_column_or_a_warning(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = relay_settings(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, mode="cdc"
    )
    init_outbox(settings)
    _drop_column(pg_dsn)
    assert [a.name for a in lifecycle.init(settings).actions] == ["add_confirmed_lsn"]
    assert _has_column(pg_dsn)
    _drop_column(pg_dsn)
    with service_thread(settings):  # a role that may: the service adds it on start
        wait_until(lambda: _has_column(pg_dsn), timeout=30)
    _drop_column(pg_dsn)
    columns = settings.column_names()
    spec = workload.WorkloadSpec(events=200, writers=1, aggregates=10, txn_sizes=(1, 10))
    caplog.set_level(logging.WARNING, logger="cdc_outbox.store.relay_state")
    with relay_thread(settings):  # without it: relays as before, says so once
        workload.write_orders(pg_dsn, spec, columns=columns)
        wait_streamed_past_now(pg_dsn, settings.slot_name, 60, phase=False)
    warned = [r for r in caplog.records if "no confirmed_lsn column" in r.getMessage()]
    assert len(warned) == 1
    verdict = tally_topics(pg_dsn, settings, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    assert verdict.ok and verdict.expected == 200, verdict.summary()
