"""An outbox table added to a running setup loses nothing (issue 36, real PostgreSQL/Kafka).

A relay streams ``public.outbox`` (A) alone; ``shipping.events`` (B) already holds rows, is
added to the publication while that relay runs (it ignores B's inserts and confirms past
them), and more rows are committed into B (and A) before, while and after; the relay is then
restarted with ``[[outboxes]]`` = A + B on the same slot. Every row of B is published (at
least once; exactly once with ``delivery = "exactly_once"``, read_committed), B's aggregates in
their order (the same aggregate ids as A's, an independent sequence), and nothing of A is
lost.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from typing import Any

import psycopg
import pytest

from cdc_outbox.config.settings import Settings
from cdc_outbox.store import schema
from cdc_outbox.writer import OutboxTable, write_event
from cdc_outbox_dev.readback import read_topics
from tests.support.helpers import arrivals_and_order, wait_until
from tests.support.relay import init_outbox, relay_settings, relay_thread, wait_streamed_past_now

B = OutboxTable(schema="shipping", table="events")
AGGREGATES = ("a-1", "a-2", "a-3")


class _Writer:
    """Commits one event per transaction into A or B, numbering each (table, aggregate)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.seq: Counter[tuple[str, str]] = Counter()
        self.ids: dict[str, list[str]] = defaultdict(list)  # table -> ids in commit order

    def write(self, into: str, n: int) -> None:
        table = B if into == "B" else OutboxTable()
        with psycopg.connect(self.dsn) as conn:
            for i in range(n):
                agg = AGGREGATES[i % len(AGGREGATES)]
                self.seq[into, agg] += 1
                payload = {"seq": self.seq[into, agg], "table": into}
                eid = write_event(conn, "order", agg, "Placed", payload, table=table)
                conn.commit()
                self.ids[into].append(str(eid))


def _streamed(dsn: str, settings: Settings, relay: Any) -> None:
    """Wait until the relay confirmed past every transaction committed so far."""
    wait_streamed_past_now(dsn, settings.slot_name, 120, lambda: f"{relay.stats}", phase=False)


def _records(bootstrap: str, prefix: str, eos: bool) -> list[Any]:
    extra = {"isolation.level": "read_committed" if eos else "read_uncommitted"}
    return read_topics(bootstrap, prefix, timeout=60, extra_config=extra)


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_a_table_added_to_the_publication_later_loses_nothing(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str, delivery: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    prefix = kafka_topic_prefix
    eos = {"eos": {"checkpoint_topic": f"{prefix}.checkpoints"}}
    only_a = relay_settings(pg_dsn, bootstrap, prefix, delivery=delivery, **eos)
    init_outbox(only_a)
    b_single = Settings.model_validate(
        {"dsn": pg_dsn, "outbox_schema": "shipping", "outbox_table": "events"}
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA shipping")
        for stmt in schema.outbox_table_ddl(b_single):
            conn.execute(stmt)
    w = _Writer(pg_dsn)
    w.write("B", 6)  # before B is in the publication
    with relay_thread(only_a) as relay:
        w.write("A", 6)
        _streamed(pg_dsn, only_a, relay)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER PUBLICATION {only_a.publication_name} ADD TABLE shipping.events")
        w.write("B", 9)  # streamed to the old relay, which ignores them
        w.write("A", 3)
        _streamed(pg_dsn, only_a, relay)
        assert relay.stats.ignored.get("insert_other_table", 0) >= 9
    w.write("B", 5)  # between the two relays
    values = only_a.model_dump(exclude_unset=True, exclude={"topic_template"})
    values["dsn"] = pg_dsn
    b_entry = {"schema": "shipping", "table": "events"}
    values["outboxes"] = [
        {"topic_template": prefix + ".event.{aggregate_type}"},
        {**b_entry, "topic_template": prefix + ".ship.{aggregate_type}"},
    ]
    both = Settings.model_validate(values)
    committed = delivery == "exactly_once"
    during = threading.Thread(target=lambda: (w.write("B", 12), w.write("A", 4)))
    with relay_thread(both) as relay:  # the bare relay: its own rules, not the service's
        during.start()
        during.join(120)
        _streamed(pg_dsn, both, relay)

        def b_done() -> bool:
            records = _records(bootstrap, f"{prefix}.ship.", committed)
            return len(arrivals_and_order(records, w.ids["B"])[0]) == len(w.ids["B"])

        wait_until(b_done, timeout=60, interval=0.5, message=lambda: f"{relay.stats}")
    for table, topic in (("B", f"{prefix}.ship."), ("A", f"{prefix}.event.")):
        counts, broken = arrivals_and_order(_records(bootstrap, topic, committed), w.ids[table])
        missing = [i for i in w.ids[table] if counts[i] == 0]
        assert not missing, f"{table}: {len(missing)} of {len(w.ids[table])} rows lost"
        assert not broken, f"{table}: order broken {broken[:5]}"
        if committed:
            dups = [i for i in w.ids[table] if counts[i] > 1]
            assert not dups, f"{table}: {len(dups)} duplicated"
    with psycopg.connect(pg_dsn) as conn:  # every row of B marked PUBLISHED in B itself
        rows = conn.execute("SELECT status, count(*) FROM shipping.events GROUP BY 1").fetchall()
    assert dict(rows) == {"PUBLISHED": len(w.ids["B"])}


def test_a_slot_init_creates_anew_forgets_which_tables_the_old_one_streamed(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """A new incarnation of the slot has streamed nothing of the old one: a stale record would
    let a table the new slot never streamed pass without its catch-up. What it records are the
    tables configured when it was created, from its consistent point."""
    settings = relay_settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    init_outbox(settings)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            'UPDATE cdc_outbox_relay_state SET streamed_tables = \'{"x.y": "0/1"}\''
            " WHERE slot_name = %s",
            (settings.slot_name,),
        )
        conn.execute("SELECT pg_drop_replication_slot(%s)", (settings.slot_name,))
    init_outbox(settings)  # creates the slot again
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT streamed_tables, consistent_point::text FROM cdc_outbox_relay_state"
            " WHERE slot_name = %s",
            (settings.slot_name,),
        ).fetchone()
    assert row is not None and row[0] == {settings.outbox().name: row[1]}
