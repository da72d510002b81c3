"""``redrive`` and ``cleanup``: operator commands for the outbox rows of the polling relay."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from cdc_outbox.admin import outbox_ops as outbox_admin
from cdc_outbox.cli.common import print_json, selected_table, settings_from, stdout

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Only count; change nothing.")]


def register(app: typer.Typer) -> None:
    app.command("redrive")(redrive)
    app.command("cleanup")(cleanup)


def redrive(
    ctx: typer.Context,
    ids: Annotated[
        list[str] | None, typer.Option("--id", metavar="UUID", help="Event id (repeatable).")
    ] = None,
    event_type: Annotated[
        str | None, typer.Option("--event-type", help="Only events of this type.")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="TIME",
            help="created_at >= this (ISO 8601, or e.g. 2h = 2 hours ago).",
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", metavar="TIME", help="created_at < this (ISO 8601 or e.g. 30m)."),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", help="At most this many rows, oldest first.")
    ] = None,
    everything: Annotated[
        bool, typer.Option("--all", help="Every FAILED row (when no other filter is given).")
    ] = False,
    dry_run: DryRunOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Publish dead-lettered (FAILED) events again, in order, whichever mode dead-lettered them.

    Filters (combined with AND) pick FAILED rows; their whole aggregates are redriven: every
    FAILED row of each is deleted and inserted again as PENDING, oldest first, so every mode
    (CDC included) publishes them in their original order, ahead of the aggregate's later
    events. Prints how many rows moved (with --dry-run: how many would, and a sample).
    Every outbox table with status columns, one after the other, unless --table schema.table
    names one. Run it as the outbox table's owner (it needs INSERT and DELETE).
    """
    settings = settings_from(ctx)
    table = selected_table(ctx)
    now = datetime.now(UTC)
    flt = outbox_admin.RedriveFilter(
        ids=tuple(ids or ()),
        event_type=event_type,
        since=outbox_admin.parse_time(since, now) if since else None,
        until=outbox_admin.parse_time(until, now) if until else None,
        limit=limit,
        everything=everything,
    )
    sample = outbox_admin.failed_rows(settings, flt, table=table) if dry_run else []
    by_table = outbox_admin.redrive_by_table(settings, flt, dry_run=dry_run, table=table)
    count = sum(by_table.values())
    if json_out:
        print_json(
            {
                "dry_run": dry_run,
                "count": count,
                "tables": by_table,
                "sample": [
                    {
                        "table": r.table,
                        "id": r.id,
                        "aggregate_id": r.aggregate_id,
                        "event_type": r.event_type,
                        "attempts": r.attempts,
                        "created_at": r.created_at.isoformat(),
                        "last_error": r.last_error,
                    }
                    for r in sample
                ],
            }
        )
        return
    if sample:
        rows = Table(title="FAILED rows (oldest first)", title_justify="left")
        for col in ("table", "id", "aggregate", "event type", "attempts", "created at", "error"):
            rows.add_column(col)
        for r in sample:
            rows.add_row(
                r.table,
                r.id,
                r.aggregate_id,
                r.event_type,
                str(r.attempts),
                r.created_at.isoformat(timespec="seconds"),
                (r.last_error or "")[:120],
            )
        stdout.print(rows)
    per_table = _per_table(by_table)
    if dry_run:
        stdout.print(f"dry run: {count} FAILED rows would be redriven{per_table}")
    else:
        stdout.print(
            f"redrove {count} FAILED rows (now PENDING, in their original order){per_table}"
        )


def _per_table(counts: dict[str, int]) -> str:
    """`` (a.b: 1, c.d: 2)`` when there are several tables, else nothing."""
    if len(counts) < 2:
        return ""
    return " (" + ", ".join(f"{name}: {n}" for name, n in counts.items()) + ")"


def cleanup(
    ctx: typer.Context,
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than", help="Delete rows published longer ago than this (e.g. 7d, 12h)."
        ),
    ],
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Rows deleted per transaction.")
    ] = 1000,
    dry_run: DryRunOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Delete PUBLISHED outbox rows older than --older-than, in bounded batches.

    Each batch is its own short transaction, so it is safe to run next to the relay (e.g. from
    cron). Rows in any other status are never deleted. Every outbox table with status columns,
    one after the other, unless --table names one.
    """
    settings = settings_from(ctx)
    table = selected_table(ctx)
    age = outbox_admin.parse_duration(older_than)
    by_table = outbox_admin.cleanup_by_table(
        settings, age, batch_size=batch_size, dry_run=dry_run, table=table
    )
    count = sum(by_table.values())
    if json_out:
        print_json(
            {
                "dry_run": dry_run,
                "count": count,
                "tables": by_table,
                "older_than_s": age.total_seconds(),
            }
        )
    elif dry_run:
        stdout.print(f"dry run: {count} published rows would be deleted{_per_table(by_table)}")
    else:
        stdout.print(f"deleted {count} published rows{_per_table(by_table)}")
