"""The mark-PUBLISHED statement, composed in one place for every mode (CDC's published-marker,
the catch-up's batches, the polling relay).

Rule: a row is marked (or, with ``cdc_mark_published = "delete"``, deleted) only while it is
unpublished: ``PENDING`` or ``PROCESSING``, or a narrower state the caller owns (polling: its
own claim). ``FAILED`` rows (dead-lettered) and ``PUBLISHED`` ones are never touched. A layout
without a status column (only deletes) deletes by id alone.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from cdc_outbox.config.settings import Settings
from cdc_outbox.store.inspection import outbox_id_type
from cdc_outbox.store.outbox_table import OutboxTable

__all__ = [
    "UNPUBLISHED",
    "mark_ids",
    "mark_published_statement",
    "marking_of",
    "marking_statement",
]

#: The states a row may be marked from.
UNPUBLISHED = sql.SQL("status IN ('PENDING', 'PROCESSING')")


def mark_published_statement(
    table: sql.Composable,
    match: sql.Composable,
    *,
    delete: bool = False,
    state: sql.Composable | None = UNPUBLISHED,
) -> sql.Composed:
    """``UPDATE`` (``DELETE`` with ``delete``) of the rows of ``table`` that ``match`` and are
    in ``state``: status PUBLISHED, published now, lease cleared. ``state=None``: the layout
    has no status column (``delete`` only)."""
    if state is None:
        if not delete:
            raise ValueError("marking PUBLISHED needs a status column")
        return sql.SQL("DELETE FROM {} WHERE {}").format(table, match)
    if delete:
        return sql.SQL("DELETE FROM {} WHERE {} AND {}").format(table, match, state)
    return sql.SQL(
        "UPDATE {} SET status = 'PUBLISHED', published_at = now(), locked_by = NULL,"
        " locked_at = NULL WHERE {} AND {}"
    ).format(table, match, state)


def marking_statement(
    settings: Settings, match: sql.Composable, table: OutboxTable | None = None
) -> sql.Composed:
    """The CDC housekeeping statement (published-marker, catch-up) of the outbox ``table``
    (None: the first of ``settings``): deletes with its ``cdc_mark_published = "delete"``,
    else marks; ``match`` selects the ids."""
    return marking_of(table or OutboxTable.of(settings), match)


def marking_of(table: OutboxTable, match: sql.Composable) -> sql.Composed:
    """The CDC housekeeping statement of the outbox ``table``: deletes with its
    ``cdc_mark_published = "delete"``, else marks; ``match`` selects the ids."""
    state = UNPUBLISHED if table.has_status else None
    return mark_published_statement(
        table.ident, match, delete=table.marking == "delete", state=state
    )


def mark_ids(conn: psycopg.Connection[Any], table: OutboxTable, ids: list[str]) -> int:
    """Mark (or delete, per its ``cdc_mark_published``) the still unpublished rows of ``ids``
    (as text) in ``table``; idempotent. Returns the rows changed."""
    if not ids:
        return 0
    id_type = outbox_id_type(conn, table.schema, table.table, table.columns.id)
    match = sql.SQL("{} = ANY(%s::text[]::{})").format(
        sql.Identifier(table.columns.id), id_type.array()
    )
    return conn.execute(marking_of(table, match), (ids,)).rowcount
