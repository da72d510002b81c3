"""The relay harness: the real :class:`~cdc_outbox.cdc.relay.Relay` driven through its ports by
the fakes of tests/support/fakes, with the checks every relay-level unit test makes (what a
``read_committed`` reader sees, order, confirmation, marks). Used by tests/unit/test_relay_*.py.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from cdc_outbox.cdc.relay import Relay
from cdc_outbox.cdc.relay_build import build_relay
from cdc_outbox.cdc.relay_ports import RelayPorts
from cdc_outbox.config.settings import Settings
from cdc_outbox.store.relay_state import KeepOutcome
from tests.support.fakes.kafka import FakeCheckpoints, FakeCluster, Record
from tests.support.fakes.outbox import FakeOutbox
from tests.support.fakes.replication import FakeMarks, FakePostgres, FakeStream
from tests.support.helpers import wait_until

__all__ = [
    "CHECKPOINTS",
    "DEAD_LETTERS",
    "MAX_RECORD_BYTES",
    "POISON",
    "PREFIX",
    "Harness",
    "Seen",
    "assert_at_least_once",
    "assert_every_delivered_row_marked",
    "assert_exactly_once",
    "assert_never_confirmed_past_kafka",
]

PREFIX = "t.event"
CHECKPOINTS = "t.checkpoints"
DEAD_LETTERS = "cdc_outbox.dead_letter"  # the default dead_letter_topic
MAX_RECORD_BYTES = 4096
POISON = {1: 2 * MAX_RECORD_BYTES}  # pad of commit(): the 2nd event is too large


@dataclass
class Harness:
    delivery: str
    pg: FakePostgres = field(default_factory=FakePostgres)
    cluster: FakeCluster = field(default_factory=FakeCluster)
    keeps_position: bool = True
    keep_fails: int = 0  # the next keeps that fail (the database did not take them)

    def __post_init__(self) -> None:
        self.stream = FakeStream(self.pg)
        self.outbox = FakeOutbox(lambda: self.pg.events(), server=lambda: self.pg)
        self.settings = Settings.model_validate(
            {
                "dsn": "postgresql://fake@127.0.0.1:1/db",
                "mode": "cdc",
                "delivery": self.delivery,
                "cdc_mark_published": "update",
                "topic_template": PREFIX + ".{aggregate_type}",
                "status_interval_s": 1.0,
                "max_record_bytes": MAX_RECORD_BYTES,
                "eos": {"checkpoint_topic": CHECKPOINTS, "commit_interval_ms": 5},
                "kafka": {"bootstrap_servers": "fake:9092"},
            }
        )

    def switch_to(self, server: FakePostgres) -> None:
        """The multi-host DSN now reaches ``server`` (a promoted standby)."""
        self.pg.down = True  # the old primary died, and its connections with it
        self.pg = self.stream.server = server

    def relay(self, is_leader: Callable[[], bool] = lambda: True) -> Relay:
        def keep(lsn: int) -> KeepOutcome:
            if not self.keeps_position:
                return "unsupported"
            if self.keep_fails:
                self.keep_fails -= 1
                return "failed"
            self.pg.kept = max(self.pg.kept, lsn)
            return "kept"

        ports = RelayPorts(
            stream=self.stream,
            producer_client=self.cluster.client,
            checkpoints=FakeCheckpoints(self.cluster, CHECKPOINTS),
            kept=lambda: self.pg.kept,
            keep=keep,
            parked=self.outbox.parked,
            failed_rows=self.outbox,
            marks=FakeMarks(lambda: self.pg),
            slot_facts=lambda: self.pg.slot_facts(self.keeps_position),
        )
        relay = build_relay(self.settings, is_leader=is_leader, ports=ports)
        relay._sleep = lambda seconds: None  # type: ignore[method-assign]
        return relay

    def visible(self) -> list[Record]:
        if self.delivery == "exactly_once":
            return self.cluster.read_committed(PREFIX)
        return self.cluster.read_uncommitted(PREFIX)

    def dead_letters(self) -> list[Record]:
        if self.delivery == "exactly_once":
            return self.cluster.read_committed(DEAD_LETTERS)
        return self.cluster.read_uncommitted(DEAD_LETTERS)

    def caught_up(self) -> bool:
        """Every event of the current history is visible (on its topic or, dead-lettered,
        on the dead-letter topic with its row FAILED) and the slot confirmed past it."""
        pg = self.pg
        if pg.txns and pg.confirmed < pg.txns[-1].end_lsn:
            return False
        seen = {r.headers_id for r in map(Seen, self.visible())}
        dead = {r.headers_id for r in map(Seen, self.dead_letters())}
        failed = self.outbox.failed
        return all(e.id in seen or (e.id in dead and e.id in failed) for e in pg.events())

    @contextmanager
    def running(self, relay: Relay) -> Iterator[Callable[[], None]]:
        """Run ``relay`` on a thread; yields ``caught_up()``, which waits until every event
        of the current history is visible and confirmed (or fails after 30 s)."""
        errors: list[BaseException] = []

        def target() -> None:
            try:
                relay.run()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=target, daemon=True)

        def done() -> bool:
            assert thread.is_alive(), errors
            return self.caught_up()

        def caught_up() -> None:
            wait_until(
                done,
                timeout=30.0,
                interval=0.002,
                message=lambda: (
                    f"not caught up: confirmed {self.pg.confirmed}, {len(self.visible())}"
                    f" records of {len(self.pg.events())} events, restarts {relay.stats.restarts}"
                ),
            )

        thread.start()
        try:
            yield caught_up
        finally:
            relay.request_stop()
            thread.join(30)
        assert not thread.is_alive()
        assert not errors, errors

    def run(self, relay: Relay) -> None:
        with self.running(relay) as caught_up:
            caught_up()

    def verdict(self) -> tuple[Counter[str], list[str]]:
        """(how often each event id of the current history is visible, order violations
        among them)."""
        counts: Counter[str] = Counter(Seen(r).headers_id for r in self.visible())
        last: dict[bytes, int] = {}
        broken = []
        # First occurrences of the current history's events (phantoms of a lost history
        # reuse versions: their order is not comparable).
        ours = {e.id for e in self.pg.events()}
        visible = [r for r in self.visible() if Seen(r).headers_id in ours]
        first = {Seen(r).headers_id: r for r in reversed(visible)}
        for r in sorted(first.values(), key=visible.index):
            seq = int(json.loads(r.value or b"{}")["seq"])
            key = r.key or b""
            if seq < last.get(key, 0):
                broken.append(f"{key!r}: {seq} after {last[key]}")
            last[key] = max(seq, last.get(key, 0))
        return Counter({e.id: counts[e.id] for e in self.pg.events()}), broken


class Seen:
    def __init__(self, record: Record) -> None:
        self.headers_id = dict(record.headers)["id"].decode()


def assert_exactly_once(h: Harness) -> None:
    counts, broken = h.verdict()
    assert not broken, broken[:5]
    missing = [i for i, n in counts.items() if n == 0]
    dups = [i for i, n in counts.items() if n > 1]
    assert not missing, f"{len(missing)} of {len(counts)} events lost"
    assert not dups, f"{len(dups)} duplicated"


def assert_at_least_once(h: Harness) -> None:
    counts, broken = h.verdict()
    assert not broken, broken[:5]
    missing = [i for i, n in counts.items() if n == 0]
    assert not missing, f"{len(missing)} of {len(counts)} events lost"


def assert_never_confirmed_past_kafka(h: Harness) -> None:
    assert not h.pg.backwards, h.pg.backwards[:3]


def assert_every_delivered_row_marked(h: Harness) -> None:
    """Every event of the current history that Kafka holds has its row marked PUBLISHED, and
    the slot was never confirmed past a row before it was marked (a catch-up or a polling
    pass would publish such a row again)."""
    delivered = {Seen(r).headers_id for r in h.visible()}
    events = [e.id for e in h.pg.events() if e.id in delivered]
    unmarked = [i for i in events if i.encode() not in h.pg.marked]
    assert not unmarked, f"{len(unmarked)} of {len(events)} delivered rows never marked"
    early = h.pg.confirmed_unmarked
    assert not early, f"confirmed past unmarked rows: {[(c, len(ids)) for c, ids in early[:3]]}"
