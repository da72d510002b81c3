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
import threading
import time
from typing import Protocol

import psycopg
from psycopg import sql

from cdc_outbox import db_pool
from cdc_outbox.cdc import catch_up_order
from cdc_outbox.cdc.published_marker import PublishedMarker
from cdc_outbox.config import Settings
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.errors import CdcOutboxError, RelayHalted
from cdc_outbox.kafka.publisher import ProduceInterrupted, TransactionFailed
from cdc_outbox.outbox_mapping import OutboxMapper
from cdc_outbox.progress import Progress
from cdc_outbox.records import DeadLetter, OutboxRecord
from cdc_outbox.store.failed_rows import mark_failed
from cdc_outbox.store.mark_published import marking_statement
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.store.schema import outbox_ident

logger = logging.getLogger(__name__)


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
    settings: Settings, mapper: OutboxMapper, commit_timestamps: bool = False
) -> sql.Composed:
    """The rows a catch-up publishes, as text in ``mapper.row_columns`` order, each
    aggregate's in commit order (:mod:`cdc_outbox.cdc.catch_up_order`); ``commit_timestamps``:
    the server has ``track_commit_timestamp`` on. The default layout's query also returns the
    ``FAILED`` rows (they park their aggregate from there on), with ``status`` as one more
    last column."""
    columns = sql.SQL(", ").join(
        sql.SQL("{}::text").format(sql.Identifier(n)) for n in mapper.row_columns
    )
    table = outbox_ident(settings)
    order = catch_up_order.order_by(settings, commit_timestamps)
    outbox = OutboxTable.of(settings)
    if not outbox.has_status:
        # No status column: the table holds only unpublished rows (cdc_mark_published =
        # "delete"; the service refuses a catch-up with "off" over a non-empty table).
        return sql.SQL("SELECT {} FROM {} ORDER BY {}").format(columns, table, order)
    # PROCESSING rows were claimed by a polling worker that has stopped: their outcome is
    # unknown, so they are published again (duplicates, never losses).
    return sql.SQL("SELECT {}, status FROM {} WHERE {} OR {} ORDER BY {}").format(
        columns, table, outbox.unpublished(), outbox.failed(), order
    )


def backlog_count_query(settings: Settings) -> sql.Composed:
    """One COUNT of the rows :func:`backlog_query` returns (the catch-up's progress total)."""
    return OutboxTable.of(settings).count_unpublished()


def _start_progress(
    conn: psycopg.Connection[tuple[object, ...]], settings: Settings, delivery: Delivery
) -> Progress:
    row = conn.execute(backlog_count_query(settings)).fetchone()
    total = int(str(row[0])) if row else 0
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


def publish_backlog(
    settings: Settings,
    snapshot: str,
    delivery: Delivery,
    mapper: OutboxMapper,
    eos: CatchUpCommitter | None = None,
) -> int:
    """Publish every unpublished row visible in ``snapshot``; see the module contract."""
    backlog = _Backlog()
    marking = _Marking(settings)
    count = 0
    ids: list[str] = []
    id_bytes = 0
    delivery.new_session()
    delivery.defer_failed = eos is not None  # FAILED only once the dead letter is committed
    try:
        if eos is not None:
            delivery.ensure_transactions()
        with (
            db_pool.connect(settings.postgres_dsn()) as conn,
            db_pool.connect(settings.postgres_dsn(), autocommit=True) as marks,
            marking,  # joined before ``marks`` closes
        ):
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            with conn.transaction():
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
                bookkept = OutboxTable.of(settings).has_status
                delivery.parking.load(())  # FAILED rows park their aggregate where they come
                commit_ts = _commit_timestamps(conn)
                progress = _start_progress(conn, settings, delivery)
                logger.info(
                    "catch-up order per aggregate: %s",
                    catch_up_order.order_key(settings, commit_ts) or "transaction ids",
                )
                with conn.cursor(name="cdc_outbox_backlog") as cur:
                    cur.itersize = _FETCH
                    cur.execute(backlog_query(settings, mapper, commit_ts))
                    for values in cur:
                        if bookkept:
                            status, values = values[-1], values[:-1]
                            if status == "FAILED":
                                _park(delivery, mapper.map_row(values))
                                continue
                        backlog.pending += 1
                        record = mapper.map_row(values)
                        if eos is not None and record.event_id is not None:
                            ids.append(record.event_id)
                            id_bytes += len(record.event_id) + 3
                        delivery.submit(record, backlog)
                        count += 1
                        if count % _FETCH == 0:
                            _report(progress, delivery, count)
                            delivery.service()
                            _check(delivery, backlog)
                            if eos is None:
                                _bound_unmarked(delivery, backlog)
                            if eos is not None and (
                                len(ids) >= settings.eos.max_events
                                or id_bytes + _reason_bytes(delivery) >= _MAX_ID_BYTES
                            ):
                                _commit(delivery, backlog, eos, ids, marks, marking)
                                id_bytes = 0
                _report(progress, delivery, count, last=True)
            _settle(delivery, backlog)
            if eos is not None and ids:
                _commit(delivery, backlog, eos, ids, marks, marking)
            marking.wait()
            marker = _marker(delivery)
            if eos is None and marker is not None:
                while not marker.settle(0.1):  # all marked before streaming
                    _check(delivery, backlog)
    except ProduceInterrupted as exc:
        _check(delivery, backlog)
        raise CatchUpFailed(f"catch-up interrupted: {exc.args[0]}") from None
    except TransactionFailed as exc:
        raise CatchUpFailed(f"catch-up Kafka transactions failed: {exc}") from None
    finally:
        delivery.defer_failed = False
        delivery.stats.catch_up_progress = None
    logger.info("published %d rows pending in the new slot's snapshot", count)
    return count


def _reason_bytes(delivery: Delivery) -> int:
    """The checkpoint bytes the reasons of the batch's dead letters take so far."""
    return sum(len(reason) + 6 for _, reason in delivery.failed_after_commit)


def _park(delivery: Delivery, row: OutboxRecord | DeadLetter) -> None:
    """A ``FAILED`` row of the backlog: its aggregate is parked from here on."""
    if row.event_id is not None:
        delivery.parking.park(row.key, row.event_id)


def _commit_timestamps(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
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


def _commit(
    delivery: Delivery,
    backlog: _Backlog,
    eos: CatchUpCommitter,
    ids: list[str],
    marks: psycopg.Connection[tuple[object, ...]],
    marking: _Marking,
) -> None:
    """Exactly-once: commit the rows so far with their ids in the checkpoint (once the
    previous batch is marked), the dead-lettered ones with their reasons, then start marking
    them: FAILED (only now: were the commit aborted, the redo would dead-letter them again),
    then PUBLISHED."""
    _settle(delivery, backlog)
    marking.wait()
    dead = list(delivery.failed_after_commit)
    failed = {i for i, _ in dead}
    published = [i for i in ids if i not in failed]
    try:
        eos.commit(catch_up_ids=published, dead_letters=dead)
    except TransactionFailed as exc:
        raise CatchUpFailed(f"catch-up Kafka commit failed: {exc}") from None
    delivery.failed_after_commit.clear()
    marking.start(marks, published, dead)
    ids.clear()


class _Marking:
    """Exactly-once catch-up: :func:`mark_published` of the last committed batch on a helper
    thread; :meth:`wait` (before the next commit and at the end) re-raises its error."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(
        self,
        conn: psycopg.Connection[tuple[object, ...]],
        ids: list[str],
        dead_letters: list[tuple[str, str]],
    ) -> None:
        self.wait()

        def mark() -> None:
            try:
                mark_failed(conn, self.settings, dead_letters)
                mark_published(conn, self.settings, ids)
            except BaseException as exc:  # re-raised by wait()
                self._error = exc

        self._thread = threading.Thread(target=mark, name="catch-up-marking", daemon=True)
        self._thread.start()

    def __enter__(self) -> _Marking:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:  # never leave it using a closing connection
            self._thread.join()
            self._thread = None

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error


def mark_published(
    conn: psycopg.Connection[tuple[object, ...]], settings: Settings, ids: list[str]
) -> int:
    """Mark (or delete, with ``cdc_mark_published = "delete"``) the still unpublished rows of
    ``ids``; idempotent. Returns the rows changed."""
    from cdc_outbox.store.inspection import id_column_type

    if not ids:
        return 0
    match = sql.SQL("{} = ANY(%s::text[]::{})").format(
        sql.Identifier(settings.column_names().id), id_column_type(conn, settings).array()
    )
    return conn.execute(marking_statement(settings, match), (ids,)).rowcount


def mark_committed_batch(
    conn: psycopg.Connection[tuple[object, ...]],
    settings: Settings,
    ids: list[str],
    dead_letters: list[tuple[str, str]],
) -> None:
    """Mark the rows of a committed catch-up batch (the last checkpoint's, before the next
    catch-up takes its snapshot): its dead letters FAILED (only rows never marked since: a
    row redriven meanwhile keeps its ``last_error`` and is left alone), its other rows
    PUBLISHED; idempotent."""
    failed = mark_failed(conn, settings, dead_letters, only_unmarked=True)
    marked = mark_published(conn, settings, ids)
    logger.info(
        "marked the last committed catch-up batch: %d rows published, %d FAILED", marked, failed
    )


def _check(delivery: Delivery, backlog: _Backlog) -> None:
    delivery.stats.beat()
    if delivery.halt_reason is not None:
        raise RelayHalted(delivery.halt_reason)
    problem = backlog.error or delivery.restart_reason or delivery.interrupted()
    if problem is not None:
        raise CatchUpFailed(f"publishing the snapshot backlog failed: {problem}")
