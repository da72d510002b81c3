"""Dev-checkout commands: ``sandbox up|down|status`` (local PostgreSQL, Kafka and schema
registry that outlive the command) and ``demo``.

Run as ``python -m cdc_outbox_dev ...``; in a checkout where ``cdc_outbox_dev`` is importable
``cdc-outbox`` registers the same commands (:func:`register`). They are not in the wheel.
Exit codes: 0 ok (``sandbox status``: all servers running; ``demo``: clean tally),
1 failure (``sandbox status``: not running).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

if TYPE_CHECKING:
    from cdc_outbox_dev.sandbox import SandboxInfo

sandbox_app = typer.Typer(
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


def _describe(info: SandboxInfo) -> None:
    pg_state = f"running (pid {info.postgres_pid})" if info.postgres_pid else "stopped"
    kafka_state = f"running (pid {info.kafka_pid})" if info.kafka_pid else "stopped"
    if info.kafka_brokers > 1:
        kafka_state = f"{info.kafka_brokers} brokers, " + (
            "all running" if info.kafka_pid else "not all running"
        )
    typer.echo(f"state dir:  {info.state_dir}")
    typer.echo(f"postgresql: {pg_state}, port {info.postgres_port}, data {info.postgres_datadir}")
    typer.echo(f"kafka:      {kafka_state}, port {info.kafka_port}, data {info.kafka_dir}")
    registry_state = f"running (pid {info.registry_pid})" if info.registry_pid else "stopped"
    typer.echo(f"registry:   {registry_state}, {info.registry_url}")
    typer.echo(f"dsn:        {info.dsn}")
    typer.echo(f"bootstrap:  {info.bootstrap_servers}")


@sandbox_app.command()
def up(
    state_dir: DirOption = None,
    brokers: Annotated[
        int | None,
        typer.Option(
            "--brokers",
            metavar="N",
            help="Kafka nodes: 1 (default) or 3+, a KRaft cluster with replication factor 3"
            " and min.insync.replicas=2. A sandbox keeps the count it was created with.",
        ),
    ] = None,
) -> None:
    """Start PostgreSQL, Kafka and a schema registry in the background (idempotent) and print
    how to use them."""
    from cdc_outbox_dev import sandbox

    if brokers is not None and (brokers == 2 or brokers < 1):
        raise typer.BadParameter("must be 1, or 3 or more", param_hint="--brokers")
    typer.echo(
        "starting PostgreSQL, Kafka and the schema registry (the first run fetches Kafka and"
        " Apicurio with Maven)...",
        err=True,
    )
    info = _guard(lambda: sandbox.up(state_dir, brokers))
    _describe(info)
    typer.echo(info.export_line())


@sandbox_app.command()
def down(
    state_dir: DirOption = None,
    purge: Annotated[bool, typer.Option("--purge", help="Also delete all data.")] = False,
) -> None:
    """Stop the servers (data kept unless --purge)."""
    from cdc_outbox_dev import sandbox

    _guard(lambda: sandbox.down(state_dir, purge=purge))
    typer.echo("sandbox stopped" + (" and purged" if purge else ""))


@sandbox_app.command()
def status(
    state_dir: DirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show whether the servers run, their ports, pids and directories."""
    from cdc_outbox_dev import sandbox

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


def demo(
    events: Annotated[int, typer.Option("--events", min=1, help="Orders to write.")] = 20_000,
    writers: Annotated[int, typer.Option("--writers", min=1, help="Concurrent writers.")] = 4,
    aggregates: Annotated[int, typer.Option("--aggregates", min=1, help="Distinct orders.")] = 200,
    value_format: Annotated[
        str,
        typer.Option(
            "--value-format",
            help="json or avro (Avro values via a local schema registry, decoded for the tally).",
        ),
    ] = "json",
) -> None:
    """End-to-end demo on throw-away local PostgreSQL + Kafka: write orders, relay, verify.

    Exits 0 when every committed event arrived at least once, exactly as stored, in
    per-aggregate commit order; 1 otherwise.
    """
    from cdc_outbox_dev.demo import run_demo

    if value_format not in ("json", "avro"):
        raise typer.BadParameter("must be json or avro", param_hint="--value-format")
    ok = run_demo(events=events, writers=writers, aggregates=aggregates, value_format=value_format)
    raise typer.Exit(0 if ok else 1)


def register(app: typer.Typer) -> None:
    """Add ``demo`` and ``sandbox up|down|status`` to ``app``."""
    app.command("demo")(demo)
    app.add_typer(sandbox_app, name="sandbox")


app = typer.Typer(
    name="cdc-outbox-dev",
    help="cdc-outbox development harness (not in the wheel): local services and the demo.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
register(app)


def main() -> None:
    """``python -m cdc_outbox_dev``; maps errors to exit codes like ``cdc-outbox``."""
    # Not at module level: cdc_outbox.cli imports this module to register its commands.
    from cdc_outbox.cli.common import run_app

    run_app(app, "python -m cdc_outbox_dev")
