"""Operator actions on the outbox table: re-drive dead letters, delete old published rows.

Contract:
- :func:`redrive` releases the aggregates of the FAILED rows (dead letters, in any mode)
  matching a filter: every FAILED row of those aggregates is published again in its original
  order (:mod:`cdc_outbox.store.redrive`); ``last_error`` is kept for the record.
- :func:`cleanup` deletes PUBLISHED rows whose ``published_at`` is older than a cutoff fixed
  at the start, in batches of ``batch_size`` rows, each its own short transaction (locks and
  WAL stay bounded; it can run next to the relay). Other statuses are never deleted.
- Both need the polling columns (default column preset); dry runs change nothing.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from cdc_outbox.config import Settings
from cdc_outbox.errors import ConfigError
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.store.redrive import redrive_aggregates
from cdc_outbox.store.schema import outbox_ident

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


def parse_duration(text: str) -> timedelta:
    """``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``, ``"2w"`` or sums like ``"1d12h"``."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION_RE.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ConfigError(f"invalid duration {text!r} (use e.g. 90s, 15m, 12h, 7d, 2w or 1d12h)")
    return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


def parse_time(text: str, now: datetime) -> datetime:
    """An ISO 8601 time (naive = UTC) or a duration meaning "that long before ``now``"."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        try:
            return now - parse_duration(text)
        except ConfigError:
            raise ConfigError(
                f"invalid time {text!r} (use ISO 8601 like 2026-11-30T10:00:00Z, or 2h, 7d)"
            ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


@dataclass(frozen=True)
class RedriveFilter:
    """Which FAILED rows to re-drive; the given criteria are combined with AND.

    ``since``/``until`` bound ``created_at`` (``since`` inclusive, ``until`` exclusive);
    ``limit`` takes the oldest matches first. At least one criterion or ``everything``."""

    ids: tuple[str, ...] = ()
    event_type: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int | None = None
    everything: bool = False

    def __post_init__(self) -> None:
        if not (self.ids or self.event_type or self.since or self.until or self.everything):
            raise ConfigError("redrive needs --id, --event-type, --since/--until, or --all")
        if self.limit is not None and self.limit <= 0:
            raise ConfigError("redrive --limit must be > 0")


@dataclass(frozen=True)
class FailedRow:
    id: str
    aggregate_id: str
    event_type: str
    attempts: int
    created_at: datetime
    last_error: str | None


def _require_polling_columns(settings: Settings, what: str) -> None:
    if not OutboxTable.of(settings).has_status:
        raise ConfigError(
            f"config: {what} needs the status columns of the default column preset;"
            f" the {settings.columns.preset} preset has none"
        )


def _canonical_id(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return text


def _matching(settings: Settings, flt: RedriveFilter) -> tuple[sql.Composed, dict[str, Any]]:
    """SELECT of the ids of FAILED rows matching ``flt``, oldest first."""
    cols = settings.column_names()
    conds: list[sql.Composable] = [OutboxTable.of(settings).failed()]
    params: dict[str, Any] = {}
    if flt.ids:
        conds.append(sql.SQL("{}::text = ANY(%(ids)s::text[])").format(sql.Identifier(cols.id)))
        params["ids"] = [_canonical_id(i) for i in flt.ids]
    if flt.event_type is not None:
        conds.append(sql.SQL("{} = %(event_type)s").format(sql.Identifier(cols.event_type)))
        params["event_type"] = flt.event_type
    if flt.since is not None:
        conds.append(sql.SQL("created_at >= %(since)s"))
        params["since"] = flt.since
    if flt.until is not None:
        conds.append(sql.SQL("created_at < %(until)s"))
        params["until"] = flt.until
    query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY created_at").format(
        sql.Identifier(cols.id),
        outbox_ident(settings),
        sql.SQL(" AND ").join(conds),
    )
    if flt.limit is not None:
        query = sql.SQL("{} LIMIT %(limit)s").format(query)
        params["limit"] = flt.limit
    return query, params


def failed_rows(settings: Settings, flt: RedriveFilter, sample: int = 20) -> list[FailedRow]:
    """Up to ``sample`` of the FAILED rows ``flt`` matches, oldest first (for previews)."""
    _require_polling_columns(settings, "redrive")
    cols = settings.column_names()
    matching, params = _matching(settings, flt)
    query = sql.SQL(
        "SELECT {id}::text, {agg}, {et}, attempts, created_at, last_error FROM {t}"
        " WHERE {id} IN ({matching}) ORDER BY created_at LIMIT %(sample)s"
    ).format(
        id=sql.Identifier(cols.id),
        agg=sql.Identifier(cols.aggregate_id),
        et=sql.Identifier(cols.event_type),
        t=outbox_ident(settings),
        matching=matching,
    )
    with psycopg.connect(settings.postgres_dsn()) as conn:
        rows = conn.execute(query, {**params, "sample": sample}).fetchall()
    return [FailedRow(*r) for r in rows]


def redrive(settings: Settings, flt: RedriveFilter, *, dry_run: bool = False) -> int:
    """Redrive the aggregates of the FAILED rows ``flt`` matches: every FAILED row of each is
    published again, in order (:mod:`cdc_outbox.store.redrive`); returns rows (that would
    be) moved."""
    _require_polling_columns(settings, "redrive")
    matching, params = _matching(settings, flt)
    cols = settings.column_names()
    aggregates_of = sql.SQL("SELECT DISTINCT {agg} FROM {t} WHERE {id} IN ({matching})").format(
        agg=sql.Identifier(cols.aggregate_id),
        t=outbox_ident(settings),
        id=sql.Identifier(cols.id),
        matching=matching,
    )
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        aggregates = [str(r[0]) for r in conn.execute(aggregates_of, params).fetchall()]
        if dry_run:
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {} WHERE {} AND {} = ANY(%s)").format(
                    outbox_ident(settings),
                    OutboxTable.of(settings).failed(),
                    sql.Identifier(cols.aggregate_id),
                ),
                (aggregates,),
            ).fetchone()
            return int(row[0]) if row else 0
        return redrive_aggregates(conn, settings, aggregates)


def cleanup(
    settings: Settings,
    older_than: timedelta,
    *,
    batch_size: int = 1000,
    dry_run: bool = False,
) -> int:
    """Delete PUBLISHED rows published more than ``older_than`` ago; returns rows (that would
    be) deleted. Each batch of at most ``batch_size`` rows commits on its own."""
    _require_polling_columns(settings, "cleanup")
    if batch_size <= 0:
        raise ConfigError("cleanup --batch-size must be > 0")
    table = outbox_ident(settings)
    id_col = sql.Identifier(settings.columns.id)
    published = OutboxTable.of(settings).published()
    old = sql.SQL("{} AND published_at < %(cutoff)s").format(published)
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        row = conn.execute("SELECT now() - %s::interval", (older_than,)).fetchone()
        assert row is not None
        cutoff = row[0]
        if dry_run:
            counted = conn.execute(
                sql.SQL("SELECT count(*) FROM {} WHERE {}").format(table, old),
                {"cutoff": cutoff},
            ).fetchone()
            return int(counted[0]) if counted else 0
        delete = sql.SQL(
            "WITH b AS MATERIALIZED"
            " (SELECT {id} FROM {t} WHERE {old} LIMIT %(n)s FOR UPDATE SKIP LOCKED)"
            " DELETE FROM {t} AS o USING b WHERE o.{id} = b.{id}"
        ).format(t=table, id=id_col, old=old)
        total = 0
        while True:
            deleted = max(conn.execute(delete, {"cutoff": cutoff, "n": batch_size}).rowcount, 0)
            total += deleted
            if deleted < batch_size:
                return total
