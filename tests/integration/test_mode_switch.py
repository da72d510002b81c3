"""Auto mode under load: every forced switch between CDC and polling loses nothing.

Each test runs the real service (``mode=auto``) against the real PostgreSQL and Kafka, forces
a switch the way it happens in production, and then checks the tally: every committed event in
Kafka, in per-aggregate order; duplicates are reported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from cdc_outbox.config.settings import Settings
from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import read_topics
from cdc_outbox_dev.sandbox.postgres import LocalPostgres
from tests.support.helpers import wait_until
from tests.support.relay import (
    current_wal_lsn,
    drop_slot_under_the_relay,
    init_outbox,
    outbox_statuses,
    relay_settings,
    service_thread,
    slot_position,
)

AUTO = {"mode": "auto", "cdc_probe_interval_s": 1.0, "cdc_max_failures": 2}


def _auto_settings(dsn: str, kafka, prefix: str, **extra):
    return relay_settings(dsn, kafka.bootstrap_servers, prefix, **AUTO, **extra)


class _Writers:
    """Background writers at a fixed offered rate."""

    def __init__(self, dsn: str, settings, spec: workload.WorkloadSpec) -> None:
        self.report: list[workload.WriteReport] = []
        self.thread = threading.Thread(
            target=lambda: self.report.append(
                workload.write_orders(dsn, spec, columns=settings.column_names())
            ),
            name="writers",
        )
        self.thread.start()

    def join(self) -> None:
        self.thread.join(300)
        assert self.report, "writers failed"


def _all_delivered(dsn: str, settings, kafka, prefix: str, expected: int) -> workload.Tally:
    wait_until(
        lambda: outbox_statuses(dsn) == {"PUBLISHED": expected},
        timeout=180,
        interval=0.5,
        message=lambda: f"statuses {outbox_statuses(dsn)}",
    )
    stored = workload.stored_events(dsn, columns=settings.column_names())
    verdict = workload.tally(stored, read_topics(kafka.bootstrap_servers, f"{prefix}.event."))
    print(verdict.summary())
    return verdict


def _slot_exists(dsn: str, slot: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return (
            conn.execute(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            is not None
        )


def test_auto_mode_publishes_backlog_written_before_the_slot_existed(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    settings = _auto_settings(pg_dsn, kafka_broker, kafka_topic_prefix)
    init_outbox(settings)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (settings.slot_name,))
    spec = workload.WorkloadSpec(events=1_000, writers=2, aggregates=20, txn_sizes=(1, 10))
    workload.write_orders(pg_dsn, spec, columns=settings.column_names())  # no slot yet
    with service_thread(settings) as service:
        wait_until(lambda: _slot_exists(pg_dsn, settings.slot_name), timeout=60)
        later = workload.WorkloadSpec(
            events=1_000, writers=2, aggregates=20, txn_sizes=(1, 10), aggregate_type="invoice"
        )
        writers = _Writers(pg_dsn, settings, later)
        writers.join()
        verdict = _all_delivered(pg_dsn, settings, kafka_broker, kafka_topic_prefix, 2_000)
        assert service.stats.mode == "cdc"
    assert verdict.ok, verdict.summary()


def _fault_under_load(
    dsn: str, kafka, prefix: str, fault: Callable[[Settings], None], what: str
) -> None:
    """5,000 events at 1,000/s through the auto-mode service; ``fault`` strikes after 500."""
    settings = _auto_settings(dsn, kafka, prefix)
    init_outbox(settings)
    spec = workload.WorkloadSpec(events=5_000, writers=3, aggregates=60, rate=1_000)
    with service_thread(settings) as service:
        writers = _Writers(dsn, settings, spec)
        wait_until(lambda: service.stats.events_published > 500, timeout=60)
        fault(settings)
        writers.join()
        verdict = _all_delivered(dsn, settings, kafka, prefix, 5_000)
        assert service.stats.mode == "cdc"
    print(f"{what}: duplicates {verdict.duplicates}")
    assert verdict.ok, verdict.summary()


def test_slot_dropped_under_load_loses_nothing(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    _fault_under_load(
        pg_dsn,
        kafka_broker,
        kafka_topic_prefix,
        lambda settings: drop_slot_under_the_relay(pg_dsn, settings.slot_name),
        "slot dropped",
    )


def test_publication_removed_under_load_loses_nothing(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    def drop_publication(settings: Settings) -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(settings.publication_name))
            )

    _fault_under_load(
        pg_dsn, kafka_broker, kafka_topic_prefix, drop_publication, "publication removed"
    )


@pytest.fixture
def small_wal_pg() -> Iterator[LocalPostgres]:
    """A dedicated server whose slots are invalidated past 32 MB of retained WAL."""
    with LocalPostgres(
        settings={"max_slot_wal_keep_size": "32MB", "max_wal_size": "64MB"}
    ) as server:
        yield server


def test_slot_invalidated_by_max_slot_wal_keep_size_loses_nothing(
    small_wal_pg: LocalPostgres, kafka_broker, kafka_topic_prefix: str
) -> None:
    dsn = small_wal_pg.dsn
    settings = _auto_settings(dsn, kafka_broker, kafka_topic_prefix)
    init_outbox(settings)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ballast (id bigserial PRIMARY KEY, pad text)")
    spec = workload.WorkloadSpec(events=3_000, writers=2, aggregates=40, rate=600)
    with service_thread(settings) as service:
        writers = _Writers(dsn, settings, spec)
        wait_until(lambda: service.stats.events_published > 300, timeout=60)
        kafka_broker.stop()  # the relay can no longer confirm: the slot holds WAL
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:

                def lost() -> bool:
                    conn.execute(
                        "INSERT INTO ballast (pad) SELECT repeat(md5(g::text), 60)"
                        " FROM generate_series(1, 5000) g"
                    )
                    conn.execute("CHECKPOINT")
                    row = conn.execute(
                        "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s",
                        (settings.slot_name,),
                    ).fetchone()
                    return row is None or row[0] == "lost"

                wait_until(lost, timeout=120, interval=0.2)
        finally:
            kafka_broker.start()
        writers.join()
        verdict = _all_delivered(dsn, settings, kafka_broker, kafka_topic_prefix, 3_000)
        wait_until(lambda: service.stats.mode == "cdc", timeout=60)
    print(f"slot invalidated: duplicates {verdict.duplicates}")
    assert verdict.ok, verdict.summary()


def test_wal_level_replica_falls_back_to_polling_and_returns(
    kafka_broker, kafka_topic_prefix: str
) -> None:
    with LocalPostgres() as server:
        dsn = server.dsn
        settings = _auto_settings(dsn, kafka_broker, kafka_topic_prefix)
        init_outbox(settings)
        spec = workload.WorkloadSpec(events=4_000, writers=2, aggregates=40, rate=400)
        with service_thread(settings) as service:
            writers = _Writers(dsn, settings, spec)
            wait_until(lambda: service.stats.events_published > 300, timeout=60)
            # PostgreSQL refuses to start with logical slots under wal_level=replica, so the
            # operator drops the slot first (the relay is streaming from it).
            drop_slot_under_the_relay(dsn, settings.slot_name)
            server.restart(wal_level="replica")
            wait_until(lambda: service.stats.mode == "polling", timeout=90)
            polled_from = service.stats.events_published
            wait_until(lambda: service.stats.events_published > polled_from + 200, timeout=90)
            server.restart(wal_level="logical")
            wait_until(lambda: service.stats.mode == "cdc", timeout=90)
            writers.join()
            verdict = _all_delivered(dsn, settings, kafka_broker, kafka_topic_prefix, 4_000)
            # back on CDC for real: the new slot is confirmed up to the end of the WAL
            done_lsn = current_wal_lsn(dsn)
            wait_until(lambda: slot_position(dsn, settings.slot_name)[0] >= done_lsn, timeout=60)
        print(f"wal_level switch: duplicates {verdict.duplicates}")
        assert verdict.ok, verdict.summary()


def test_auto_mode_with_the_debezium_layout_relays_by_cdc_only(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    settings = _auto_settings(
        pg_dsn, kafka_broker, kafka_topic_prefix, columns={"preset": "debezium"}
    )
    init_outbox(settings)  # Debezium's table: id, aggregatetype, aggregateid, type, payload
    with service_thread(settings) as service, psycopg.connect(pg_dsn) as conn:
        for n in range(10):
            conn.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)"
                " VALUES (gen_random_uuid(), 'order', %s, 'OrderPlaced', %s)",
                (f"order-{n % 3}", f'{{"n": {n}}}'),
            )
        conn.commit()
        wait_until(lambda: service.stats.events_published >= 10, timeout=60)
        assert service.stats.mode == "cdc"
    records = read_topics(kafka_broker.bootstrap_servers, f"{kafka_topic_prefix}.event.")
    assert sorted(r.value for r in records) == sorted(f'{{"n": {n}}}'.encode() for n in range(10))
