"""Catch-up: publish the rows still unpublished in a new slot's exported snapshot.

When a slot is (re)created, rows committed before its consistent point will never be streamed.
Those still unpublished in the slot's exported snapshot (``PENDING`` or ``PROCESSING``; every
row for a layout without a status column, whose published rows are deleted) are submitted
here through the same :class:`~cdc_outbox.delivery.engine.Delivery` as the stream, and all
must be acknowledged or durably dead-lettered before streaming starts from the consistent
point: so nothing falls between the two and per-aggregate order holds (backlog first, each
aggregate's rows in commit order as :mod:`cdc_outbox.cdc.catch_up_order` defines it, then the
stream). Aggregates with a ``FAILED`` row in the snapshot are parked, as everywhere, but only
from that row's place in the aggregate's order on: the query returns the ``FAILED`` rows too,
in the same order, and each parks its aggregate where it comes (it is not published again);
unpublished rows before it (a re-stream's leftovers: published, not yet marked) are
published as the first time.

Several outbox tables (issue 36): the backlog of each (or of those given: a table the slot has
not streamed yet, :mod:`cdc_outbox.cdc.new_tables`) is published from the same snapshot, one
table after the other, each in its own commit order (two tables share no aggregate); each
row's outcome, marks and parking are its own table's.

Contract: :func:`publish_backlog` returns the number of rows once every outcome is known (and,
at least once, every published row is marked PUBLISHED by the published-marker), or
raises :class:`CatchUpFailed` (Kafka trouble, stop, leadership lost) or ``RelayHalted``. The
caller's durable phase stays ``CATCHING_UP`` until it returns, so a crash anywhere here means
the whole catch-up is redone (rows acknowledged and already marked PUBLISHED are skipped;
others are sent again: duplicates, never losses). At least once, at most ``UNMARKED_WINDOW``
rows are unacknowledged and at most as many acknowledged but not yet marked at any time, so a
redo re-sends at most about ``2 * UNMARKED_WINDOW + 1000`` rows, whatever the backlog.

Exactly-once (``eos`` given): the rows go in Kafka transactions of about ``eos.max_events``
rows (fewer if their ids would exceed 400 kB); each carries a checkpoint record with the ids
of its rows (and the reasons of its dead letters), and after each commit those rows are
marked, dead letters FAILED and the others PUBLISHED (on a helper thread, while the next
batch is produced), before the next batch commits. A dead-lettered row stays unpublished
until then, so a batch that does not commit (an abort, a crash) leaves it to the redo,
which dead-letters it again: each dead letter is committed once. A crash loses at most the
marking of the last committed batch: :func:`mark_committed_batch` of the last checkpoint,
before the next catch-up takes its snapshot, makes the redo skip its rows (no duplicates).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

import psycopg
from psycopg import sql

from cdc_outbox.cdc import catch_up_order
from cdc_outbox.cdc.catch_up_marks import Marking, mark_committed_batch, qualify
from cdc_outbox.cdc.published_marker import PublishedMarker
from cdc_outbox.config.cdc import CatchUpSection
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.delivery.policy import parking_key
from cdc_outbox.errors import CdcOutboxError, RelayHalted
from cdc_outbox.kafka.publisher import ProduceInterrupted, TransactionFailed
from cdc_outbox.mapping.rows import OutboxMapper
from cdc_outbox.records import DeadLetter, OutboxRecord
from cdc_outbox.store import catch_up_sql, db_pool
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.telemetry.progress import Progress

logger = logging.getLogger(__name__)

__all__ = [
    "UNMARKED_WINDOW",
    "CatchUpFailed",
    "backlog_count_query",
    "backlog_query",
    "mark_committed_batch",
    "publish_backlog",
]

Conn = psycopg.Connection[Any]


class CatchUpCommitter(Protocol):
    """What a catch-up needs of :class:`cdc_outbox.cdc.eos.EosCommitter` (which imports this
    module, so it is named by shape, not imported)."""

    def commit(
        self,
        catch_up_ids: list[str] | None = None,
        dead_letters: list[tuple[str, str]] | None = None,
    ) -> None: ...


def _marker(delivery: Delivery) -> PublishedMarker | None:
    """The published-marker the relay gave ``delivery`` (the only listener a catch-up sees)."""
    marker = delivery.marker
    assert marker is None or isinstance(marker, PublishedMarker)
    return marker


_FETCH = 1_000
#: At least once: rows of the backlog unacknowledged, and acknowledged but unmarked, at most.
UNMARKED_WINDOW = 2_000
#: Exactly-once: a catch-up batch's ids (in its checkpoint record) stay well below Kafka's
#: default 1 MB record limit.
_MAX_ID_BYTES = 400_000


class CatchUpFailed(CdcOutboxError):
    """The backlog could not be published now; the catch-up must be redone."""


class _Backlog:
    """Outcome counter of the backlog's events (an
    :class:`~cdc_outbox.delivery.outcomes.EventHandle`)."""

    __slots__ = ("error", "pending")

    def __init__(self) -> None:
        self.pending = 0
        self.error: str | None = None

    def published(self, topic: str) -> None:
        self.pending -= 1

    def dead_lettered(self) -> None:
        self.pending -= 1

    def retry(self, reason: str) -> None:
        self.error = self.error or reason


def backlog_query(
    outbox: OutboxTable, mapper: OutboxMapper, commit_timestamps: bool = False
) -> sql.Composed:
    """The rows a catch-up publishes from the outbox table ``outbox``, as text in
    ``mapper.row_columns`` order, each aggregate's in commit order
    (:mod:`cdc_outbox.cdc.catch_up_order`); ``commit_timestamps``: the server has
    ``track_commit_timestamp`` on. Built by :func:`cdc_outbox.store.catch_up_sql.backlog_query`
    (with status columns, the ``FAILED`` rows too, ``status`` as one more last column)."""
    return catch_up_sql.backlog_query(outbox, mapper.row_columns, commit_timestamps)


def backlog_count_query(table: OutboxTable) -> sql.Composed:
    """One COUNT of the rows :func:`backlog_query` returns (the catch-up's progress total)."""
    return table.count_unpublished()


def _start_progress(conn: Conn, tables: list[OutboxTable], delivery: Delivery) -> Progress:
    total = 0
    for table in tables:
        row = conn.execute(table.count_unpublished()).fetchone()
        total += int(str(row[0])) if row else 0
    delivery.stats.catch_up_rows_total = total
    delivery.stats.catch_up_rows_done = 0
    logger.info("catch-up: %d rows to publish", total)
    progress = delivery.stats.catch_up_progress = Progress(total=total, started=time.monotonic())
    return progress


def _report(progress: Progress, delivery: Delivery, done: int, last: bool = False) -> None:
    """Rows submitted so far: the metric at once, a log line at most every LOG_INTERVAL
    (and always for the ``last`` report)."""
    progress.done = done
    delivery.stats.catch_up_rows_done = done
    now = time.monotonic()
    if progress.due(now) or last:
        logger.info("catch-up progress: %s", progress.line(now))


class _Run:
    """One catch-up's state across its tables (rows submitted, the open exactly-once batch);
    ``outboxes``: every configured outbox table (ids are qualified among them)."""

    def __init__(
        self,
        section: CatchUpSection,
        outboxes: Sequence[OutboxTable],
        delivery: Delivery,
        eos: CatchUpCommitter | None,
        marks: Conn,
        marking: Marking,
    ) -> None:
        self.section, self.outboxes = section, tuple(outboxes)
        self.delivery, self.eos = delivery, eos
        self.marks, self.marking = marks, marking
        self.backlog = _Backlog()
        self.count = 0
        self.ids: list[str] = []  # exactly-once: the open batch's rows (qualified ids)
        self.id_bytes = 0

    def table(
        self, conn: Conn, n: int, table: OutboxTable, mapper: OutboxMapper, commit_ts: bool,
        progress: Progress,
    ) -> None:  # fmt: skip
        """Submit the backlog of outbox ``n`` (``table``), in its commit order."""
        delivery, eos, backlog = self.delivery, self.eos, self.backlog
        logger.info(
            "catch-up order per aggregate of %s: %s",
            table.name,
            catch_up_order.table_order_key(table, commit_ts) or "transaction ids",
        )
        with conn.cursor(name="cdc_outbox_backlog") as cur:
            cur.itersize = _FETCH
            cur.execute(backlog_query(table, mapper, commit_ts))
            for values in cur:
                if table.has_status:
                    status, values = values[-1], values[:-1]
                    if OutboxTable.is_dead_letter(status):
                        _park(delivery, mapper.map_row(values), n)
                        continue
                backlog.pending += 1
                record = mapper.map_row(values)
                if eos is not None and record.event_id is not None:
                    self.ids.append(qualify(self.outboxes, table, record.event_id))
                    self.id_bytes += len(self.ids[-1]) + 3
                delivery.submit(record, backlog, n)
                self.count += 1
                if self.count % _FETCH == 0:
                    self.turn(progress)

    def turn(self, progress: Progress) -> None:
        delivery, backlog, eos = self.delivery, self.backlog, self.eos
        _report(progress, delivery, self.count)
        delivery.service()
        _check(delivery, backlog)
        if eos is None:
            _bound_unmarked(delivery, backlog)
        elif (
            len(self.ids) >= self.section.max_events
            or self.id_bytes + _reason_bytes(delivery) >= _MAX_ID_BYTES
        ):
            self.commit()

    def commit(self) -> None:
        """Exactly-once: commit the rows so far with their ids in the checkpoint (once the
        previous batch is marked), the dead-lettered ones with their reasons, then start
        marking them: FAILED (only now: were the commit aborted, the redo would dead-letter
        them again), then PUBLISHED."""
        delivery, eos = self.delivery, self.eos
        assert eos is not None
        _settle(delivery, self.backlog)
        self.marking.wait()
        tables = self.outboxes
        dead = [
            (qualify(tables, tables[n], i), reason) for i, reason, n in delivery.failed_after_commit
        ]
        failed = {i for i, _ in dead}
        published = [i for i in self.ids if i not in failed]
        try:
            eos.commit(catch_up_ids=published, dead_letters=dead)
        except TransactionFailed as exc:
            raise CatchUpFailed(f"catch-up Kafka commit failed: {exc}") from None
        delivery.failed_after_commit.clear()
        self.marking.start(self.marks, published, dead)
        self.ids.clear()
        self.id_bytes = 0


def publish_backlog(
    section: CatchUpSection,
    outboxes: Sequence[OutboxTable],
    snapshot: str,
    delivery: Delivery,
    mappers: Sequence[OutboxMapper],
    eos: CatchUpCommitter | None = None,
    tables: Sequence[int] | None = None,
) -> int:
    """Publish every unpublished row visible in ``snapshot`` of the outboxes ``tables``
    (indices in ``outboxes``, every configured outbox table, whose mappers ``mappers`` are, in
    that order; None: every outbox), one table after the other, each in its own commit order,
    in the database of ``section``; see the module contract."""
    chosen = list(range(len(outboxes)) if tables is None else tables)
    marking = Marking(outboxes)
    delivery.new_session()
    delivery.defer_failed = eos is not None  # FAILED only once the dead letter is committed
    run: _Run | None = None
    try:
        if eos is not None:
            delivery.ensure_transactions()
        with (
            db_pool.connect(section.dsn) as conn,
            db_pool.connect(section.dsn, autocommit=True) as marks,
            marking,  # joined before ``marks`` closes
        ):
            run = _Run(section, outboxes, delivery, eos, marks, marking)
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            with conn.transaction():
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
                delivery.parking.load(())  # FAILED rows park their aggregate where they come
                commit_ts = _commit_timestamps(conn)
                progress = _start_progress(conn, [outboxes[n] for n in chosen], delivery)
                for n in chosen:
                    run.table(conn, n, outboxes[n], mappers[n], commit_ts, progress)
                _report(progress, delivery, run.count, last=True)
            _settle(delivery, run.backlog)
            if eos is not None and run.ids:
                run.commit()
            marking.wait()
            marker = _marker(delivery)
            if eos is None and marker is not None:
                while not marker.settle(0.1):  # all marked before streaming
                    _check(delivery, run.backlog)
    except ProduceInterrupted as exc:
        if run is not None:
            _check(delivery, run.backlog)
        raise CatchUpFailed(f"catch-up interrupted: {exc.args[0]}") from None
    except TransactionFailed as exc:
        raise CatchUpFailed(f"catch-up Kafka transactions failed: {exc}") from None
    finally:
        delivery.defer_failed = False
        delivery.stats.catch_up_progress = None
    count = run.count if run is not None else 0
    logger.info("published %d rows pending in the snapshot", count)
    return count


def _reason_bytes(delivery: Delivery) -> int:
    """The checkpoint bytes the reasons of the batch's dead letters take so far."""
    return sum(len(reason) + 6 + len(i) for i, reason, _ in delivery.failed_after_commit)


def _park(delivery: Delivery, row: OutboxRecord | DeadLetter, outbox: int) -> None:
    """A ``FAILED`` row of the backlog: its aggregate is parked from here on."""
    if row.event_id is not None:
        delivery.parking.park(parking_key(outbox, row.key), row.event_id)


def _commit_timestamps(conn: Conn) -> bool:
    row = conn.execute(
        "SELECT current_setting(%s) = 'on'", (catch_up_order.COMMIT_TS_SETTING,)
    ).fetchone()
    return bool(row and row[0])


def _settle(delivery: Delivery, backlog: _Backlog) -> None:
    """Wait until every outcome is known (dead-lettered rows are then FAILED)."""
    while backlog.pending > 0 or (delivery.eos and delivery.busy):
        delivery.publisher.poll(0.05)
        delivery.service()
        _check(delivery, backlog)


def _bound_unmarked(delivery: Delivery, backlog: _Backlog) -> None:
    """At least once: wait while more than ``UNMARKED_WINDOW`` rows are unacknowledged or
    acknowledged but unmarked (see the module contract). While it waits the marker is woken
    at every turn that finds ids to mark: the acknowledgements served meanwhile would
    otherwise wait for its flush interval, and the catch-up with them (issue 38)."""
    marker = _marker(delivery)
    if marker is None:
        return
    if marker.unmarked >= UNMARKED_WINDOW // 2:
        marker.hurry()
    while backlog.pending > UNMARKED_WINDOW or marker.unmarked > UNMARKED_WINDOW:
        if marker.unmarked:
            marker.hurry()
        delivery.publisher.poll(0.005)
        delivery.service()
        _check(delivery, backlog)


def _check(delivery: Delivery, backlog: _Backlog) -> None:
    delivery.stats.beat()
    if delivery.halt_reason is not None:
        raise RelayHalted(delivery.halt_reason)
    problem = backlog.error or delivery.restart_reason or delivery.interrupted()
    if problem is not None:
        raise CatchUpFailed(f"publishing the snapshot backlog failed: {problem}")
