"""Checking the mix of outboxes (tests/support/outbox_mix.py) against Kafka: the ledger of committed
events, per stream, against every topic of the mix, and the table-less events a lost slot may
lose (docs/outboxes.md: no catch-up for them).

:func:`mix_tally`: per stream 0 lost, first arrivals in ``seq`` order per (stream, aggregate),
each record exact (its stream's topic, key = aggregate id, value = the payload's bytes),
duplicates counted; :func:`messages_before_slot` names the table-less events a new slot may
have lost.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import psycopg

from cdc_outbox_dev.readback import ConsumedRecord, read_topics
from tests.support.outbox_mix import DEBEZIUM_ROWS, DEFAULT_ROWS, MESSAGES, STREAMS


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
    events = ledger(dsn)
    verdict = tally_mix(events, records, prefix, forbidden_ids=forbidden_ids,
                        may_miss=may_miss)  # fmt: skip
    print(verdict.summary())
    lost = set(verdict.missing[:20])
    for e in sorted((e for e in events if e.id in lost), key=lambda e: e.written_at):
        print(f"missing: {e.stream} {e.aggregate_id} seq {e.seq} written at {e.written_at:.3f}"
              f" ({e.id})")  # fmt: skip
    return verdict


def messages_before_slot(dsn: str, slot: str) -> list[str]:
    """Ids of the table-less events a catch-up may have lost: written before the consistent
    point of the slot streamed now (the relay state's, written with its STREAMING phase).
    A transaction that committed past that point is decoded from the slot; one written (its
    ledger row's WAL insert position) at or past it committed past it, so it must arrive."""
    with psycopg.connect(dsn) as conn:
        point = conn.execute(
            "SELECT consistent_point FROM cdc_outbox_relay_state WHERE slot_name = %s", (slot,)
        ).fetchone()
        assert point is not None and point[0] is not None, f"no consistent point: {point}"
        rows = conn.execute(
            "SELECT id::text FROM mix_ledger WHERE stream = %s AND lsn < %s::pg_lsn",
            (MESSAGES, point[0]),
        ).fetchall()
    return [r[0] for r in rows]
