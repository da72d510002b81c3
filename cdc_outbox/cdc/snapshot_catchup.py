"""Catch-up: publish the rows still unpublished in a new slot's exported snapshot.

When a slot is (re)created, rows committed before its consistent point will never be streamed.
Those still unpublished in the slot's exported snapshot (``PENDING`` or ``PROCESSING``; every
row for a layout without a status column) are submitted here through the same
:class:`~cdc_outbox.delivery.engine.Delivery` as the stream, oldest first, and all must be
acknowledged or durably dead-lettered before streaming starts from the consistent point: so
nothing falls between the two and per-aggregate order holds (backlog first, then the stream
in commit order). Aggregates with a ``FAILED`` row in the snapshot are parked, as everywhere.

Contract: :func:`publish_backlog` returns the number of rows once every outcome is known, or
raises :class:`CatchUpFailed` (Kafka trouble, stop, leadership lost) or ``RelayHalted``. The
caller's durable phase stays ``CATCHING_UP`` until it returns, so a crash anywhere here means
the whole catch-up is redone (rows acknowledged and already marked PUBLISHED are skipped;
others are sent again: duplicates, never losses).
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

from cdc_outbox.config import Settings
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.delivery.failed_rows import parked_aggregates
from cdc_outbox.errors import CdcOutboxError, RelayHalted
from cdc_outbox.kafka.publisher import ProduceInterrupted
from cdc_outbox.outbox_mapping import OutboxMapper

logger = logging.getLogger(__name__)

_FETCH = 1_000


class CatchUpFailed(CdcOutboxError):
    """The backlog could not be published now; the catch-up must be redone."""


class _Backlog:
    """Outcome counter of the backlog's events (an
    :class:`~cdc_outbox.delivery.engine.EventHandle`)."""

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


def backlog_query(settings: Settings, mapper: OutboxMapper) -> sql.Composed:
    """The rows a catch-up publishes, oldest first, as text in ``mapper.row_columns`` order."""
    columns = sql.SQL(", ").join(
        sql.SQL("{}::text").format(sql.Identifier(n)) for n in mapper.row_columns
    )
    table = sql.Identifier(settings.outbox_schema, settings.outbox_table)
    if settings.columns.preset != "default":
        # No status and no created_at column: every row, in physical (insertion) order.
        return sql.SQL("SELECT {} FROM {} ORDER BY ctid").format(columns, table)
    # PROCESSING rows were claimed by a polling worker that has stopped: their outcome is
    # unknown, so they are published again (duplicates, never losses).
    return sql.SQL(
        "SELECT {} FROM {} WHERE status IN ('PENDING', 'PROCESSING') ORDER BY created_at, ctid"
    ).format(columns, table)


def publish_backlog(
    settings: Settings, snapshot: str, delivery: Delivery, mapper: OutboxMapper
) -> int:
    """Publish every unpublished row visible in ``snapshot``; see the module contract."""
    backlog = _Backlog()
    count = 0
    delivery.new_session()
    try:
        with psycopg.connect(settings.postgres_dsn()) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            with conn.transaction():
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
                if settings.columns.preset == "default":
                    delivery.parking.load(parked_aggregates(conn, settings))
                with conn.cursor(name="cdc_outbox_backlog") as cur:
                    cur.itersize = _FETCH
                    cur.execute(backlog_query(settings, mapper))
                    for values in cur:
                        backlog.pending += 1
                        delivery.submit(mapper.map_row(values), backlog)
                        count += 1
                        if count % _FETCH == 0:
                            delivery.service()
                            _check(delivery, backlog)
        while backlog.pending > 0:
            delivery.publisher.poll(0.05)
            delivery.service()
            _check(delivery, backlog)
    except ProduceInterrupted as exc:
        _check(delivery, backlog)
        raise CatchUpFailed(f"catch-up interrupted: {exc.args[0]}") from None
    logger.info("published %d rows pending in the new slot's snapshot", count)
    return count


def _check(delivery: Delivery, backlog: _Backlog) -> None:
    delivery.stats.beat()
    if delivery.halt_reason is not None:
        raise RelayHalted(delivery.halt_reason)
    problem = backlog.error or delivery.restart_reason or delivery.interrupted()
    if problem is not None:
        raise CatchUpFailed(f"publishing the snapshot backlog failed: {problem}")
