"""``init``, ``status`` and ``drop`` commands (thin wrappers over cdc_outbox.admin.lifecycle)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table

from cdc_outbox.admin import lifecycle
from cdc_outbox.admin.checks import Check
from cdc_outbox.cli.common import print_json, settings_from, stdout
from cdc_outbox.errors import ConfigError
from cdc_outbox.store.inspection import OutboxFigures

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def _checks_table(checks: list[Check], title: str = "Preflight checks") -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("check", "ok", "detail", "fix"):
        table.add_column(col)
    for c in checks:
        verdict = "[red]FAIL[/]" if not c.ok else "[yellow]warn[/]" if c.warning else "[green]ok[/]"
        table.add_row(c.name, verdict, c.detail, c.fix)
    return table


def init(
    ctx: typer.Context,
    create_table: Annotated[
        bool, typer.Option("--create-table", help="Create the outbox table if it is missing.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the SQL that would run; change nothing.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Check the server, then create the missing publication and slot.

    Creates, when missing: the outbox table (only with --create-table), a publication of the
    outbox table's inserts, and a pgoutput logical replication slot. Idempotent: a second run
    says "nothing to do". Exit 3, with nothing changed, if a preflight check fails.
    """
    settings = settings_from(ctx)
    try:
        report = lifecycle.init(settings, create_table=create_table, dry_run=dry_run)
    except lifecycle.PreflightFailed as exc:
        if json_out:
            print_json({"checks": [_check_dict(c) for c in exc.checks], "ok": False})
        else:
            stdout.print(_checks_table(exc.checks))
        raise
    if json_out:
        print_json(report.to_dict())
        return
    stdout.print(_checks_table(report.checks))
    if report.nothing_to_do:
        stdout.print("nothing to do: table, publication and slot already exist")
        return
    verb = "would run" if dry_run else "ran"
    for action in report.actions:
        typer.echo(f"-- {action.name} ({verb})")
        typer.echo(action.sql + ";")
    if dry_run:
        stdout.print("dry run: nothing was changed")
    else:
        stdout.print(f"done: {', '.join(a.name for a in report.actions)}")


def _check_dict(c: Check) -> dict[str, object]:
    return {"name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix, "warning": c.warning}


def _size(n: int | None) -> str:
    if n is None:
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit} ({n} B)"
        value /= 1024
    return str(n)  # pragma: no cover


def status(
    ctx: typer.Context,
    json_out: JsonOpt = False,
    standby: Annotated[
        str | None,
        typer.Option(
            "--standby",
            metavar="DSN",
            help="Also check this standby for failover slots (PostgreSQL 17+): its settings"
            " and whether the slot is synchronized there.",
        ),
    ] = None,
) -> None:
    """Show the slot (position, lag, retained WAL), the publication, pending rows, dead
    letters, the relay's durable phase, its leader and the instances standing by.

    Read-only; works with the least-privilege relay role. Exit 0 whenever the database answered.
    """
    settings = settings_from(ctx)
    report = lifecycle.status(settings)
    on_standby = None if standby is None else lifecycle.standby_checks(settings, standby)
    if json_out:
        doc = report.to_dict()
        if on_standby is not None:
            doc["standby_checks"] = [asdict(c) for c in on_standby]
        print_json(doc)
        return
    table = Table(title="cdc-outbox status", title_justify="left", show_header=False)
    table.add_column("key")
    table.add_column("value")
    table.add_row("database", report.database)
    table.add_row("server", f"PostgreSQL {report.server_version}")
    slot = report.slot
    if slot is None:
        table.add_row("slot", f"{settings.slot_name}: missing (run `cdc-outbox init`)")
    else:
        active = f"active (PID {slot.active_pid})" if slot.active else "inactive"
        table.add_row("slot", f"{slot.name}: {active}, plugin {slot.plugin}")
        table.add_row("confirmed_flush_lsn", str(slot.confirmed_flush_lsn or "n/a"))
        table.add_row("restart_lsn", str(slot.restart_lsn or "n/a"))
        table.add_row("lag", _size(slot.lag_bytes))
        table.add_row("retained WAL", _size(slot.retained_wal_bytes))
        table.add_row("wal_status", slot.wal_status or "n/a")
        table.add_row("safe_wal_size", _size(slot.safe_wal_size))
    pub = report.publication
    if pub is None:
        table.add_row("publication", f"{settings.publication_name}: missing")
    else:
        tables = "ALL TABLES" if pub.all_tables else (", ".join(pub.tables) or "none")
        table.add_row("publication", f"{pub.name}: {tables} ({', '.join(pub.operations)})")
    for figures in report.outboxes or []:
        table.add_row(f"outbox {figures.outbox}", _outbox_line(figures))
    relay = report.relay
    if relay is None:
        table.add_row("relay", "no state table (run `cdc-outbox init`)")
    else:
        leader = relay["leader_id"] or "none"
        if relay["leader_id"] and relay["lease_expired"]:
            leader += " (lease expired)"
        table.add_row("relay phase", str(relay["phase"]))
        in_effect = relay["delivery_in_effect"]
        table.add_row("delivery", f"{relay['delivery']} configured, {in_effect} in effect")
        if in_effect != relay["delivery"]:
            table.add_row("", "polling is at-least-once whatever is configured")
        table.add_row("leader", leader)
        table.add_row(
            "instances",
            f"{relay['instances']} running, {relay['standby_instances']} standing by",
        )
    stdout.print(table)
    stdout.print(_checks_table(report.checks))
    if on_standby is not None:
        stdout.print(_checks_table(on_standby, "Standby checks (failover slots)"))


def _outbox_line(f: OutboxFigures) -> str:
    """One outbox table's figures for ``status``: unpublished rows, the oldest one's age,
    dead letters."""
    if not f.exists:
        return "missing (`cdc-outbox init --create-table` creates it)"
    line = f"{f.unpublished_rows} unpublished"
    if f.oldest_unpublished_age_seconds is not None:
        line += f" (oldest {f.oldest_unpublished_age_seconds:.0f} s)"
    if f.failed_rows is not None:
        line += f", {f.failed_rows} FAILED parking {f.parked_aggregates} aggregates" + (
            " (`cdc-outbox redrive`)" if f.failed_rows else ""
        )
    return line


def drop(
    ctx: typer.Context,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm; required.")] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Terminate a relay still using the slot.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Drop the replication slot and the publication; the outbox table is kept.

    Needs --yes. Exit 3 if a running relay is using the slot, unless --force terminates it.
    """
    settings = settings_from(ctx)
    if not yes:
        raise ConfigError(
            f"drop: pass --yes to drop slot '{settings.slot_name}' and publication "
            f"'{settings.publication_name}'"
        )
    report = lifecycle.drop(settings, force=force)
    if json_out:
        print_json(report.to_dict())
        return
    if report.terminated_pid is not None:
        stdout.print(f"terminated PID {report.terminated_pid} (was using the slot)")
    if report.nothing_to_do:
        stdout.print("nothing to do: slot and publication do not exist")
    else:
        stdout.print(f"dropped: {', '.join(report.dropped)} (outbox table kept)")


def register(app: typer.Typer) -> None:
    """Add init/status/drop to ``app``."""
    app.command()(init)
    app.command()(status)
    app.command()(drop)
