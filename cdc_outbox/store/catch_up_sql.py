"""The statements a catch-up runs on an outbox table: the backlog query and its commit order.

The order, per aggregate, is commit order as :mod:`cdc_outbox.cdc.catch_up_order` defines it
(its module doc is the contract): the table's order column (``OutboxTable.order_column``),
else ``pg_xact_commit_timestamp(xmin)`` where the server tracks commit timestamps, each
followed by the transaction id's age, ``cmin`` and ``ctid``. Moved here from ``cdc/`` (issue
35: ``store/`` builds every statement on outbox tables); the text is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from cdc_outbox.store.outbox_table import OutboxTable

__all__ = ["backlog_query", "order_by"]

_TAIL = sql.SQL("age(xmin) DESC, cmin::text::bigint, ctid")  # cid has no ordering


def order_by(table: OutboxTable, commit_timestamps: bool) -> sql.Composed:
    """The ``ORDER BY`` list of the backlog query of ``table``; ``commit_timestamps``: the
    server has ``track_commit_timestamp`` on."""
    column = table.order_column
    if column is not None:
        key: sql.Composable = sql.Identifier(column)
    elif commit_timestamps:
        key = sql.SQL("pg_xact_commit_timestamp(xmin) NULLS FIRST")
    else:
        return sql.Composed([_TAIL])
    return sql.SQL("{}, {}").format(key, _TAIL)


def backlog_query(
    outbox: OutboxTable, row_columns: Sequence[str], commit_timestamps: bool = False
) -> sql.Composed:
    """The rows a catch-up publishes from ``outbox``, as text in ``row_columns`` order, each
    aggregate's in commit order (:func:`order_by`). A layout with status columns also returns
    the ``FAILED`` rows (they park their aggregate from there on), with ``status`` as one more
    last column."""
    columns = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(n)) for n in row_columns)
    order = order_by(outbox, commit_timestamps)
    if not outbox.has_status:
        # No status column: the table holds only unpublished rows (cdc_mark_published =
        # "delete"; the service refuses a catch-up with "off" over a non-empty table).
        return sql.SQL("SELECT {} FROM {} ORDER BY {}").format(columns, outbox.ident, order)
    # PROCESSING rows were claimed by a polling worker that has stopped: their outcome is
    # unknown, so they are published again (duplicates, never losses).
    return sql.SQL("SELECT {}, status FROM {} WHERE {} OR {} ORDER BY {}").format(
        columns, outbox.ident, outbox.unpublished(), outbox.failed(), order
    )
