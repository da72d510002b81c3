"""``cdc-outbox sandbox up|down|status``: local PostgreSQL + Kafka that outlive the command.

Registered by the main CLI as ``app.add_typer(sandbox_app, name="sandbox")``.
Exit codes: 0 ok (``status``: both servers running), 1 failure (``status``: not running).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from cdc_outbox import sandbox

app = typer.Typer(
    help="Throw-away local PostgreSQL 15 + Kafka 4.1 (KRaft) for trying cdc-outbox out.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DirOption = Annotated[
    Path | None,
    typer.Option(
        "--dir",
        metavar="PATH",
        help="State directory (default: $CDC_OUTBOX_CACHE_DIR/sandbox or "
        "~/.cache/cdc-outbox/sandbox).",
    ),
]

T = TypeVar("T")


def _guard(action: Callable[[], T]) -> T:
    """Run ``action``; turn server start/stop failures into one error line and exit code 1."""
    try:
        return action()
    except (RuntimeError, TimeoutError, OSError) as exc:
        typer.echo(f"cdc-outbox: error: {exc}", err=True)
        raise typer.Exit(1) from exc


def _describe(info: sandbox.SandboxInfo) -> None:
    pg_state = f"running (pid {info.postgres_pid})" if info.postgres_pid else "stopped"
    kafka_state = f"running (pid {info.kafka_pid})" if info.kafka_pid else "stopped"
    typer.echo(f"state dir:  {info.state_dir}")
    typer.echo(f"postgresql: {pg_state}, port {info.postgres_port}, data {info.postgres_datadir}")
    typer.echo(f"kafka:      {kafka_state}, port {info.kafka_port}, data {info.kafka_dir}")
    typer.echo(f"dsn:        {info.dsn}")
    typer.echo(f"bootstrap:  {info.bootstrap_servers}")


@app.command()
def up(state_dir: DirOption = None) -> None:
    """Start PostgreSQL and Kafka in the background (idempotent) and print how to use them."""
    typer.echo(
        "starting PostgreSQL and Kafka (the first run fetches Kafka with Maven)...", err=True
    )
    info = _guard(lambda: sandbox.up(state_dir))
    _describe(info)
    typer.echo(info.export_line())


@app.command()
def down(
    state_dir: DirOption = None,
    purge: Annotated[bool, typer.Option("--purge", help="Also delete all data.")] = False,
) -> None:
    """Stop both servers (data kept unless --purge)."""
    _guard(lambda: sandbox.down(state_dir, purge=purge))
    typer.echo("sandbox stopped" + (" and purged" if purge else ""))


@app.command()
def status(
    state_dir: DirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show whether the servers run, their ports, pids and directories."""
    info = _guard(lambda: sandbox.status(state_dir))
    if info is None:
        typer.echo(json.dumps({"running": False}) if as_json else "sandbox: not created")
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps({"running": info.running, **info.to_json()}, indent=2))
    else:
        _describe(info)
    if not info.running:
        raise typer.Exit(1)
