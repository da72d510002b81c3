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
- Needs the status columns of the default column preset.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import psycopg
from psycopg import sql

from cdc_outbox import db_pool
from cdc_outbox.config import Settings
from cdc_outbox.store import schema
from cdc_outbox.store.inspection import id_column_type
from cdc_outbox.store.outbox_table import OutboxTable

logger = logging.getLogger(__name__)

Conn = psycopg.Connection[Any]


def parked_aggregates(
    conn: Conn, settings: Settings, aggregates: Sequence[str] | None = None
) -> list[tuple[str, str]]:
    """``(aggregate_id, id of its oldest FAILED row)`` for every parked aggregate (or those of
    ``aggregates``)."""
    cols = settings.column_names()
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
        t=schema.outbox_ident(settings),
        where=where,
    )
    return [(str(a), str(i)) for a, i in conn.execute(query, params).fetchall()]


class FailedRowsStore(Protocol):
    """What :class:`~cdc_outbox.delivery.engine.Delivery` needs of the FAILED rows (a test
    passes a fake table)."""

    def mark(self, items: Sequence[tuple[str, str]]) -> None: ...

    def precedes(self, event_id: str, blocker_id: str) -> bool: ...

    def close(self) -> None: ...


def order_key(settings: Settings) -> sql.Identifier:
    """The column giving an aggregate's order in the table (FAILED rows exist only in a layout
    with status columns, which has ``created_at``: :attr:`OutboxTable.order_column`)."""
    return sql.Identifier(OutboxTable.of(settings).order_column or "created_at")


class FailedRows:
    """Marks dead-lettered rows FAILED on its own connection (opened on first use)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._conn: Conn | None = None
        self._statement: sql.Composed | None = None
        self._precedes: sql.Composed | None = None
        self.marked = 0

    def mark(self, items: Sequence[tuple[str, str]]) -> None:
        """Mark ``(event_id, reason)`` rows FAILED; committed when this returns."""
        if not items:
            return
        conn = self._connect()
        try:
            cur = conn.execute(
                self._require_statement(conn),
                ([i for i, _ in items], [r for _, r in items]),
            )
        except psycopg.Error:
            self.close()
            raise
        self.marked += max(cur.rowcount, 0)

    def precedes(self, event_id: str, blocker_id: str) -> bool:
        """Whether event ``event_id`` comes before the FAILED event ``blocker_id`` in their
        aggregate's order (strictly: a tie is not before). An event whose row is gone was
        published (only published rows are deleted): before. A blocker whose row is gone
        (redriven meanwhile): not before (the key stays parked until the redrive message
        releases it). Raises ``psycopg.Error``."""
        conn = self._connect()
        try:
            query = self._require_precedes(conn)
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
            self._conn = db_pool.connect(self._settings.postgres_dsn(), autocommit=True)
        return self._conn

    def _require_precedes(self, conn: Conn) -> sql.Composed:
        if self._precedes is None:
            settings = self._settings
            ids = id_column_type(conn, settings)
            self._precedes = sql.SQL(
                "SELECT e.{key} < b.{key}, e.{id} IS NULL FROM {t} AS b LEFT JOIN {t} AS e"
                " ON e.{id} = %s::text::{ids} WHERE b.{id} = %s::text::{ids}"
            ).format(
                key=order_key(settings),
                id=sql.Identifier(settings.column_names().id),
                t=schema.outbox_ident(settings),
                ids=sql.Identifier(ids.schema, ids.type_name),
            )
        return self._precedes

    def _require_statement(self, conn: Conn) -> sql.Composed:
        if self._statement is None:
            self._statement = _mark_statement(conn, self._settings)
        return self._statement


def _mark_statement(conn: Conn, settings: Settings, only_unmarked: bool = False) -> sql.Composed:
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
        t=schema.outbox_ident(settings),
        ids=id_column_type(conn, settings).array(),
        id=sql.Identifier(settings.column_names().id),
        only=only,
    )


def mark_failed(
    conn: Conn, settings: Settings, items: Sequence[tuple[str, str]], *, only_unmarked: bool = False
) -> int:
    """Mark ``(event_id, reason)`` rows FAILED on ``conn`` (as :meth:`FailedRows.mark`);
    ``only_unmarked``: only rows still unpublished and never given a reason (a committed
    batch's dead letters marked after a crash: never a row redriven since, which keeps its
    ``last_error``). Returns the rows changed."""
    if not items:
        return 0
    statement = _mark_statement(conn, settings, only_unmarked)
    cur = conn.execute(statement, ([i for i, _ in items], [r for _, r in items]))
    return max(cur.rowcount, 0)
