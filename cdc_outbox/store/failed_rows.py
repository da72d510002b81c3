"""Dead-lettered rows in the outbox table: mark them ``FAILED``, and read which aggregates are
parked behind one (the durable side of :class:`cdc_outbox.delivery.policy.Parking`).

Contract:
- :meth:`FailedRows.mark` sets ``status = 'FAILED'`` and ``last_error`` for a batch of event
  ids and returns only once that is committed; a dead letter counts as handled (the slot may
  pass it, the polling row is settled) only after that. ``psycopg.Error`` is raised to the
  caller, who keeps the batch and tries again.
- :func:`mark_failed` does the same on the caller's connection (the exactly-once catch-up
  marks a batch's dead letters only after its Kafka commit).
- :func:`parked_aggregates` lists ``(aggregate_id, first FAILED event id)``, oldest first per
  aggregate, optionally only for some aggregates.
- :meth:`FailedRows.precedes` says whether an event comes before a FAILED one of its
  aggregate in the aggregate's order (``columns.sequence``, else ``created_at``: the order
  the catch-up and redrive use): a re-stream publishes such events as the first time.
- Ids are compared in the id column's own type (uuid, text, bigint, ...), never via ``::text``.
- Several outbox tables (issue 36): each call names its outbox (an index in the configured
  outboxes, or the :class:`~cdc_outbox.config.settings.OutboxSettings`); None/0: the first.
- Needs the status columns of the default column preset.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import psycopg
from psycopg import sql

from cdc_outbox.config.delivery import DeadLetterSection, dead_letter_section
from cdc_outbox.config.settings import OutboxSettings, Settings
from cdc_outbox.store import db_pool
from cdc_outbox.store.inspection import ColumnType, outbox_id_type
from cdc_outbox.store.outbox_table import OutboxTable

logger = logging.getLogger(__name__)

Conn = psycopg.Connection[Any]


def _table(settings: Settings, outbox: OutboxSettings | OutboxTable | None) -> OutboxTable:
    if isinstance(outbox, OutboxTable):
        return outbox
    return OutboxTable.of(settings, outbox)


def parked_aggregates(
    conn: Conn,
    settings: Settings,
    aggregates: Sequence[str] | None = None,
    outbox: OutboxSettings | OutboxTable | None = None,
) -> list[tuple[str, str]]:
    """``(aggregate_id, id of its oldest FAILED row)`` for every parked aggregate (or those of
    ``aggregates``) of ``outbox`` (None: the first)."""
    table = _table(settings, outbox)
    cols = table.columns
    where: sql.Composable = sql.SQL("")
    params: tuple[Any, ...] = ()
    if aggregates is not None:
        where = sql.SQL(" AND {} = ANY(%s)").format(sql.Identifier(cols.aggregate_id))
        params = (list(aggregates),)
    query = sql.SQL(
        "SELECT DISTINCT ON ({agg}) {agg}, {id}::text FROM {t} WHERE status = 'FAILED'{where}"
        " ORDER BY {agg}, created_at, ctid"
    ).format(
        agg=sql.Identifier(cols.aggregate_id),
        id=sql.Identifier(cols.id),
        t=table.ident,
        where=where,
    )
    return [(str(a), str(i)) for a, i in conn.execute(query, params).fetchall()]


class FailedRowsStore(Protocol):
    """What :class:`~cdc_outbox.delivery.engine.Delivery` needs of the FAILED rows (a test
    passes a fake table); ``outbox``: the index of the outbox table (see
    :mod:`cdc_outbox.delivery.outcomes`)."""

    def mark(self, items: Sequence[tuple[str, str]], outbox: int = 0) -> None: ...

    def precedes(self, event_id: str, blocker_id: str, outbox: int = 0) -> bool: ...

    def close(self) -> None: ...


def failed_rows_of(settings: Settings) -> FailedRows:
    """The :class:`FailedRows` of every outbox table ``settings`` configure."""
    return FailedRows(dead_letter_section(settings), OutboxTable.all_of(settings))


def _order_key(table: OutboxTable) -> sql.Identifier:
    """The column giving an aggregate's order in ``table`` (FAILED rows exist only in a layout
    with status columns, which has ``created_at``: :attr:`OutboxTable.order_column`)."""
    return sql.Identifier(table.order_column or "created_at")


class FailedRows:
    """Marks dead-lettered rows FAILED on its own connection (opened on first use), in the
    outbox table of each batch: ``tables[outbox]`` (every configured outbox, in configuration
    order, so ``outbox`` is the index :mod:`cdc_outbox.delivery.outcomes` describes), in the
    database of ``section``."""

    def __init__(self, section: DeadLetterSection, tables: Sequence[OutboxTable]) -> None:
        self._section = section
        self._tables = tuple(tables)
        self._conn: Conn | None = None
        self._statements: dict[int, sql.Composed] = {}
        self._precedes: dict[int, sql.Composed] = {}
        self.marked = 0

    def mark(self, items: Sequence[tuple[str, str]], outbox: int = 0) -> None:
        """Mark ``(event_id, reason)`` rows of ``outbox`` FAILED; committed when this returns."""
        if not items:
            return
        conn = self._connect()
        try:
            statement = self._statements.get(outbox)
            if statement is None:
                statement = _mark_statement(conn, self._tables[outbox])
                self._statements[outbox] = statement
            cur = conn.execute(statement, ([i for i, _ in items], [r for _, r in items]))
        except psycopg.Error:
            self.close()
            raise
        self.marked += max(cur.rowcount, 0)

    def precedes(self, event_id: str, blocker_id: str, outbox: int = 0) -> bool:
        """Whether event ``event_id`` comes before the FAILED event ``blocker_id`` (both of
        ``outbox``) in their aggregate's order (strictly: a tie is not before). An event whose
        row is gone was published (only published rows are deleted): before. A blocker whose
        row is gone (redriven meanwhile): not before (the key stays parked until the redrive
        message releases it). Raises ``psycopg.Error``."""
        conn = self._connect()
        try:
            query = self._require_precedes(conn, outbox)
            row = conn.execute(query, (event_id, blocker_id)).fetchone()
        except psycopg.Error:
            self.close()
            raise
        if row is None:
            return False
        before, gone = row
        return bool(gone or before)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connect(self) -> Conn:
        if self._conn is None or self._conn.closed:
            self._conn = db_pool.connect(self._section.dsn, autocommit=True)
        return self._conn

    def _require_precedes(self, conn: Conn, outbox: int) -> sql.Composed:
        query = self._precedes.get(outbox)
        if query is None:
            table = self._tables[outbox]
            ids = _id_type(conn, table)
            query = self._precedes[outbox] = sql.SQL(
                "SELECT e.{key} < b.{key}, e.{id} IS NULL FROM {t} AS b LEFT JOIN {t} AS e"
                " ON e.{id} = %s::text::{ids} WHERE b.{id} = %s::text::{ids}"
            ).format(
                key=_order_key(table),
                id=sql.Identifier(table.columns.id),
                t=table.ident,
                ids=sql.Identifier(ids.schema, ids.type_name),
            )
        return query


def _id_type(conn: Conn, table: OutboxTable) -> ColumnType:
    return outbox_id_type(conn, table.schema, table.table, table.columns.id)


def _mark_statement(conn: Conn, table: OutboxTable, only_unmarked: bool = False) -> sql.Composed:
    only = sql.SQL(
        " AND o.status IN ('PENDING', 'PROCESSING') AND o.last_error IS NULL"
        if only_unmarked
        else ""
    )
    return sql.SQL(
        # A row dead-lettered again after a restart keeps its first reason.
        "UPDATE {t} AS o SET status = 'FAILED', last_error = CASE WHEN o.status ="
        " 'FAILED' THEN coalesce(o.last_error, f.reason) ELSE f.reason END,"
        " locked_by = NULL, locked_at = NULL"
        " FROM unnest(%s::text[]::{ids}, %s::text[]) AS f(id, reason) WHERE o.{id} = f.id{only}"
    ).format(
        t=table.ident,
        ids=_id_type(conn, table).array(),
        id=sql.Identifier(table.columns.id),
        only=only,
    )


def mark_failed(
    conn: Conn,
    table: OutboxTable,
    items: Sequence[tuple[str, str]],
    *,
    only_unmarked: bool = False,
) -> int:
    """Mark ``(event_id, reason)`` rows of the outbox ``table`` FAILED on ``conn``
    (as :meth:`FailedRows.mark`); ``only_unmarked``: only rows still unpublished and never
    given a reason (a committed batch's dead letters marked after a crash: never a row
    redriven since, which keeps its ``last_error``). Returns the rows changed."""
    if not items:
        return 0
    statement = _mark_statement(conn, table, only_unmarked)
    cur = conn.execute(statement, ([i for i, _ in items], [r for _, r in items]))
    return max(cur.rowcount, 0)
