"""A range-partitioned outbox table (by ``created_at``) relayed in every mode.

The table has the default preset's columns with primary key ``(id, created_at)`` and two
partitions holding rows: the first events are written with ``created_at`` a day back (the
column default is shifted while they are written), so both partitions hold rows and their
ctids collide, the case in which a ctid alone does not name a row. Every event must reach
Kafka in per-aggregate order and every row must end PUBLISHED.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from cdc_outbox.admin import lifecycle
from cdc_outbox.config.settings import Settings
from cdc_outbox.store import schema
from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import read_topics
from tests.support.helpers import wait_until
from tests.support.relay import outbox_statuses, relay_settings, service_thread

# (phase, aggregate type, events): each write_orders call numbers its aggregates' events
# from 1, so each phase uses its own aggregate type (own aggregates, own topic).
BACKDATED = ("order", 1_500)  # before the relay starts, created_at one day back
BEFORE = ("invoice", 750)  # before the relay starts
DURING = ("shipment", 750)  # while the relay runs
TOTAL = BACKDATED[1] + BEFORE[1] + DURING[1]


def _settings(dsn: str, bootstrap_servers: str, prefix: str, mode: str) -> Settings:
    return relay_settings(
        dsn,
        bootstrap_servers,
        prefix,
        mode=mode,
        cdc_probe_interval_s=1.0,
        polling={"poll_interval_s": 0.05},
    )


def _execute(dsn: str, *stmts: sql.Composable) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in stmts:
            conn.execute(stmt)


def create_partitioned_outbox(settings: Settings) -> None:
    """The default preset's outbox columns (copied from the generated DDL), range-partitioned
    by created_at: partitions for the two days back, today and tomorrow; the polling indexes
    created on the partitioned table."""
    table = schema.outbox_ident(settings)
    reference = settings.model_copy(update={"outbox_table": "outbox_reference"})
    bounds = (
        ("outbox_old", "now() - interval '2 days'", "now() - interval '12 hours'"),
        ("outbox_now", "now() - interval '12 hours'", "now() + interval '1 day'"),
        ("outbox_next", "now() + interval '1 day'", "now() + interval '2 days'"),
    )
    _execute(
        settings.postgres_dsn(),
        *schema.outbox_table_ddl(reference),
        sql.SQL(
            "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS,"
            " PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)"
        ).format(table, schema.outbox_ident(reference)),
        *(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                sql.Identifier(settings.outbox_schema, name), table, sql.SQL(low), sql.SQL(high)
            )
            for name, low, high in bounds
        ),
        sql.SQL("CREATE INDEX ON {} (available_at) WHERE status = 'PENDING'").format(table),
        sql.SQL(
            "CREATE INDEX ON {} (aggregate_id, created_at)"
            " WHERE status IN ('PENDING', 'PROCESSING')"
        ).format(table),
        sql.SQL("DROP TABLE {}").format(schema.outbox_ident(reference)),
    )


def _set_created_at_default(settings: Settings, default: str) -> None:
    _execute(
        settings.postgres_dsn(),
        sql.SQL("ALTER TABLE {} ALTER COLUMN created_at SET DEFAULT {}").format(
            schema.outbox_ident(settings), sql.SQL(default)
        ),
    )


def _write(settings: Settings, phase: tuple[str, int], backdated: bool = False) -> None:
    """One phase of orders from 3 writers; ``backdated``: created_at one day back."""
    if backdated:
        _set_created_at_default(settings, "clock_timestamp() - interval '1 day'")
    aggregate_type, events = phase
    spec = workload.WorkloadSpec(
        events=events, writers=3, aggregates=30, txn_sizes=(1, 5, 20), aggregate_type=aggregate_type
    )
    report = workload.write_orders(settings.postgres_dsn(), spec, columns=settings.column_names())
    assert report.committed == events
    if backdated:
        _set_created_at_default(settings, "clock_timestamp()")


def _partition_layout(dsn: str) -> tuple[dict[str, int], int]:
    """Rows per partition, and how many ctids occur in more than one partition."""
    with psycopg.connect(dsn) as conn:
        counts = dict(
            conn.execute("SELECT tableoid::regclass::text, count(*) FROM outbox GROUP BY 1")
        )
        row = conn.execute(
            "SELECT count(*) FROM (SELECT ctid FROM outbox GROUP BY ctid HAVING count(*) > 1) d"
        ).fetchone()
    assert row is not None
    return counts, int(row[0])


def _slot_exists(dsn: str, slot: str) -> bool:
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        return found.fetchone() is not None


@pytest.mark.parametrize("mode", ["cdc", "polling", "auto"])
def test_partitioned_outbox_relays_every_event_in_order(
    mode: str, pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    settings = _settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, mode)
    create_partitioned_outbox(settings)
    lifecycle.init(settings, create_table=False)
    if mode == "auto":
        # No slot: auto mode creates one with an exported snapshot and publishes the rows
        # pending in it (both partitions) before streaming.
        drop = sql.SQL("SELECT pg_drop_replication_slot({})")
        _execute(pg_dsn, drop.format(sql.Literal(settings.slot_name)))
    _write(settings, BACKDATED, backdated=True)
    _write(settings, BEFORE)
    counts, shared_ctids = _partition_layout(pg_dsn)
    assert counts == {"outbox_old": BACKDATED[1], "outbox_now": BEFORE[1]}
    assert shared_ctids > 0  # the case under test: one ctid, two rows
    with service_thread(settings) as service:
        if mode == "auto":
            wait_until(lambda: _slot_exists(pg_dsn, settings.slot_name), timeout=60)
        _write(settings, DURING)
        wait_until(
            lambda: outbox_statuses(pg_dsn) == {"PUBLISHED": TOTAL},
            timeout=180,
            interval=0.5,
            message=lambda: f"statuses {outbox_statuses(pg_dsn)}",
        )
        assert service.stats.mode == ("polling" if mode == "polling" else "cdc")
    stored = workload.stored_events(pg_dsn, columns=settings.column_names())
    records = read_topics(kafka_broker.bootstrap_servers, f"{kafka_topic_prefix}.event.")
    verdict = workload.tally(stored, records)
    assert verdict.ok, verdict.summary() + f" {verdict.order_violations[:5]}"
    assert verdict.expected == TOTAL


def test_preflight_wants_publish_via_partition_root(pg_dsn: str) -> None:
    settings = _settings(pg_dsn, "127.0.0.1:9", "unused", "cdc")
    create_partitioned_outbox(settings)
    pub = sql.Identifier(settings.publication_name)
    _execute(
        pg_dsn,
        sql.SQL("CREATE PUBLICATION {} FOR TABLE outbox WITH (publish = 'insert')").format(pub),
    )

    def publication_check() -> lifecycle.Check:
        with lifecycle.connect(settings) as conn:
            checks = lifecycle.preflight(conn, settings)
        [found] = [c for c in checks if c.name == "publication"]
        return found

    failed = publication_check()
    assert not failed.ok
    assert "lacks publish_via_partition_root" in failed.detail, failed.detail
    assert "covers" not in failed.detail  # listed as its two leaves, which is the whole table
    with pytest.raises(lifecycle.PreflightFailed, match="publish_via_partition_root"):
        lifecycle.init(settings, create_table=False)
    _execute(pg_dsn, sql.SQL(failed.fix))  # the fix, as printed, repairs it
    assert publication_check().ok
    with psycopg.connect(pg_dsn) as conn:
        listed = conn.execute(
            "SELECT tablename FROM pg_publication_tables WHERE pubname = %s",
            (settings.publication_name,),
        ).fetchall()
    assert listed == [("outbox",)]
