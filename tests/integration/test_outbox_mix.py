"""One relay, several outboxes (issue 36's acceptance, real PostgreSQL/Kafka): ``public.outbox``
(default layout, marked PUBLISHED) + ``shipping.events`` (Debezium layout, rows deleted once
published, its own topic template) + table-less events (``message_prefix``, mapped as the
first outbox's rows), at least once and exactly once.

Rows of both tables written before the slot exists are published by the catch-up (per
table, each in its commit order), later ones and the table-less events by the stream. The
same aggregate ids are used in both tables: each table is its own sequence (table-less
events share the first outbox's). Every event is delivered (exactly once: no duplicate,
read_committed), in order per (table, aggregate), and every row is marked or deleted.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import psycopg
import pytest

from cdc_outbox.cdc.relay_build import build_relay
from cdc_outbox.config.settings import Settings
from cdc_outbox.store import schema
from cdc_outbox.writer import OutboxTable, write_event
from cdc_outbox_dev.readback import read_topics
from tests.support.helpers import arrivals_and_order, wait_until
from tests.support.relay import init_outbox, relay_settings, running, wait_streamed_past_now

PREFIX = "app.outbox"
SHIPPING = OutboxTable(schema="shipping", table="events", preset="debezium")
AGGREGATES = ("k-1", "k-2", "k-3")


class _Writer:
    """One event per transaction; ``seq`` counts per (sequence, aggregate): the first
    outbox's rows and the table-less events are one sequence, shipping.events another."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.seq: Counter[tuple[str, str]] = Counter()
        self.ids: dict[str, list[str]] = defaultdict(list)  # "orders" / "shipping"

    def write(self, kind: str, n: int) -> None:
        sequence = "shipping" if kind == "shipping" else "orders"
        with psycopg.connect(self.dsn) as conn:
            for i in range(n):
                agg = AGGREGATES[i % len(AGGREGATES)]
                self.seq[sequence, agg] += 1
                payload = {"seq": self.seq[sequence, agg], "kind": kind}
                eid = write_event(
                    conn,
                    "order",
                    agg,
                    "Placed",
                    payload,
                    table=SHIPPING if kind == "shipping" else OutboxTable(),
                    message_prefix=PREFIX if kind == "message" else None,
                )
                conn.commit()
                self.ids[sequence].append(str(eid))


def _settings(dsn: str, bootstrap: str, prefix: str, delivery: str) -> Settings:
    values = relay_settings(dsn, bootstrap, prefix).model_dump(
        exclude_unset=True, exclude={"topic_template"}
    )
    values.update(
        dsn=dsn,
        delivery=delivery,
        message_prefix=PREFIX,
        eos={"checkpoint_topic": f"{prefix}.checkpoints"},
        outboxes=[
            {"topic_template": prefix + ".event.{aggregate_type}"},
            {
                "schema": "shipping",
                "table": "events",
                "columns": {"preset": "debezium"},
                "cdc_mark_published": "delete",
                "topic_template": prefix + ".ship.{aggregate_type}",
            },
        ],
    )
    return Settings.model_validate(values)


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_default_and_debezium_tables_and_table_less_events_through_one_slot(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str, delivery: str
) -> None:
    bootstrap, prefix = kafka_broker.bootstrap_servers, kafka_topic_prefix
    init_outbox(relay_settings(pg_dsn, bootstrap, prefix))  # public.outbox, publication, slot
    settings = _settings(pg_dsn, bootstrap, prefix, delivery)
    debezium = Settings.model_validate(
        {
            "dsn": pg_dsn,
            "outbox_schema": "shipping",
            "outbox_table": "events",
            "columns": {"preset": "debezium"},
        }
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA shipping")
        for stmt in schema.outbox_table_ddl(debezium):
            conn.execute(stmt)
        conn.execute(f"ALTER PUBLICATION {settings.publication_name} ADD TABLE shipping.events")
        conn.execute("SELECT pg_drop_replication_slot(%s)", (settings.slot_name,))
    w = _Writer(pg_dsn)
    w.write("orders", 7)  # before the slot: the catch-up's
    w.write("shipping", 8)
    relay = build_relay(settings)
    _, caught_up = relay.catch_up()
    assert caught_up == 15
    committed = delivery == "exactly_once"
    with running(relay):
        for kind, n in (("shipping", 5), ("message", 4), ("orders", 5), ("shipping", 4)):
            w.write(kind, n)
        w.write("message", 3)
        wait_streamed_past_now(pg_dsn, settings.slot_name, 120, lambda: f"{relay.stats}",
                               phase=False)  # fmt: skip

        def delivered() -> bool:
            extra = {"isolation.level": "read_committed" if committed else "read_uncommitted"}
            return all(
                len(
                    arrivals_and_order(
                        read_topics(bootstrap, topic, extra_config=extra), w.ids[seq]
                    )[0]
                )
                == len(w.ids[seq])
                for seq, topic in (("orders", f"{prefix}.event."), ("shipping", f"{prefix}.ship."))
            )

        wait_until(delivered, timeout=60, interval=0.5, message=lambda: f"{relay.stats}")
        assert relay.marker is not None
        wait_until(lambda: relay.marker is not None and relay.marker.unmarked == 0, timeout=30)
    extra = {"isolation.level": "read_committed" if committed else "read_uncommitted"}
    for seq, topic in (("orders", f"{prefix}.event."), ("shipping", f"{prefix}.ship.")):
        counts, broken = arrivals_and_order(
            read_topics(bootstrap, topic, extra_config=extra), w.ids[seq]
        )
        assert not [i for i in w.ids[seq] if counts[i] == 0], f"{seq}: events lost"
        assert not broken, f"{seq}: order broken {broken[:5]}"
        if committed:
            assert max(counts.values()) == 1, f"{seq}: duplicated"
    with psycopg.connect(pg_dsn) as conn:
        statuses = dict(conn.execute("SELECT status, count(*) FROM outbox GROUP BY 1").fetchall())
        left = conn.execute("SELECT count(*) FROM shipping.events").fetchone()
    assert statuses == {"PUBLISHED": 12}  # rows only: table-less events leave nothing
    assert left == (0,)  # every shipping row deleted once published
