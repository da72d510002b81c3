"""The published-marker's statements on the outbox table (:class:`TableMarks`, the real
:class:`~cdc_outbox.cdc.published_marker.MarkSink`).

Ids are matched as the id column's own type, looked up once (first connection): uuid ids go
as one comma-joined text parameter split by the server (cheapest); any other type (text,
bigint, ...) as a real array parameter, so ids may contain commas.

A row may not be visible yet when its id arrives: a transaction's commit record is in the WAL,
so decoded, published and acknowledged, before the committing backend has finished (it may
wait for a synchronous standby, or just not be scheduled). :meth:`TableMarks.mark` therefore
reports the ids without a visible row, and :meth:`TableMarks.in_progress` the transactions
that may still make them visible.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

from cdc_outbox.config.cdc import MarkerSection
from cdc_outbox.config.settings import Settings
from cdc_outbox.store import db_pool
from cdc_outbox.store.inspection import ColumnType, outbox_id_type
from cdc_outbox.store.mark_published import marking_of
from cdc_outbox.store.outbox_table import OutboxTable

__all__ = ["UUID", "TableMarks", "marks_statement", "table_marks_statement"]

logger = logging.getLogger(__name__)

UUID = ColumnType("uuid", "pg_catalog", "uuid")
Conn = psycopg.Connection[tuple[object, ...]]


class TableMarks:
    """The marking statement of the outbox ``table``, on a connection of its own to the
    database of ``section``, made at first use."""

    def __init__(self, section: MarkerSection, table: OutboxTable) -> None:
        self._section = section
        self._table = table
        self._conn: Conn | None = None
        self._statement: sql.Composed | None = None  # for the id type; on first connection
        self._visible: sql.Composed | None = None  # which of some ids have a visible row
        self._joined = True  # one comma-joined text parameter (uuid ids), else an array

    def mark(self, ids: list[bytes]) -> tuple[int, set[bytes]]:
        """Mark ``ids``: (rows changed, the ids without a visible row). Only when the statement
        matched fewer rows than ids are they looked up; a row that became visible since is
        marked by the statement again."""
        conn = self._connect()
        assert self._statement is not None and self._visible is not None
        count = max(conn.execute(self._statement, (self._param(ids),)).rowcount, 0)
        if count >= len(ids):
            return count, set()
        rows = conn.execute(self._visible, (self._param(ids),)).fetchall()
        found = {row[0].encode() for row in rows if isinstance(row[0], str)}
        if found:  # marked now or before, FAILED, or visible only now: mark those
            again = conn.execute(self._statement, (self._param(sorted(found)),))
            count += max(again.rowcount, 0)
        return count, set(ids) - found

    def in_progress(self) -> frozenset[str]:
        """Transaction ids in progress now: the current snapshot's, and those of the backends
        (a transaction past the snapshot's ``xmax`` is in neither list of the snapshot; a role
        without ``pg_read_all_stats`` sees only its own sessions' ids)."""
        rows = (
            self._connect()
            .execute(
                "SELECT x::xid::text FROM pg_snapshot_xip(pg_current_snapshot()) x UNION"
                " SELECT backend_xid::text FROM pg_stat_activity WHERE backend_xid IS NOT NULL"
            )
            .fetchall()
        )
        return frozenset(str(row[0]) for row in rows)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _connect(self) -> Conn:
        conn = self._conn
        if conn is None or conn.closed:
            conn = self._conn = db_pool.connect(self._section.dsn, autocommit=True)
        if self._statement is None:
            t = self._table
            id_type = outbox_id_type(conn, t.schema, t.table, t.columns.id)
            self._statement = table_marks_statement(t, id_type)
            self._visible = _visible_statement(t, id_type)
            self._joined = id_type.is_uuid
            logger.debug("marking published rows by %s ids", id_type.name)
        return conn

    def _param(self, ids: list[bytes]) -> str | list[str]:
        # uuid: one text parameter, split by the server, far cheaper than adapting a list
        # (a uuid has no comma); other types: a text array, cast by the statement.
        return b",".join(ids).decode() if self._joined else [i.decode() for i in ids]


def _ids_match(table: OutboxTable, id_type: ColumnType) -> sql.Composed:
    """``<id column> = ANY(<the one parameter>)`` for ids of ``id_type``."""
    if id_type.is_uuid:
        ids: sql.Composable = sql.SQL("string_to_array(%s, ',')::uuid[]")
    else:
        ids = sql.SQL("%s::text[]::{}").format(id_type.array())
    return sql.SQL("{} = ANY({})").format(sql.Identifier(table.columns.id), ids)


def _visible_statement(table: OutboxTable, id_type: ColumnType) -> sql.Composed:
    """``SELECT`` of the ids (as text) among the parameter's whose row is visible."""
    return sql.SQL("SELECT {}::text FROM {} WHERE {}").format(
        sql.Identifier(table.columns.id), table.ident, _ids_match(table, id_type)
    )


def marks_statement(
    settings: Settings, id_type: ColumnType, table: OutboxTable | None = None
) -> sql.Composed | None:
    """The UPDATE/DELETE for a batch of ids of ``id_type`` in the outbox ``table`` (None: the
    first of ``settings``), or None when its housekeeping is off.

    Its one parameter: for uuid ids the ids comma-joined in one text, else a list of texts."""
    return table_marks_statement(table or OutboxTable.of(settings), id_type)


def table_marks_statement(table: OutboxTable, id_type: ColumnType) -> sql.Composed | None:
    """The UPDATE/DELETE for a batch of ids of ``id_type`` in the outbox ``table``, or None
    when its housekeeping is off (parameter: as :func:`marks_statement`'s)."""
    if table.marking == "delete" or (table.marking == "update" and table.has_status):
        return marking_of(table, _ids_match(table, id_type))
    return None
