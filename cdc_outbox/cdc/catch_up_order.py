"""The order in which a catch-up publishes the backlog: per aggregate, commit order.

A catch-up reads the rows of a snapshot, not the WAL, so the commit order must come from the
rows themselves. ``ctid`` (physical position) is not it: once rows are deleted or updated and
vacuumed, new rows fill the freed space of earlier pages. The key, first that applies:

1. ``columns.sequence``: a configured column whose values grow, per aggregate, in commit
   order (a per-aggregate version, or a timestamp set at insert);
2. ``created_at`` in the ``default`` layout (the default DDL sets it to ``clock_timestamp()``);
3. ``pg_xact_commit_timestamp(xmin)`` where ``track_commit_timestamp = on`` (rows of
   transactions committed before it was switched on have none and come first);
4. otherwise none: the transaction id only (see below; ``init`` and preflight warn).

Every key is followed by ``age(xmin) DESC`` (older transaction ids first), ``cmin`` (the
statement within the transaction) and ``ctid``.

Contract (what is guaranteed, per aggregate): if every transaction that writes an aggregate's
events starts writing them after the previous such transaction committed (one connection at
a time per aggregate, or a lock on the aggregate), keys 1 to 3 give that aggregate's commit
order, and within one transaction the statement order (``cmin``); rows of one multi-row
``INSERT`` statement with equal keys are ordered by ``ctid`` only. ``created_at`` set by
``now()`` (transaction start) works too under that condition, because the next transaction
starts after the previous one committed. With no key (4), the transaction id order is commit
order only if each such transaction also got its transaction id (its first write of
anything) after the previous one committed. Aggregates written by overlapping transactions
have no defined order (nor do they in the stream beyond commit order).
"""

from __future__ import annotations

from cdc_outbox.store.outbox_table import OutboxTable

__all__ = ["COMMIT_TS_SETTING", "table_order_key"]

#: The server setting that makes key 3 available.
COMMIT_TS_SETTING = "track_commit_timestamp"


def table_order_key(table: OutboxTable, commit_timestamps: bool) -> str | None:
    """A description of the primary key of the outbox ``table``'s catch-up order (see the
    module contract; the ``ORDER BY`` itself is :func:`cdc_outbox.store.catch_up_sql.order_by`);
    None when there is none."""
    column = table.order_column
    if column is not None:
        return f"column {column}"
    if commit_timestamps:
        return "commit timestamps (track_commit_timestamp)"
    return None
