"""Sample order traffic and delivery verification, shared by the demo, benchmarks and tests.

Writers commit a business row and an outbox row in one transaction. Each aggregate belongs to
exactly one writer, so an aggregate's commit order is its ``seq`` order; :func:`tally` checks
that Kafka kept it.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from cdc_outbox.mapping.rows import ColumnNames
from cdc_outbox.writer import write_event
from cdc_outbox_dev.readback import ConsumedRecord

BUSINESS_TABLE = "demo_orders"


@dataclass(frozen=True)
class WorkloadSpec:
    """What to write: ``events`` outbox rows from ``writers`` threads over ``aggregates``."""

    events: int
    writers: int = 4
    aggregates: int = 200
    txn_sizes: tuple[int, ...] = (1, 7, 50, 100)
    aggregate_type: str = "order"
    payload_pad: int = 120
    rollback_every: int = 0  # every Nth transaction of a writer is rolled back (0: never)
    rate: float = (
        0.0  # offered load in committed events/s over all writers (0: as fast as possible)
    )
    #: Non-empty: each event is a table-less event (``write_event(..., message_prefix=)``, a
    #: transactional logical message) instead of an outbox row; the business row is the same.
    message_prefix: str = ""


@dataclass
class WriteReport:
    """What the writers committed (event ids in commit order per writer) and rolled back."""

    committed: int = 0
    rolled_back_ids: list[str] = field(default_factory=list)
    transactions: int = 0


def prepare(dsn: str, schema: str = "public") -> None:
    """Create the demo business table (idempotent)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.{} (id uuid PRIMARY KEY, customer text NOT NULL,"
                " seq int NOT NULL, amount_cents bigint NOT NULL)"
            ).format(sql.Identifier(schema), sql.Identifier(BUSINESS_TABLE))
        )


def write_orders(
    dsn: str,
    spec: WorkloadSpec,
    *,
    schema: str = "public",
    table: str = "outbox",
    columns: ColumnNames,
    stop: threading.Event | None = None,
) -> WriteReport:
    """Run the writers to completion (or until ``stop``); returns what they did."""
    prepare(dsn, schema)
    report = WriteReport()
    lock = threading.Lock()
    per_writer = [spec.events // spec.writers] * spec.writers
    for i in range(spec.events % spec.writers):
        per_writer[i] += 1
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            _run_writer(dsn, spec, w, per_writer[w], schema, table, columns, stop, report, lock)
        except BaseException as exc:  # surfaced to the caller below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(spec.writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return report


def _run_writer(
    dsn: str,
    spec: WorkloadSpec,
    w: int,
    count: int,
    schema: str,
    table: str,
    columns: ColumnNames,
    stop: threading.Event | None,
    report: WriteReport,
    lock: threading.Lock,
) -> None:
    aggregates = [
        f"{spec.aggregate_type}-{a}" for a in range(spec.aggregates) if a % spec.writers == w
    ]
    if not aggregates:
        aggregates = [f"{spec.aggregate_type}-w{w}"]
    seqs = dict.fromkeys(aggregates, 0)
    agg_cycle = itertools.cycle(aggregates)
    sizes = itertools.cycle(spec.txn_sizes)
    cols = [
        columns.id,
        columns.aggregate_type,
        columns.aggregate_id,
        columns.event_type,
        columns.payload,
    ]
    if columns.headers:
        cols.append(columns.headers)
    insert_outbox = sql.SQL("INSERT INTO {}.{} ({}) VALUES ({})").format(
        sql.Identifier(schema),
        sql.Identifier(table),
        sql.SQL(", ").join(map(sql.Identifier, cols)),
        sql.SQL(", ").join(sql.Placeholder() * len(cols)),
    )
    insert_order = sql.SQL("INSERT INTO {}.{} VALUES (%s, %s, %s, %s)").format(
        sql.Identifier(schema), sql.Identifier(BUSINESS_TABLE)
    )
    written, txn_no = 0, 0
    per_writer_rate = spec.rate / spec.writers if spec.rate > 0 else 0.0
    started = time.monotonic()
    check_committed = sql.SQL("SELECT 1 FROM {}.{} WHERE {} = %s").format(
        sql.Identifier(schema), sql.Identifier(table), sql.Identifier(columns.id)
    )
    conn = psycopg.connect(dsn)
    try:
        while written < count and not (stop and stop.is_set()):
            if per_writer_rate:
                # Pace commits so that this writer offers its share of ``spec.rate``.
                due = started + written / per_writer_rate
                if (delay := due - time.monotonic()) > 0:
                    time.sleep(delay)
            size = min(next(sizes), count - written)
            txn_no += 1
            rollback = spec.rollback_every > 0 and txn_no % spec.rollback_every == 0
            orders, events, ids = [], [], []
            for _ in range(size):
                agg = next(agg_cycle)
                if not rollback:
                    seqs[agg] += 1
                event_id = str(uuid.uuid4())
                ids.append(event_id)
                payload = {
                    "order": agg,
                    "seq": seqs[agg],
                    "amount_cents": 1000 + seqs[agg],
                    "note": "x" * spec.payload_pad,
                }
                orders.append((event_id, agg, seqs[agg], 1000 + seqs[agg]))
                row = [event_id, spec.aggregate_type, agg, "OrderPlaced", json.dumps(payload)]
                if columns.headers:
                    row.append(json.dumps({"writer": str(w), "txn": str(txn_no)}))
                events.append(row)
            while True:
                try:
                    with conn.cursor() as cur:
                        cur.executemany(insert_order, orders)
                        if spec.message_prefix:
                            _emit(cur, spec, events, columns)
                        else:
                            cur.executemany(insert_outbox, events)
                    if rollback:
                        conn.rollback()
                    else:
                        conn.commit()
                    break
                except psycopg.OperationalError:
                    # The server went away (a restart test): reconnect, then find out whether
                    # the commit happened before retrying the same transaction.
                    conn = reconnect(dsn, conn)
                    if not rollback and conn.execute(check_committed, (ids[0],)).fetchone():
                        conn.rollback()
                        break
                    conn.rollback()
            with lock:
                if rollback:
                    report.rolled_back_ids.extend(ids)
                else:
                    report.committed += size
                    report.transactions += 1
            if not rollback:
                written += size
    finally:
        conn.close()


def _emit(
    cur: psycopg.Cursor[Any], spec: WorkloadSpec, events: list[list[str]], columns: ColumnNames
) -> None:
    """The transaction's events as table-less events (the rows' values, as the writer's API
    takes them)."""
    for row in events:
        event_id, aggregate_type, aggregate_id, event_type, payload = row[:5]
        headers = json.loads(row[5]) if columns.headers and len(row) > 5 else None
        write_event(
            cur,
            aggregate_type,
            aggregate_id,
            event_type,
            json.loads(payload),
            headers,
            event_id,
            message_prefix=spec.message_prefix,
        )


def reconnect(
    dsn: str, old: psycopg.Connection[tuple[Any, ...]]
) -> psycopg.Connection[tuple[Any, ...]]:
    """A new connection in place of ``old`` (closed), retried for up to 120 s while the server
    is away (a restart test)."""
    old.close()
    deadline = time.monotonic() + 120
    while True:
        try:
            return psycopg.connect(dsn)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass(frozen=True)
class StoredEvent:
    """An outbox row as PostgreSQL stores it (text forms), the expected Kafka record."""

    id: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: str
    seq: int


def stored_events(
    dsn: str, *, schema: str = "public", table: str = "outbox", columns: ColumnNames
) -> list[StoredEvent]:
    """Every committed outbox row, with the payload text exactly as PostgreSQL outputs it."""
    query = sql.SQL("SELECT {}::text, {}, {}, {}, {}::text FROM {}.{}").format(
        sql.Identifier(columns.id),
        sql.Identifier(columns.aggregate_type),
        sql.Identifier(columns.aggregate_id),
        sql.Identifier(columns.event_type),
        sql.Identifier(columns.payload),
        sql.Identifier(schema),
        sql.Identifier(table),
    )
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(query).fetchall()
    return [
        StoredEvent(r[0], r[1], r[2], r[3], r[4], int(json.loads(r[4]).get("seq", 0))) for r in rows
    ]


@dataclass
class Tally:
    """Delivery verdict: complete, exact and ordered, with duplicate counts."""

    expected: int
    received: int
    missing: list[str]
    duplicates: int
    mismatched: list[str]
    order_violations: list[str]
    unexpected: list[str]
    duplicated: list[str] = field(default_factory=list)  # ids received more than once

    @property
    def ok(self) -> bool:
        return not (self.missing or self.mismatched or self.order_violations or self.unexpected)

    def summary(self) -> str:
        return (
            f"expected {self.expected}, received {self.received} records "
            f"({self.duplicates} duplicates); missing {len(self.missing)}, "
            f"mismatched {len(self.mismatched)}, order violations {len(self.order_violations)}, "
            f"unexpected {len(self.unexpected)}"
        )


def tally(
    expected: Sequence[StoredEvent],
    records: Iterable[ConsumedRecord],
    *,
    forbidden_ids: Iterable[str] = (),
    decode_value: Callable[[bytes | None], Any] | None = None,
    decode_key: Callable[[bytes | None], Any] | None = None,
) -> Tally:
    """Compare Kafka records with the stored events.

    Every stored event must arrive at least once with key = aggregate id and value = payload;
    per aggregate, first arrivals must follow ``seq`` (partition order is commit order).
    ``forbidden_ids`` (e.g. rolled-back events) must not arrive at all. With
    ``decode_value`` (e.g. an Avro reader) the decoded value must equal the parsed payload;
    with ``decode_key`` the decoded key must equal the aggregate id (text).
    """
    by_id = {e.id: e for e in expected}
    forbidden = set(forbidden_ids)
    seen: dict[str, int] = defaultdict(int)
    last_seq: dict[str, int] = {}
    mismatched: list[str] = []
    violations: list[str] = []
    unexpected: list[str] = []
    received = 0
    for rec in records:
        received += 1
        headers = dict(rec.headers)
        event_id = headers.get("id", b"").decode()
        ev = by_id.get(event_id)
        if ev is None or event_id in forbidden:
            unexpected.append(event_id)
            continue
        seen[event_id] += 1
        if seen[event_id] > 1:
            continue
        if decode_value is None:
            same = rec.value == ev.payload.encode()
        else:
            same = decode_value(rec.value) == json.loads(ev.payload)
        if decode_key is None:
            same_key = rec.key == ev.aggregate_id.encode()
        else:
            same_key = decode_key(rec.key) == ev.aggregate_id
        if not same_key or not same:
            mismatched.append(event_id)
        prev = last_seq.get(ev.aggregate_id, 0)
        if ev.seq <= prev:
            violations.append(f"{ev.aggregate_id}: seq {ev.seq} after {prev}")
        last_seq[ev.aggregate_id] = max(prev, ev.seq)
    missing = [e.id for e in expected if e.id not in seen]
    duplicates = sum(n - 1 for n in seen.values())
    duplicated = [i for i, n in seen.items() if n > 1]
    return Tally(
        len(expected), received, missing, duplicates, mismatched, violations, unexpected, duplicated
    )
