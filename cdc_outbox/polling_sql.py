"""SQL of the polling relay (composed with ``psycopg.sql``; names only via ``sql.Identifier``).

Claim protocol (two statements in one READ COMMITTED transaction, see :mod:`polling_relay`):

1. :attr:`PollingSql.lock_aggregates` picks the aggregates of the oldest due PENDING rows
   and takes a transaction-scoped advisory lock per aggregate with
   ``pg_try_advisory_xact_lock`` (aggregates another worker is claiming right now are skipped).
2. :attr:`PollingSql.claim` then runs with a snapshot taken *after* those locks were granted,
   so it sees every claim committed by another worker for those aggregates. Per aggregate it
   claims the longest prefix (by ``created_at``, then physical position) of unpublished rows
   that are all PENDING and due, and nothing if any row of the aggregate is PROCESSING.
   Rows are locked with ``FOR UPDATE SKIP LOCKED``; each returned row carries its rank in the
   aggregate so the caller can drop rows behind a skipped one (:func:`gap_free`).

FAILED rows are dead letters: they do not block their aggregate.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from psycopg import sql

from cdc_outbox.config import Settings

#: Upper bound of advisory locks one claim holds (they live in PostgreSQL's shared lock table,
#: sized max_locks_per_transaction x max_connections, 6,400 by default).
MAX_AGGREGATES_PER_CLAIM = 256


def advisory_namespace(schema: str, table: str) -> int:
    """First key (int4) of the per-aggregate advisory locks: stable per outbox table."""
    value = zlib.crc32(f"cdc_outbox:{schema}.{table}".encode())
    return value - (1 << 32) if value >= 1 << 31 else value


@dataclass(frozen=True)
class PollingSql:
    """Every statement of the polling relay for one outbox table."""

    lock_aggregates: sql.Composed
    claim: sql.Composed
    unclaim: sql.Composed
    renew: sql.Composed
    mark_published: sql.Composed
    mark_outcomes: sql.Composed
    sweep: sql.Composed


def build(settings: Settings) -> PollingSql:
    """The statements for ``settings`` (default column preset; polling columns by fixed name)."""
    cols = settings.column_names()
    t = sql.Identifier(settings.outbox_schema, settings.outbox_table)
    oid = sql.Identifier("o", cols.id)
    agg = sql.Identifier(cols.aggregate_id)
    headers = (
        sql.SQL("o.{}::text").format(sql.Identifier(cols.headers))
        if cols.headers is not None
        else sql.SQL("NULL::text")
    )
    fields: dict[str, Any] = {"t": t, "id": sql.Identifier(cols.id), "oid": oid, "agg": agg}
    lock_aggregates = sql.SQL(
        "SELECT w.agg FROM ("
        " SELECT c.{agg} AS agg, min(c.available_at) AS due FROM ("
        "  SELECT {agg}, available_at FROM {t}"
        "  WHERE status = 'PENDING' AND available_at <= now()"
        "  ORDER BY available_at LIMIT %(scan)s) AS c"
        " GROUP BY c.{agg} ORDER BY due LIMIT %(max_aggs)s) AS w "
        "WHERE pg_try_advisory_xact_lock(%(ns)s::int4, hashtext(w.agg))"
    ).format(**fields)
    claim = sql.SQL(
        "WITH unpublished AS ("
        " SELECT {id} AS id, {agg} AS agg, created_at, ctid AS pos, status,"
        "  available_at <= now() AS due"
        " FROM {t} WHERE {agg} = ANY(%(aggs)s) AND status IN ('PENDING', 'PROCESSING')"
        "), ranked AS ("
        " SELECT id, created_at, pos, row_number() OVER w AS rank,"
        "  bool_and(status = 'PENDING' AND due) OVER w AS open,"
        "  bool_or(status = 'PROCESSING') OVER (PARTITION BY agg) AS busy"
        " FROM unpublished"
        " WINDOW w AS (PARTITION BY agg ORDER BY created_at, pos ROWS UNBOUNDED PRECEDING)"
        "), chosen AS MATERIALIZED ("
        " SELECT {oid} AS id, r.rank FROM {t} AS o JOIN ranked AS r ON {oid} = r.id"
        " WHERE r.open AND NOT r.busy AND o.status = 'PENDING'"
        " ORDER BY r.created_at, r.pos LIMIT %(limit)s"
        " FOR UPDATE OF o SKIP LOCKED"
        ") "
        "UPDATE {t} AS o SET status = 'PROCESSING', locked_by = %(me)s, locked_at = now() "
        "FROM chosen AS c WHERE {oid} = c.id "
        "RETURNING c.rank, {oid}, {oid}::text, o.{at}, o.{agg}, o.{et}, o.{payload}::text,"
        " {headers}, o.attempts, extract(epoch FROM o.created_at)::float8"
    ).format(
        at=sql.Identifier(cols.aggregate_type),
        et=sql.Identifier(cols.event_type),
        payload=sql.Identifier(cols.payload),
        headers=headers,
        **fields,
    )
    mine = sql.SQL("status = 'PROCESSING' AND locked_by = %(me)s")
    unclaim = sql.SQL(
        "UPDATE {t} SET status = 'PENDING', locked_by = NULL WHERE {id} = ANY(%(ids)s) AND {mine}"
    ).format(mine=mine, **fields)
    renew = sql.SQL("UPDATE {t} SET locked_at = now() WHERE {id} = ANY(%(ids)s) AND {mine}").format(
        mine=mine, **fields
    )
    mark_published = sql.SQL(
        "UPDATE {t} SET status = 'PUBLISHED', published_at = now(), locked_by = NULL"
        " WHERE {id} = ANY(%(ids)s) AND {mine}"
    ).format(mine=mine, **fields)
    # One row per outcome: bump = attempts to add, delay = seconds until due again (NULL: keep),
    # final = give up now (FAILED) whatever the count.
    mark_outcomes = sql.SQL(
        "UPDATE {t} AS o SET attempts = o.attempts + f.bump,"
        " status = CASE WHEN f.final OR (f.bump > 0 AND o.attempts + f.bump >= %(max)s)"
        "  THEN 'FAILED' ELSE 'PENDING' END,"
        " available_at = CASE WHEN f.delay IS NULL THEN o.available_at"
        "  ELSE now() + f.delay * interval '1 second' END,"
        " last_error = coalesce(f.error, o.last_error), locked_by = NULL "
        "FROM unnest(%(ids)s, %(bumps)s::int[], %(delays)s::float8[], %(errors)s::text[],"
        " %(finals)s::bool[]) AS f(id, bump, delay, error, final) "
        "WHERE {oid} = f.id AND o.status = 'PROCESSING' AND o.locked_by = %(me)s "
        "RETURNING {oid}, o.status"
    ).format(**fields)
    sweep = sql.SQL(
        "UPDATE {t} SET attempts = attempts + 1,"
        " status = CASE WHEN attempts + 1 >= %(max)s THEN 'FAILED' ELSE 'PENDING' END,"
        " last_error = 'lease of ' || coalesce(locked_by, '?') || ' expired (worker gone?)',"
        " locked_by = NULL "
        "WHERE status = 'PROCESSING' AND locked_at < now() - %(lease)s * interval '1 second' "
        "RETURNING status"
    ).format(**fields)
    return PollingSql(lock_aggregates, claim, unclaim, renew, mark_published, mark_outcomes, sweep)


class Ranked(Protocol):
    """What :func:`gap_free` needs of a claimed row."""

    @property
    def aggregate_id(self) -> str: ...

    @property
    def rank(self) -> int: ...


R = TypeVar("R", bound=Ranked)


def gap_free(rows: Iterable[R]) -> tuple[list[R], list[R]]:
    """Split claimed rows into (keep, give back): per aggregate, ranks must run 1, 2, 3, ...

    A missing rank is a row ``SKIP LOCKED`` skipped (locked outside the relay); rows of that
    aggregate after it must not overtake it, so they are given back. Keeps input order.
    """
    rows = list(rows)
    ranks: dict[str, set[int]] = {}
    for row in rows:
        ranks.setdefault(row.aggregate_id, set()).add(row.rank)
    limit: dict[str, int] = {}
    for agg, present in ranks.items():
        n = 0
        while n + 1 in present:
            n += 1
        limit[agg] = n
    keep = [r for r in rows if r.rank <= limit[r.aggregate_id]]
    back = [r for r in rows if r.rank > limit[r.aggregate_id]]
    return keep, back
