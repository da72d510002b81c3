"""The real Relay over several outbox tables through one slot (issue 36), driven by the fakes
of tests/support/fakes and the Harness of tests/support/relay_harness.py: each table's rows
are mapped with its own layout and topic template, marked in its own table per its own
``cdc_mark_published``, and an aggregate's order is kept per table (the same aggregate id in
two tables is two independent sequences); inserts into a table that is no configured outbox
are ignored.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from cdc_outbox.cdc.new_tables import NewTables
from cdc_outbox.cdc.relay import Relay
from cdc_outbox.cdc.relay_build import build_relay
from cdc_outbox.cdc.relay_ports import RelayPorts
from cdc_outbox.config.cdc import catch_up_section, marker_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.store.relay_state import KeepOutcome
from tests.support.fakes.kafka import FakeCheckpoints, Record
from tests.support.fakes.replication import FakeMarks
from tests.support.helpers import wait_until
from tests.support.relay_harness import CHECKPOINTS, Harness

ORDERS = "t.event.orders."  # public.outbox, the default layout
SHIPPING = "t.ship."  # shipping.events, the Debezium layout
OUTBOXES = [
    {
        "schema": "public",
        "table": "outbox",
        "topic_template": ORDERS + "{aggregate_type}",
        "cdc_mark_published": "update",
    },
    {
        "schema": "shipping",
        "table": "events",
        "columns": {"preset": "debezium"},
        "topic_template": SHIPPING + "{aggregate_type}",
        "cdc_mark_published": "delete",
    },
]


def _harness(delivery: str, outboxes: list[dict[str, object]] | None = None) -> Harness:
    h = Harness(delivery)
    h.settings = Settings.model_validate(
        {
            "dsn": "postgresql://fake@127.0.0.1:1/db",
            "mode": "cdc",
            "delivery": delivery,
            "outboxes": OUTBOXES if outboxes is None else outboxes,
            "status_interval_s": 1.0,
            "eos": {"checkpoint_topic": CHECKPOINTS, "commit_interval_ms": 5},
            "kafka": {"bootstrap_servers": "fake:9092"},
        }
    )
    return h


def _relay(h: Harness, new_tables: NewTables | None = None) -> Relay:
    def keep(lsn: int) -> KeepOutcome:
        h.pg.kept = max(h.pg.kept, lsn)
        return "kept"

    ports = RelayPorts(
        stream=h.stream,
        producer_client=h.cluster.client,
        checkpoints=FakeCheckpoints(h.cluster, CHECKPOINTS),
        kept=lambda: h.pg.kept,
        keep=keep,
        parked=h.outbox.parked,
        failed_rows=h.outbox,
        marks={
            name: FakeMarks(lambda: h.pg, name)
            for name in ("public.outbox", "shipping.events", "public.not_an_outbox")
        },
        slot_facts=lambda: h.pg.slot_facts(),
        new_tables=new_tables,
    )
    relay = build_relay(h.settings, ports=ports)
    relay._sleep = lambda seconds: None  # type: ignore[method-assign]
    return relay


def _read(h: Harness, prefix: str) -> list[Record]:
    if h.delivery == "exactly_once":
        return h.cluster.read_committed(prefix)
    return h.cluster.read_uncommitted(prefix)


def _events(h: Harness) -> list[Record]:
    return _read(h, ORDERS) + _read(h, SHIPPING)


def _ids(records: list[Record]) -> Counter[str]:
    return Counter(dict(r.headers)["id"].decode() for r in records)


def _broken_order(records: list[Record]) -> list[str]:
    """Per-key order of the ``seq`` field among the first occurrences of ``records``."""
    last: dict[bytes, int] = {}
    broken, seen = [], set()
    for r in records:
        event_id = dict(r.headers)["id"]
        if event_id in seen:
            continue
        seen.add(event_id)
        seq = int(json.loads(r.value or b"{}")["seq"])
        key = r.key or b""
        if seq < last.get(key, 0):
            broken.append(f"{key!r}: {seq} after {last[key]}")
        last[key] = max(seq, last.get(key, 0))
    return broken


def _write_mix(h: Harness, txns: int) -> None:
    """Transactions mixing both outboxes (the same aggregate ids in both) and a table that
    is no outbox."""
    tables = ["public.outbox", "shipping.events", "public.not_an_outbox"]
    for n in range(txns):
        into = [tables[(n + i) % 3] for i in range(4)]
        h.pg.commit([f"agg-{(n + i) % 3}" for i in range(4)], table=into)


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_two_outbox_tables_each_mapped_routed_and_marked_in_their_own_table(delivery: str) -> None:
    h = _harness(delivery)
    _write_mix(h, 60)
    relay = _relay(h)
    events = h.pg.events()
    of = {t: [e for e in events if e.table == t] for t in ("public.outbox", "shipping.events")}
    ignored = [e for e in events if e.table == "public.not_an_outbox"]

    def delivered() -> bool:
        got = _ids(_events(h))
        return all(got[e.id] for t in of.values() for e in t) and h.pg.confirmed >= (
            h.pg.txns[-1].end_lsn
        )

    with h.running(relay):
        wait_until(delivered, timeout=30, message=lambda: f"delivered: {_ids(_events(h))}")
        wait_until(lambda: relay.marker is not None and relay.marker.unmarked == 0, timeout=30)
    orders, shipping = _read(h, ORDERS), _read(h, SHIPPING)
    assert _ids(orders).keys() == {e.id for e in of["public.outbox"]}
    assert _ids(shipping).keys() == {e.id for e in of["shipping.events"]}
    assert not _ids(_events(h)).keys() & {e.id for e in ignored}
    assert relay.stats.ignored.get("insert_other_table") == len(ignored)
    assert not _broken_order(orders) and not _broken_order(shipping)
    if delivery == "exactly_once":
        assert max(_ids(orders).values()) == 1 and max(_ids(shipping).values()) == 1
    # Each with its own template, and its own layout's columns read (aggregateid, type, ...).
    assert {r.topic for r in orders} == {ORDERS + "order"}
    assert {r.topic for r in shipping} == {SHIPPING + "order"}
    by_id = {e.id: e for e in of["shipping.events"]}
    assert all(r.key == by_id[dict(r.headers)["id"].decode()].aggregate_id.encode()
               for r in shipping)  # fmt: skip
    assert all(dict(r.headers)["event_type"] == b"Placed" for r in shipping)
    marked = {t: set(ids) for t, ids in h.pg.marked_in.items()}
    assert marked.get("public.outbox") == {e.id.encode() for e in of["public.outbox"]}
    assert marked.get("shipping.events") == {e.id.encode() for e in of["shipping.events"]}
    assert "public.not_an_outbox" not in marked


def test_an_outbox_with_marking_off_has_nothing_marked() -> None:
    off = [OUTBOXES[0], {**OUTBOXES[1], "cdc_mark_published": "off"}]
    h = _harness("at_least_once", off)
    _write_mix(h, 30)
    relay = _relay(h)
    with h.running(relay):
        wait_until(lambda: h.pg.confirmed >= h.pg.txns[-1].end_lsn, timeout=30)
    wanted = {e.id.encode() for e in h.pg.events() if e.table == "public.outbox"}
    assert set(h.pg.marked_in.get("public.outbox", [])) == wanted
    assert "shipping.events" not in h.pg.marked_in


def test_a_dead_letter_parks_its_aggregate_in_its_own_table_only() -> None:
    """A poison event of agg-1 in public.outbox parks agg-1 there (its later events are
    dead-lettered behind it, FAILED in public.outbox); agg-1 of the other table goes on."""
    second = {"schema": "public", "table": "not_an_outbox", "topic_template": "t.other.x"}
    h = _harness("at_least_once", [OUTBOXES[0], second])
    h.settings = h.settings.model_copy(update={"max_record_bytes": 4096})
    h.pg.commit(["agg-1", "agg-1"], pad={0: 8192}, table=["public.outbox", "public.not_an_outbox"])
    for _ in range(3):
        h.pg.commit(["agg-1", "agg-1"], table=["public.outbox", "public.not_an_outbox"])
    relay = _relay(h)
    outbox = [e for e in h.pg.events() if e.table == "public.outbox"]
    other = [e for e in h.pg.events() if e.table == "public.not_an_outbox"]
    with h.running(relay):
        wait_until(lambda: h.pg.confirmed >= h.pg.txns[-1].end_lsn, timeout=30)
    assert _ids(h.cluster.read_uncommitted("t.other.")).keys() == {e.id for e in other}
    assert not _ids(_read(h, ORDERS))
    dead = h.cluster.read_uncommitted("cdc_outbox.dead_letter")
    assert _ids(dead).keys() == {e.id for e in outbox}
    reasons = [dict(r.headers)["cdc_outbox.error"].decode() for r in dead]
    assert sum(r.startswith("blocked_by ") for r in reasons) == 3, reasons
    assert set(h.outbox.failed_in) == {0}
    assert set(h.outbox.failed_in[0]) == {e.id for e in outbox}


def _no_export(name: str) -> Any:
    raise AssertionError("no table needs a catch-up")


def test_a_table_caught_up_before_streaming_is_streamed_only_from_its_point() -> None:
    """shipping.events was caught up up to L (recorded): the stream skips its rows of
    transactions committed below L, publishes the later ones, and every public.outbox row."""
    h = _harness("at_least_once")
    _write_mix(h, 30)
    point = h.pg.txns[15].final_lsn  # rows of txns 0..14 were the catch-up's
    recorded: list[dict[str, int]] = []
    tables = NewTables(
        catch_up_section(h.settings),
        OutboxTable.all_of(h.settings),
        streamed=lambda: {"public.outbox": 0, "shipping.events": point, "public.gone": 9},
        record=recorded.append,
        export=_no_export,
    )
    relay = _relay(h, tables)
    with h.running(relay):
        wait_until(lambda: h.pg.confirmed >= h.pg.txns[-1].end_lsn, timeout=30)
    late = {e.id for t in h.pg.txns[15:] for e in t.events if e.table == "shipping.events"}
    early = {e.id for t in h.pg.txns[:15] for e in t.events if e.table == "shipping.events"}
    assert _ids(_read(h, SHIPPING)).keys() == late and early
    orders = {e.id for e in h.pg.events() if e.table == "public.outbox"}
    assert _ids(_read(h, ORDERS)).keys() == orders
    assert relay.stats.ignored["caught_up_before_streaming"] == len(early)
    # The table no longer configured was dropped from the record before streaming.
    assert recorded == [{"public.outbox": 0, "shipping.events": point}]


def test_an_unknown_record_with_one_outbox_catches_up_nothing() -> None:
    settings = Settings.model_validate({"dsn": "postgresql://fake@127.0.0.1:1/db"})
    recorded: list[dict[str, int]] = []
    tables = NewTables(
        catch_up_section(settings),
        OutboxTable.all_of(settings),
        streamed=lambda: None,
        record=recorded.append,
        export=_no_export,
    )
    assert tables.catch_up(None, [], None, None) == {}  # type: ignore[arg-type]
    assert recorded == []


def test_the_marker_takes_no_table_less_id_nor_one_of_an_outbox_that_does_not_mark() -> None:
    from cdc_outbox.cdc.published_marker import PublishedMarker
    from cdc_outbox.delivery.outcomes import TABLELESS

    h = _harness("at_least_once", [OUTBOXES[0], {**OUTBOXES[1], "cdc_mark_published": "off"}])
    marker = PublishedMarker(
        marker_section(h.settings),
        OutboxTable.all_of(h.settings),
        rows={"public.outbox": FakeMarks(lambda: h.pg)},
    )
    marker.add(b"message-event", TABLELESS)
    marker.add(b"shipping-row", 1)
    assert (marker.handed, marker.dropped) == (0, 0)
    marker.add(b"orders-row", 0)
    assert marker.handed == 1
