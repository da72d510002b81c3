"""The statements of the operator actions on an outbox table (``redrive``, ``cleanup``:
:mod:`cdc_outbox.admin.outbox_ops` runs them). Moved here from ``admin/`` (issue 35:
``store/`` builds every statement on outbox tables); the text is unchanged.

All need the status columns of the default layout (``ValueError`` otherwise, from
:class:`~cdc_outbox.store.outbox_table.OutboxTable`). Parameters are named: ``%(cutoff)s``,
``%(n)s``, ``%(sample)s`` and those :func:`failed_ids` returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg import sql

from cdc_outbox.store.outbox_table import OutboxTable

__all__ = [
    "aggregates_of",
    "count_failed_of_aggregates",
    "count_published_before",
    "delete_published_before",
    "failed_ids",
    "failed_listing",
]


def failed_ids(
    outbox: OutboxTable,
    *,
    ids: Sequence[str] = (),
    event_type: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int | None = None,
) -> tuple[sql.Composed, dict[str, Any]]:
    """``SELECT`` of the ids of the FAILED rows of ``outbox`` matching every criterion given
    (``ids`` as text; ``created_at`` in ``[since, until)``), oldest first, at most ``limit``;
    and its parameters."""
    cols = outbox.columns
    conds: list[sql.Composable] = [outbox.failed()]
    params: dict[str, Any] = {}
    if ids:
        conds.append(sql.SQL("{}::text = ANY(%(ids)s::text[])").format(sql.Identifier(cols.id)))
        params["ids"] = list(ids)
    if event_type is not None:
        conds.append(sql.SQL("{} = %(event_type)s").format(sql.Identifier(cols.event_type)))
        params["event_type"] = event_type
    if since is not None:
        conds.append(sql.SQL("created_at >= %(since)s"))
        params["since"] = since
    if until is not None:
        conds.append(sql.SQL("created_at < %(until)s"))
        params["until"] = until
    query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY created_at").format(
        sql.Identifier(cols.id),
        outbox.ident,
        sql.SQL(" AND ").join(conds),
    )
    if limit is not None:
        query = sql.SQL("{} LIMIT %(limit)s").format(query)
        params["limit"] = limit
    return query, params


def failed_listing(outbox: OutboxTable, matching: sql.Composable) -> sql.Composed:
    """``SELECT`` id (as text), aggregate id, event type, attempts, ``created_at`` and
    ``last_error`` of the rows whose id ``matching`` (:func:`failed_ids`) selects, oldest
    first, at most ``%(sample)s``."""
    cols = outbox.columns
    return sql.SQL(
        "SELECT {id}::text, {agg}, {et}, attempts, created_at, last_error FROM {t}"
        " WHERE {id} IN ({matching}) ORDER BY created_at LIMIT %(sample)s"
    ).format(
        id=sql.Identifier(cols.id),
        agg=sql.Identifier(cols.aggregate_id),
        et=sql.Identifier(cols.event_type),
        t=outbox.ident,
        matching=matching,
    )


def aggregates_of(outbox: OutboxTable, matching: sql.Composable) -> sql.Composed:
    """``SELECT DISTINCT`` the aggregate ids of the rows whose id ``matching`` selects."""
    cols = outbox.columns
    return sql.SQL("SELECT DISTINCT {agg} FROM {t} WHERE {id} IN ({matching})").format(
        agg=sql.Identifier(cols.aggregate_id),
        t=outbox.ident,
        id=sql.Identifier(cols.id),
        matching=matching,
    )


def count_failed_of_aggregates(outbox: OutboxTable) -> sql.Composed:
    """``SELECT count(*)`` of the FAILED rows of the aggregates ``%s`` (an array)."""
    return sql.SQL("SELECT count(*) FROM {} WHERE {} AND {} = ANY(%s)").format(
        outbox.ident, outbox.failed(), sql.Identifier(outbox.columns.aggregate_id)
    )


def _published_before(outbox: OutboxTable) -> sql.Composed:
    return sql.SQL("{} AND published_at < %(cutoff)s").format(outbox.published())


def count_published_before(outbox: OutboxTable) -> sql.Composed:
    """``SELECT count(*)`` of the PUBLISHED rows published before ``%(cutoff)s``."""
    return sql.SQL("SELECT count(*) FROM {} WHERE {}").format(
        outbox.ident, _published_before(outbox)
    )


def delete_published_before(outbox: OutboxTable) -> sql.Composed:
    """``DELETE`` at most ``%(n)s`` of the PUBLISHED rows published before ``%(cutoff)s``,
    skipping rows locked by others (one batch of ``cleanup``)."""
    return sql.SQL(
        "WITH b AS MATERIALIZED"
        " (SELECT {id} FROM {t} WHERE {old} LIMIT %(n)s FOR UPDATE SKIP LOCKED)"
        " DELETE FROM {t} AS o USING b WHERE o.{id} = b.{id}"
    ).format(t=outbox.ident, id=sql.Identifier(outbox.columns.id), old=_published_before(outbox))
