"""SQL of the polling relay (composed with ``psycopg.sql``; names only via ``sql.Identifier``).

Claim protocol (two statements in one READ COMMITTED transaction, see :mod:`polling_relay`):

1. :attr:`PollingSql.lock_aggregates` picks the aggregates of the oldest due PENDING rows
   (``available_at`` index), skipping rows whose aggregate's first unpublished row is
   PROCESSING or not yet due (an aggregate's queue behind a backing-off row never fills the
   scan window), and takes a transaction-scoped advisory lock per aggregate with
   ``pg_try_advisory_xact_lock``; aggregates another worker is claiming right now are skipped.
2. :attr:`PollingSql.claim` runs with a snapshot taken *after* those locks were granted, so it
   sees every claim another worker committed for those aggregates. An aggregate with a
   PROCESSING row gets nothing; otherwise its rows before its first row that cannot go now
   (PENDING but not yet due) are candidates, in ``created_at`` then physical-position order,
   and the ``limit`` earliest candidates overall are locked ``FOR UPDATE SKIP LOCKED`` and set
   PROCESSING. Each returned row carries its rank in its aggregate, so the caller can give
   back rows behind one SKIP LOCKED skipped (:func:`gap_free`).

Cost: both statements find an aggregate's unpublished rows through the ``(aggregate_id,
created_at)`` index of ``sql/outbox.sql``. Without it each claim is one sequential scan of the
table, and ``lock_aggregates`` one per aggregate in its window: create that index, and keep
the table small with ``cdc-outbox cleanup``.
FAILED rows are dead letters: they do not block their aggregate.

Partitioned outbox tables work too: claimed rows are identified by ``(tableoid, ctid)``, since
a ctid is only unique within one partition. Locking stays a TID scan (per partition); for a
plain table the plan is the same as with ``ctid`` alone.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from psycopg import sql

from cdc_outbox.config.settings import OutboxSettings, Settings
from cdc_outbox.store.mark_published import mark_published_statement
from cdc_outbox.store.schema import outbox_ident

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


def build(settings: Settings, outbox: OutboxSettings | None = None) -> PollingSql:
    """The statements for the outbox table ``outbox`` (None: the first configured; default
    column preset; polling columns by fixed name)."""
    cols = settings.column_names(outbox)
    t = outbox_ident(settings, outbox)
    oid = sql.Identifier("o", cols.id)
    agg = sql.Identifier(cols.aggregate_id)
    headers = (
        sql.SQL("o.{}::text").format(sql.Identifier(cols.headers))
        if cols.headers is not None
        else sql.SQL("NULL::text")
    )
    fields: dict[str, Any] = {"t": t, "id": sql.Identifier(cols.id), "oid": oid, "agg": agg}
    # The scan skips rows whose aggregate's first unpublished row cannot go now (in flight or
    # backing off), so such an aggregate's queue cannot fill the window and starve the others.
    # That first row is one probe of the (aggregate, created_at) index, written as a LATERAL
    # join so the planner can memoize it per aggregate (measured: 3,000 rows queued behind a
    # backing-off row add about 1 ms; a scan with nothing to skip costs about as before).
    lock_aggregates = sql.SQL(
        "SELECT w.agg FROM ("
        " SELECT c.agg, min(c.available_at) AS due FROM ("
        "  SELECT p.{agg} AS agg, p.available_at FROM {t} AS p"
        "  CROSS JOIN LATERAL ("
        "   SELECT f.status, f.available_at FROM {t} AS f"
        "   WHERE f.{agg} = p.{agg} AND f.status IN ('PENDING', 'PROCESSING')"
        "   ORDER BY f.created_at LIMIT 1) AS first"
        "  WHERE p.status = 'PENDING' AND p.available_at <= now()"
        "  AND first.status = 'PENDING' AND first.available_at <= now()"
        "  ORDER BY p.available_at LIMIT %(scan)s) AS c"
        " GROUP BY c.agg ORDER BY due LIMIT %(max_aggs)s) AS w "
        "WHERE pg_try_advisory_xact_lock(%(ns)s::int4, hashtext(w.agg))"
    ).format(**fields)
    # A row is identified by (tableoid, ctid): ctid alone repeats across the partitions of a
    # partitioned table. The order stays (created_at, ctid); rows of two partitions tying on
    # both never count as before a barrier, so no row overtakes an earlier blocked one.
    claim = sql.SQL(
        "WITH unpublished AS MATERIALIZED ("
        " SELECT {agg} AS agg, created_at, tableoid AS rel, ctid AS pos,"
        "  status = 'PROCESSING' AS busy, status = 'PENDING' AND available_at <= now() AS open"
        " FROM {t} WHERE {agg} = ANY(%(aggs)s) AND status IN ('PENDING', 'PROCESSING')"
        "), busy AS (SELECT DISTINCT agg FROM unpublished WHERE busy"
        "), barrier AS ("  # per aggregate: its first row that cannot go now
        " SELECT DISTINCT ON (agg) agg, created_at, pos FROM unpublished WHERE NOT open"
        " ORDER BY agg, created_at, pos"
        "), head AS ("
        " SELECT u.agg, u.created_at, u.rel, u.pos FROM unpublished AS u"
        " LEFT JOIN barrier AS b ON b.agg = u.agg"
        " WHERE u.open"
        " AND (b.agg IS NULL OR (u.created_at, u.pos) < (b.created_at, b.pos))"
        " AND NOT EXISTS (SELECT 1 FROM busy WHERE busy.agg = u.agg)"
        " ORDER BY u.created_at, u.pos LIMIT %(limit)s"
        "), chosen AS MATERIALIZED ("
        " SELECT rel, pos, row_number() OVER (PARTITION BY agg ORDER BY created_at, pos)"
        "  AS rank FROM head"
        "), locked AS MATERIALIZED ("  # ctid = ANY(array): TID scans, no table scan
        " SELECT c.rank, x.tableoid AS rel, x.ctid AS pos FROM {t} AS x"
        " JOIN chosen AS c ON c.rel = x.tableoid AND c.pos = x.ctid"
        " WHERE x.ctid = ANY(ARRAY(SELECT pos FROM chosen)) AND x.status = 'PENDING'"
        " FOR UPDATE OF x SKIP LOCKED"
        ") "
        "UPDATE {t} AS o SET status = 'PROCESSING', locked_by = %(me)s, locked_at = now() "
        "FROM locked AS l WHERE o.ctid = l.pos AND o.tableoid = l.rel "
        "RETURNING l.rank, {oid}, {oid}::text, o.{at}, o.{agg}, o.{et}, o.{payload}::text,"
        " {headers}, {tracing}, o.attempts, extract(epoch FROM o.created_at)::float8{extra}"
    ).format(
        extra=sql.SQL("").join(
            sql.SQL(", o.{}::text").format(sql.Identifier(c)) for c in cols.header_sources()
        ),
        tracing=sql.SQL("o.{}::text").format(sql.Identifier(cols.tracing_span_context))
        if cols.tracing_span_context is not None
        else sql.SQL("NULL::text"),
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
    mark_published = mark_published_statement(
        fields["t"], sql.SQL("{id} = ANY(%(ids)s)").format(**fields), state=mine
    )
    # One row per outcome: bump = attempts to add, delay = seconds until due again (NULL: keep),
    # final = give up now (FAILED) whatever the count.
    mark_outcomes = sql.SQL(
        "UPDATE {t} AS o SET attempts = o.attempts + f.bump,"
        " status = {after_failure},"
        " available_at = CASE WHEN f.delay IS NULL THEN o.available_at"
        "  ELSE now() + f.delay * interval '1 second' END,"
        " last_error = coalesce(f.error, o.last_error), locked_by = NULL "
        "FROM unnest(%(ids)s, %(bumps)s::int[], %(delays)s::float8[], %(errors)s::text[],"
        " %(finals)s::bool[]) AS f(id, bump, delay, error, final) "
        "WHERE {oid} = f.id AND o.status = 'PROCESSING' AND o.locked_by = %(me)s "
        "RETURNING {oid}, o.status"
    ).format(
        after_failure=_after_failure(
            sql.SQL("f.final OR (f.bump > 0 AND o.attempts + f.bump >= %(max)s)")
        ),
        **fields,
    )
    sweep = sql.SQL(
        "UPDATE {t} SET attempts = attempts + 1,"
        " status = {after_expiry},"
        " last_error = 'lease of ' || coalesce(locked_by, '?') || ' expired (worker gone?)',"
        " locked_by = NULL "
        "WHERE status = 'PROCESSING' AND locked_at < now() - %(lease)s * interval '1 second'"
        " AND locked_by IS DISTINCT FROM %(me)s "
        "RETURNING status"
    ).format(after_expiry=_after_failure(sql.SQL("attempts + 1 >= %(max)s")), **fields)
    return PollingSql(lock_aggregates, claim, unclaim, renew, mark_published, mark_outcomes, sweep)


def _after_failure(gives_up: sql.Composable) -> sql.Composed:
    """The one FAILED rule: a failed or expired claim becomes FAILED (a dead letter) when
    ``gives_up`` (``max_attempts`` reached, or a permanent error), else PENDING again."""
    return sql.SQL("CASE WHEN {} THEN 'FAILED' ELSE 'PENDING' END").format(gives_up)


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
