"""Checking the mix of outboxes (tests/outbox_mix.py) against Kafka: the ledger of committed
events, per stream, against every topic of the mix, and the table-less events a lost slot may
lose (docs/outboxes.md: no catch-up for them).

:func:`mix_tally`: per stream 0 lost, first arrivals in ``seq`` order per (stream, aggregate),
each record exact (its stream's topic, key = aggregate id, value = the payload's bytes),
duplicates counted; :class:`SlotBirth` tells when the slot the relay streams now was made.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import psycopg

from cdc_outbox_dev.readback import ConsumedRecord, read_topics
from tests.outbox_mix import DEBEZIUM_ROWS, DEFAULT_ROWS, MESSAGES, STREAMS


@dataclass(frozen=True)
class LedgerEvent:
    """One committed event as the ledger holds it."""

    id: str
    stream: str
    aggregate_id: str
    seq: int
    payload: str  # the jsonb text: the record's value, byte for byte
    written_at: float


def ledger(dsn: str) -> list[LedgerEvent]:
    """Every committed event of the mix."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT id::text, stream, aggregate_id, seq, payload::text,"
            " extract(epoch FROM written_at)::float8 FROM mix_ledger"
        ).fetchall()
    return [LedgerEvent(*r) for r in rows]


@dataclass
class StreamTally:
    """The verdict of one stream."""

    expected: int = 0
    received: int = 0
    missing: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    duplicates: int = 0
    mismatched: list[str] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)


@dataclass
class MixTally:
    """Per-stream verdicts; the totals read like :class:`cdc_outbox_dev.workload.Tally`'s."""

    streams: dict[str, StreamTally]
    unexpected: list[str]  # ids no committed event has (rolled back, phantoms)

    def _all(self, name: str) -> list[str]:
        return [x for s in self.streams.values() for x in getattr(s, name)]

    @property
    def expected(self) -> int:
        return sum(s.expected for s in self.streams.values())

    @property
    def received(self) -> int:
        return sum(s.received for s in self.streams.values()) + len(self.unexpected)

    @property
    def duplicates(self) -> int:
        return sum(s.duplicates for s in self.streams.values())

    @property
    def missing(self) -> list[str]:
        return self._all("missing")

    @property
    def duplicated(self) -> list[str]:
        return self._all("duplicated")

    @property
    def mismatched(self) -> list[str]:
        return self._all("mismatched")

    @property
    def order_violations(self) -> list[str]:
        return self._all("order_violations")

    @property
    def ok(self) -> bool:
        return not (self.missing or self.mismatched or self.order_violations or self.unexpected)

    def summary(self) -> str:
        parts = [
            f"{name}: expected {s.expected}, received {s.received} ({s.duplicates} duplicates),"
            f" missing {len(s.missing)}, mismatched {len(s.mismatched)},"
            f" order violations {len(s.order_violations)} {s.order_violations[:3]}"
            for name, s in self.streams.items()
        ]
        return "; ".join(parts) + f"; unexpected {len(self.unexpected)}"


def tally_mix(
    events: Iterable[LedgerEvent],
    records: Iterable[ConsumedRecord],
    prefix: str,
    *,
    forbidden_ids: Iterable[str] = (),
    may_miss: Iterable[str] = (),
) -> MixTally:
    """Compare the records with the committed events, per stream: each must arrive (but the
    ids of ``may_miss``), on its stream's topic, keyed by its aggregate id, its value the
    payload's bytes; first arrivals in ``seq`` order per (stream, aggregate). ``forbidden_ids``
    (rolled back) and ids of no committed event are ``unexpected``."""
    by_id = {e.id: e for e in events}
    forbidden, excused = set(forbidden_ids), set(may_miss)
    streams = {s: StreamTally() for s in STREAMS}
    for e in by_id.values():
        streams[e.stream].expected += 1
    topic_of = {DEFAULT_ROWS: f"{prefix}.event.", DEBEZIUM_ROWS: f"{prefix}.shipping.",
                MESSAGES: f"{prefix}.event."}  # fmt: skip
    seen: dict[str, int] = defaultdict(int)
    last: dict[tuple[str, str], int] = {}
    unexpected: list[str] = []
    for rec in records:
        event_id = dict(rec.headers).get("id", b"").decode()
        ev = by_id.get(event_id)
        if ev is None or event_id in forbidden:
            unexpected.append(event_id)
            continue
        tally = streams[ev.stream]
        tally.received += 1
        seen[event_id] += 1
        if seen[event_id] > 1:
            tally.duplicates += 1
            continue
        if (not rec.topic.startswith(topic_of[ev.stream]) or rec.key != ev.aggregate_id.encode()
                or rec.value != ev.payload.encode()):  # fmt: skip
            tally.mismatched.append(f"{event_id} on {rec.topic}")
        prev = last.get((ev.stream, ev.aggregate_id), 0)
        if ev.seq <= prev:
            tally.order_violations.append(f"{ev.stream} {ev.aggregate_id}: {ev.seq} after {prev}")
        last[ev.stream, ev.aggregate_id] = max(prev, ev.seq)
    for e in by_id.values():
        if e.id not in seen and e.id not in excused:
            streams[e.stream].missing.append(e.id)
    for event_id, n in seen.items():
        if n > 1:
            streams[by_id[event_id].stream].duplicated.append(event_id)
    return MixTally(streams, unexpected)


def mix_tally(
    dsn: str,
    bootstrap: str,
    prefix: str,
    *,
    read_committed: bool = False,
    forbidden_ids: Iterable[str] = (),
    may_miss: Iterable[str] = (),
) -> MixTally:
    """:func:`tally_mix` of the ledger against every topic of the mix (printed);
    ``read_committed`` reads as an exactly-once consumer does."""
    extra = {"isolation.level": "read_committed" if read_committed else "read_uncommitted"}
    records = [
        r
        for topics in (f"{prefix}.event.", f"{prefix}.shipping.")
        for r in read_topics(bootstrap, topics, timeout=120, extra_config=extra)
    ]
    verdict = tally_mix(ledger(dsn), records, prefix, forbidden_ids=forbidden_ids,
                        may_miss=may_miss)  # fmt: skip
    print(verdict.summary())
    return verdict


def messages_before(dsn: str, when: float) -> list[str]:
    """Ids of the table-less events written before ``when`` (epoch seconds, the server's
    clock; :meth:`SlotBirth.born`): the only ones a lost slot may lose."""
    return [e.id for e in ledger(dsn) if e.stream == MESSAGES and e.written_at < when]


def server_time(dsn: str) -> float:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0])


class SlotBirth:
    """Samples every 0.05 s whether the slot exists (through any DSN, a multi-host one too; a
    failed sample counts as no slot, at this host's clock): :meth:`born` is when the slot that
    exists at the end was first seen, so a table-less event written before it may be lost and
    one written after it must arrive (a catch-up makes a new slot; rows are caught up,
    messages are not)."""

    def __init__(self, dsn: str, slot: str) -> None:
        self.dsn, self.slot = dsn, slot
        self.samples: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slot-birth", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        query = (
            "SELECT extract(epoch FROM clock_timestamp())::float8,"
            " EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s)"
        )
        conn: psycopg.Connection[tuple[float, bool]] | None = None
        while not self._stop.wait(0.05):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
                row = conn.execute(query, (self.slot,)).fetchone()
            except psycopg.Error:  # the server away (a crash, a failover): as if no slot
                conn = None
                self.samples.append((time.time(), False))
                continue
            if row is not None:
                self.samples.append((float(row[0]), bool(row[1])))
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def born(self) -> float:
        """The time of the sample before the last run of samples that saw the slot (0.0:
        there since the first sample)."""
        assert self.samples and self.samples[-1][1], "the slot does not exist at the end"
        for i in range(len(self.samples) - 1, -1, -1):
            if not self.samples[i][1]:
                return self.samples[i][0]
        return 0.0
