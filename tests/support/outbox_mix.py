"""The mix of outboxes the relay's fault tests run over (issue 36): one relay, one slot, three
event streams.

* ``public.outbox``: the default layout (status columns, ``cdc_mark_published = "update"``),
  topics ``<prefix>.event.{aggregate_type}``;
* ``shipping.events``: the Debezium layout (``[outboxes.columns] preset = "debezium"``,
  ``cdc_mark_published = "delete"``), topics ``<prefix>.shipping.{aggregate_type}``;
* table-less events (``message_prefix`` :data:`MESSAGE_PREFIX`), mapped like the first
  outbox's rows: topics ``<prefix>.event.{aggregate_type}``, beside ``public.outbox``'s.

:func:`write_mix` commits transactions that interleave events of all three (the same
aggregate ids in each) and, in the same transaction, one row per event in the ledger table
:data:`LEDGER` (its id, stream, aggregate, per-(stream, aggregate) ``seq``, payload, and the
WAL insert position when it was written, before its commit): the
ledger is what was committed, whatever the relay deleted (Debezium rows) or never stored (a
message), and a failover loses a ledger row exactly when it loses the event.
:func:`tests.support.mix_tally.mix_tally` checks every topic against the ledger per stream;
:func:`unmarked` lists delivered rows whose mark is missing (``public.outbox`` not
PUBLISHED, ``shipping.events`` still there).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from cdc_outbox.config.settings import Settings
from cdc_outbox.writer import OutboxTable, write_event
from cdc_outbox_dev.workload import reconnect
from tests.support.relay import init_outbox, leave_for_catch_up, relay_settings

LEDGER = "mix_ledger"
MESSAGE_PREFIX = "mix.outbox"
DEFAULT_ROWS, DEBEZIUM_ROWS, MESSAGES = "public.outbox", "shipping.events", "message"
STREAMS = (DEFAULT_ROWS, DEBEZIUM_ROWS, MESSAGES)
_TABLES = {
    DEFAULT_ROWS: OutboxTable("public", "outbox"),
    DEBEZIUM_ROWS: OutboxTable("shipping", "events", preset="debezium"),
}


def mix_outboxes(prefix: str) -> list[dict[str, Any]]:
    """The ``[[outboxes]]`` of the mix (see the module doc)."""
    return [
        {
            "schema": "public",
            "table": "outbox",
            "topic_template": prefix + ".event.{aggregate_type}",
        },
        {
            "schema": "shipping",
            "table": "events",
            "columns": {"preset": "debezium"},
            "cdc_mark_published": "delete",
            "topic_template": prefix + ".shipping.{aggregate_type}",
        },
    ]


def mix_settings(dsn: str, bootstrap_servers: str, prefix: str, **overrides: Any) -> Settings:
    """:func:`~tests.support.relay.relay_settings` over the mix: both outboxes and
    ``message_prefix``."""
    return relay_settings(
        dsn,
        bootstrap_servers,
        prefix,
        outboxes=mix_outboxes(prefix),
        message_prefix=MESSAGE_PREFIX,
        **overrides,
    )


def mix_topics(prefix: str, aggregate_type: str = "order") -> list[str]:
    """The topics the mix's events go to (for tests that create them up front)."""
    return [f"{prefix}.event.{aggregate_type}", f"{prefix}.shipping.{aggregate_type}"]


def init_mix(settings: Settings, *, for_catch_up: bool = False) -> None:
    """The ledger, the Debezium-layout table ``shipping.events`` (Debezium's outbox shape),
    then ``init`` (``public.outbox``, publication, slot), and the publication covering both
    tables (whichever of these ``init`` already does is left as it made it). ``for_catch_up``:
    then the slot dropped and the phase CATCHING_UP (``init_for_catch_up``'s state)."""
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS mix_ledger (id uuid PRIMARY KEY, stream text NOT NULL,"
            " aggregate_id text NOT NULL, seq int NOT NULL, payload jsonb NOT NULL,"
            " written_at timestamptz NOT NULL DEFAULT clock_timestamp(),"
            " lsn pg_lsn NOT NULL DEFAULT pg_current_wal_insert_lsn())"
        )
        conn.execute("CREATE SCHEMA IF NOT EXISTS shipping")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS shipping.events (id uuid PRIMARY KEY,"
            " aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL,"
            " payload jsonb)"
        )
    init_outbox(settings)
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        covered = conn.execute(
            "SELECT 1 FROM pg_publication_tables WHERE pubname = %s"
            " AND schemaname = 'shipping' AND tablename = 'events'",
            (settings.publication_name,),
        ).fetchone()
        if covered is None:
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} ADD TABLE shipping.events").format(
                    sql.Identifier(settings.publication_name)
                )
            )
    if for_catch_up:
        leave_for_catch_up(settings)


@dataclass(frozen=True)
class MixSpec:
    """``events`` events from ``writers`` threads over ``aggregates`` aggregate ids (each id
    in all three streams), in transactions of ``txn_sizes`` events; every
    ``rollback_every``-th transaction of a writer rolled back (0: never); ``rate``: committed
    events/s over all writers (0: as fast as possible)."""

    events: int
    writers: int = 4
    aggregates: int = 120
    txn_sizes: tuple[int, ...] = (1, 5, 20)
    rate: float = 0.0
    rollback_every: int = 0
    payload_pad: int = 60


@dataclass
class MixReport:
    """What the writers committed (events, per stream) and the ids they rolled back."""

    committed: int = 0
    per_stream: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STREAMS, 0))
    rolled_back_ids: list[str] = field(default_factory=list)


def write_mix(dsn: str, spec: MixSpec, *, stop: threading.Event | None = None) -> MixReport:
    """Run the writers until ``spec.events`` are committed (or ``stop``); what they did."""
    report, lock, errors = MixReport(), threading.Lock(), []
    shares = [spec.events // spec.writers + (w < spec.events % spec.writers)
              for w in range(spec.writers)]  # fmt: skip

    def writer(w: int) -> None:
        try:
            _run_writer(dsn, spec, w, shares[w], stop, report, lock)
        except BaseException as exc:  # surfaced to the caller below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,), name=f"mix-{w}")
               for w in range(spec.writers)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return report


def mix_writers_thread(
    dsn: str, spec: MixSpec, stop: threading.Event
) -> tuple[threading.Thread, list[MixReport]]:
    """:func:`write_mix` on a thread (not started yet), and the list its report goes to."""
    reports: list[MixReport] = []
    thread = threading.Thread(
        target=lambda: reports.append(write_mix(dsn, spec, stop=stop)), name="mix-writers"
    )
    return thread, reports


_LEDGER_INSERT = (
    "INSERT INTO mix_ledger (id, stream, aggregate_id, seq, payload) VALUES (%s, %s, %s, %s, %s)"
)


def _run_writer(
    dsn: str,
    spec: MixSpec,
    w: int,
    count: int,
    stop: threading.Event | None,
    report: MixReport,
    lock: threading.Lock,
) -> None:
    """One writer: its own aggregates (``a % writers == w``), each in every stream, so an
    aggregate's events of a stream are committed in ``seq`` order."""
    rng = random.Random(w)
    aggregates = [f"order-{a}" for a in range(spec.aggregates) if a % spec.writers == w]
    seqs: dict[tuple[str, str], int] = defaultdict(int)
    sizes = itertools.cycle(spec.txn_sizes)
    rate = spec.rate / spec.writers if spec.rate > 0 else 0.0
    started, written, txn_no = time.monotonic(), 0, 0
    conn = psycopg.connect(dsn)
    try:
        while written < count and not (stop and stop.is_set()):
            if rate and (delay := started + written / rate - time.monotonic()) > 0:
                time.sleep(delay)  # the writers' pacing (spec.rate)
            size = min(next(sizes), count - written)
            txn_no += 1
            rollback = spec.rollback_every > 0 and txn_no % spec.rollback_every == 0
            events = []
            for _ in range(size):
                stream, agg = rng.choice(STREAMS), rng.choice(aggregates)
                seq = seqs[stream, agg] + 1
                if not rollback:
                    seqs[stream, agg] = seq
                payload = {
                    "order": agg,
                    "seq": seq,
                    "stream": stream,
                    "note": "x" * spec.payload_pad,
                }
                events.append((str(uuid.uuid4()), stream, agg, seq, payload))
            conn = _commit(dsn, conn, events, rollback)
            with lock:
                if rollback:
                    report.rolled_back_ids.extend(e[0] for e in events)
                else:
                    report.committed += size
                    for e in events:
                        report.per_stream[e[1]] += 1
            if not rollback:
                written += size
    finally:
        conn.close()


def _commit(
    dsn: str, conn: psycopg.Connection[Any], events: list[Any], rollback: bool
) -> psycopg.Connection[Any]:
    """Write ``events`` and their ledger rows in one transaction, committed (or rolled back);
    across a lost server it reconnects and asks the ledger whether the commit happened."""
    while True:
        try:
            with conn.pipeline(), conn.cursor() as cur:
                for event_id, stream, agg, seq, payload in events:
                    kwargs: dict[str, Any] = (
                        {"message_prefix": MESSAGE_PREFIX}
                        if stream == MESSAGES
                        else {"table": _TABLES[stream]}
                    )
                    write_event(cur, "order", agg, "OrderPlaced", payload, event_id=event_id,
                                **kwargs)  # fmt: skip
                    cur.execute(_LEDGER_INSERT, (event_id, stream, agg, seq,
                                                 Jsonb(payload)))  # fmt: skip
            if rollback:
                conn.rollback()
            else:
                conn.commit()
            return conn
        except psycopg.OperationalError:
            conn = reconnect(dsn, conn)
            found = conn.execute("SELECT 1 FROM mix_ledger WHERE id = %s", (events[0][0],))
            done = not rollback and found.fetchone() is not None
            conn.rollback()
            if done:
                return conn


def unmarked(dsn: str) -> list[str]:
    """Rows whose mark is missing: ``public.outbox`` rows not PUBLISHED, ``shipping.events``
    rows not deleted (as ``stream:id``)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT 'public.outbox:' || id FROM public.outbox WHERE status <> 'PUBLISHED'"
            " UNION ALL SELECT 'shipping.events:' || id FROM shipping.events"
        ).fetchall()
    return [r[0] for r in rows]


def marked(dsn: str) -> int:
    """Rows marked so far (``public.outbox`` PUBLISHED and ``shipping.events`` deleted): the
    relay's progress, seen from outside."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM public.outbox WHERE status = 'PUBLISHED')"
            " + (SELECT count(*) FROM mix_ledger WHERE stream = %s)"
            " - (SELECT count(*) FROM shipping.events)",
            (DEBEZIUM_ROWS,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def committed_events(dsn: str, *, rows_only: bool = False) -> int:
    """Events committed so far (``rows_only``: those with a row, not the table-less ones)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM mix_ledger WHERE NOT %s OR stream <> %s", (rows_only, MESSAGES)
        ).fetchone()
    assert row is not None
    return int(row[0])


#: The query :class:`~tests.support.relay.UnconfirmedWindow` samples over the mix: every
#: committed event, and the rows not yet marked (what a catch-up may send again).
WINDOW_COUNTS = sql.SQL(
    "(SELECT count(*) FROM mix_ledger),"
    " (SELECT count(*) FROM public.outbox WHERE status <> 'PUBLISHED')"
    " + (SELECT count(*) FROM shipping.events)"
)
