"""Operator actions on the outbox table: re-drive dead letters, delete old published rows.

Contract:
- :func:`redrive` releases the aggregates of the FAILED rows (dead letters, in any mode)
  matching a filter: every FAILED row of those aggregates is published again in its original
  order (:mod:`cdc_outbox.store.redrive`); ``last_error`` is kept for the record.
- :func:`cleanup` deletes PUBLISHED rows whose ``published_at`` is older than a cutoff fixed
  at the start, in batches of ``batch_size`` rows, each its own short transaction (locks and
  WAL stay bounded; it can run next to the relay). Other statuses are never deleted.
- Both work on one outbox table (``table``: ``schema.table``) or, by default, on every
  configured table with status columns, one after the other; a table without them cannot be
  named (``ConfigError``). Counts are per table (``*_by_table``) or summed. Dry runs change
  nothing.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import ConfigError
from cdc_outbox.store import outbox_rows
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.store.redrive import redrive_aggregates

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
    #: ``schema.table`` of the outbox table the row is in.
    table: str = ""


def tables_for(settings: Settings, what: str, table: str | None = None) -> list[OutboxTable]:
    """The outbox tables ``what`` (redrive, cleanup) works on: ``table`` (``schema.table``),
    or every configured table with status columns; ``ConfigError`` if there is none."""
    if table is not None:
        chosen = [OutboxTable.of(settings, settings.outbox(table))]
    else:
        chosen = [t for t in OutboxTable.all_of(settings) if t.has_status]
    if not chosen or not chosen[0].has_status:
        refused = [o for o in settings.outbox_settings() if table in (None, o.name)]
        presets = "/".join(sorted({o.columns.preset for o in refused}))
        raise ConfigError(
            f"config: {what} needs the status columns of the default column preset;"
            f" the {presets} preset has none ({', '.join(o.name for o in refused)})"
        )
    return chosen


def _canonical_id(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return text


def _matching(outbox: OutboxTable, flt: RedriveFilter) -> tuple[sql.Composed, dict[str, Any]]:
    """SELECT of the ids of FAILED rows of ``outbox`` matching ``flt``, oldest first."""
    return outbox_rows.failed_ids(
        outbox,
        ids=[_canonical_id(i) for i in flt.ids],
        event_type=flt.event_type,
        since=flt.since,
        until=flt.until,
        limit=flt.limit,
    )


def failed_rows(
    settings: Settings, flt: RedriveFilter, sample: int = 20, *, table: str | None = None
) -> list[FailedRow]:
    """Up to ``sample`` of the FAILED rows ``flt`` matches per table, oldest first (for
    previews)."""
    found: list[FailedRow] = []
    with psycopg.connect(settings.postgres_dsn()) as conn:
        for outbox in tables_for(settings, "redrive", table):
            matching, params = _matching(outbox, flt)
            query = outbox_rows.failed_listing(outbox, matching)
            rows = conn.execute(query, {**params, "sample": sample}).fetchall()
            found += [FailedRow(r[0], r[1], r[2], r[3], r[4], r[5], outbox.name) for r in rows]
    return found


def redrive(
    settings: Settings, flt: RedriveFilter, *, dry_run: bool = False, table: str | None = None
) -> int:
    """:func:`redrive_by_table`, summed."""
    return sum(redrive_by_table(settings, flt, dry_run=dry_run, table=table).values())


def redrive_by_table(
    settings: Settings, flt: RedriveFilter, *, dry_run: bool = False, table: str | None = None
) -> dict[str, int]:
    """Redrive the aggregates of the FAILED rows ``flt`` matches, per table: every FAILED row
    of each is published again, in order (:mod:`cdc_outbox.store.redrive`); returns rows
    (that would be) moved per ``schema.table`` (``flt.limit`` applies per table)."""
    counts: dict[str, int] = {}
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        for outbox in tables_for(settings, "redrive", table):
            counts[outbox.name] = _redrive_table(conn, outbox, flt, dry_run)
    return counts


def _redrive_table(
    conn: psycopg.Connection[Any], outbox: OutboxTable, flt: RedriveFilter, dry_run: bool
) -> int:
    matching, params = _matching(outbox, flt)
    aggregates_of = outbox_rows.aggregates_of(outbox, matching)
    aggregates = [str(r[0]) for r in conn.execute(aggregates_of, params).fetchall()]
    if dry_run:
        row = conn.execute(outbox_rows.count_failed_of_aggregates(outbox), (aggregates,)).fetchone()
        return int(row[0]) if row else 0
    return redrive_aggregates(conn, outbox, aggregates)


def cleanup(
    settings: Settings,
    older_than: timedelta,
    *,
    batch_size: int = 1000,
    dry_run: bool = False,
    table: str | None = None,
) -> int:
    """:func:`cleanup_by_table`, summed."""
    return sum(
        cleanup_by_table(
            settings, older_than, batch_size=batch_size, dry_run=dry_run, table=table
        ).values()
    )


def cleanup_by_table(
    settings: Settings,
    older_than: timedelta,
    *,
    batch_size: int = 1000,
    dry_run: bool = False,
    table: str | None = None,
) -> dict[str, int]:
    """Delete PUBLISHED rows published more than ``older_than`` ago; returns rows (that would
    be) deleted per ``schema.table``. Each batch of at most ``batch_size`` rows commits on
    its own; the cutoff is fixed once, at the start."""
    outboxes = tables_for(settings, "cleanup", table)
    if batch_size <= 0:
        raise ConfigError("cleanup --batch-size must be > 0")
    counts: dict[str, int] = {}
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        row = conn.execute("SELECT now() - %s::interval", (older_than,)).fetchone()
        assert row is not None
        cutoff = row[0]
        for outbox in outboxes:
            counts[outbox.name] = _cleanup_table(conn, outbox, cutoff, batch_size, dry_run)
    return counts


def _cleanup_table(
    conn: psycopg.Connection[Any],
    outbox: OutboxTable,
    cutoff: datetime,
    batch_size: int,
    dry_run: bool,
) -> int:
    if dry_run:
        counted = conn.execute(
            outbox_rows.count_published_before(outbox), {"cutoff": cutoff}
        ).fetchone()
        return int(counted[0]) if counted else 0
    delete = outbox_rows.delete_published_before(outbox)
    total = 0
    while True:
        deleted = max(conn.execute(delete, {"cutoff": cutoff, "n": batch_size}).rowcount, 0)
        total += deleted
        if deleted < batch_size:
            return total
