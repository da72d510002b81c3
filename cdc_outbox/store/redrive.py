"""Redrive: release parked aggregates and publish their dead-lettered events again, in order.

Contract of :func:`redrive_aggregates` (one transaction):

1. every ``FAILED`` row of the given aggregates is locked and copied, oldest first
   (``created_at``, then physical position);
2. a transactional logical message ``cdc_outbox.redrive`` names the table, the aggregates and
   the event ids (a CDC relay releases those aggregates at exactly this point of the stream);
3. the rows are deleted and inserted again unchanged but ``PENDING`` (attempts 0, due now,
   ``last_error`` kept), in their original order, with the same event ids.

So the re-inserted events reach every mode in order, behind nothing and ahead of the
aggregate's later events: CDC streams the inserts after the message, polling and catch-up
see PENDING rows with no FAILED row left in their aggregate. Whole aggregates are redriven
(a single event of a parked aggregate cannot be, without breaking its order). An event parked
while the redrive ran stays ``FAILED`` and keeps its aggregate parked (nothing overtakes it):
run redrive again. Needs INSERT and DELETE on the outbox (run it as the table owner).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from cdc_outbox.store.outbox_table import OutboxTable

__all__ = [
    "REDRIVE_MESSAGE_PREFIX",
    "RedriveRequest",
    "parse_redrive_message",
    "redrive_aggregates",
]

REDRIVE_MESSAGE_PREFIX = "cdc_outbox.redrive"
#: Columns reset on the re-inserted row (the event itself is never changed).
_RESET = {
    "status": sql.SQL("'PENDING'"),
    "attempts": sql.SQL("0"),
    "available_at": sql.SQL("now()"),
    "locked_at": sql.SQL("NULL"),
    "locked_by": sql.SQL("NULL"),
    "published_at": sql.SQL("NULL"),
}
_TEMP = sql.Identifier("cdc_outbox_redrive")


@dataclass(frozen=True, slots=True)
class RedriveRequest:
    """What a redrive message says: the table (``schema.table``), its aggregates and the
    event ids that were re-inserted."""

    table: str
    aggregates: tuple[str, ...]
    ids: frozenset[str]


def parse_redrive_message(
    prefix: str, transactional: bool, content: bytes
) -> RedriveRequest | None:
    """The request in a decoded logical message, or None if it is not a redrive message
    (pure; the relay applies it at its position in the stream)."""
    if prefix != REDRIVE_MESSAGE_PREFIX or not transactional:
        return None
    body = json.loads(content)
    return RedriveRequest(
        str(body.get("table", "")),
        tuple(str(a) for a in body.get("aggregates", [])),
        frozenset(str(i) for i in body.get("ids", [])),
    )


def _insertable_columns(conn: psycopg.Connection[Any], outbox: OutboxTable) -> list[str]:
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0"
        " AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
        (outbox.ident.as_string(conn),),
    ).fetchall()
    return [str(r[0]) for r in rows]


def redrive_aggregates(
    conn: psycopg.Connection[Any], outbox: OutboxTable, aggregates: Sequence[str]
) -> int:
    """Redrive every FAILED row of ``aggregates`` of the table ``outbox`` (see the module
    contract); returns rows.

    ``conn`` must not be in a transaction; the work commits before this returns."""
    if not aggregates:
        return 0
    cols = outbox.columns
    table = outbox.ident
    agg = sql.Identifier(cols.aggregate_id)
    failed = sql.SQL("{} AND {} = ANY(%(aggs)s)").format(outbox.failed(), agg)
    params = {"aggs": list(aggregates)}
    with conn.transaction():
        locked = conn.execute(
            sql.SQL("SELECT {}::text FROM {} WHERE {} ORDER BY created_at, ctid FOR UPDATE").format(
                sql.Identifier(cols.id), table, failed
            ),
            params,
        ).fetchall()
        if not locked:
            return 0
        names = _insertable_columns(conn, outbox)
        idents = sql.SQL(", ").join(sql.Identifier(n) for n in names)
        conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE {tmp} ON COMMIT DROP AS SELECT row_number()"
                " OVER (ORDER BY created_at, ctid) AS cdc_outbox_ord, {cols} FROM {t} WHERE {w}"
            ).format(tmp=_TEMP, cols=idents, t=table, w=failed),
            params,
        )
        message = {
            "table": outbox.name,
            "aggregates": sorted(set(aggregates)),
            "ids": [r[0] for r in locked],
        }
        conn.execute(
            "SELECT pg_logical_emit_message(true, %s, %s)",
            (REDRIVE_MESSAGE_PREFIX, json.dumps(message)),
        )
        conn.execute(sql.SQL("DELETE FROM {} WHERE {}").format(table, failed), params)
        values = sql.SQL(", ").join(_RESET.get(n, sql.Identifier(n)) for n in names)
        cur = conn.execute(
            sql.SQL(
                "INSERT INTO {t} ({cols}) OVERRIDING SYSTEM VALUE"
                " SELECT {values} FROM {tmp} ORDER BY cdc_outbox_ord"
            ).format(t=table, cols=idents, values=values, tmp=_TEMP)
        )
        return max(cur.rowcount, 0)
