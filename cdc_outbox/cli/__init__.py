"""The ``cdc-outbox`` command line (the only package importing typer).

Exit codes: 0 ok; 1 runtime error (database unreachable, login refused, SQL error);
2 usage or configuration error; 3 preflight failed (server not ready, slot in use); ``run``'s
errors that cannot heal: 4 schema, 5 privileges, 6 authentication, 7 missing topic
(:mod:`cdc_outbox.errors`).
Errors are printed by :func:`main` as one ``cdc-outbox: error: ...`` line on stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cdc_outbox import __version__
from cdc_outbox.cli import (
    config_cmd,
    consume_cmd,
    debezium_cmd,
    lag_cmd,
    lifecycle_cmd,
    outbox_ops_cmd,
    relay_cmd,
    schemas_cmd,
    sql_cmd,
)
from cdc_outbox.cli.common import GlobalOptions, GlobalOptionsGroup, run_app, set_global
from cdc_outbox.cli.help_text import unwrap_help

app = typer.Typer(
    name="cdc-outbox",
    help="Transactional outbox relay: PostgreSQL logical replication (pgoutput) to Kafka.\n\n"
    "Settings come from flags > CDC_OUTBOX_* environment > TOML file (--config) > defaults.",
    no_args_is_help=True,
    add_completion=False,
    cls=GlobalOptionsGroup,  # the global options are accepted after the command too
    pretty_exceptions_enable=False,  # never render locals (they may hold secrets)
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cdc-outbox {__version__}")
        raise typer.Exit()


@app.callback()
def _global(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", metavar="PATH", help="TOML settings file \\[env: CDC_OUTBOX_CONFIG]."
        ),
    ] = None,
    dsn: Annotated[
        str | None,
        typer.Option("--dsn", help="PostgreSQL conninfo or URI \\[env: CDC_OUTBOX_DSN]."),
    ] = None,
    slot: Annotated[
        str | None, typer.Option("--slot", help="Replication slot name (slot_name).")
    ] = None,
    publication: Annotated[
        str | None, typer.Option("--publication", help="Publication name (publication_name).")
    ] = None,
    table: Annotated[
        str | None,
        typer.Option(
            "--table",
            help="Outbox table name (outbox_table); as schema.table: one configured outbox"
            " table (redrive, cleanup: only that one).",
        ),
    ] = None,
    schema: Annotated[
        str | None, typer.Option("--schema", help="Outbox table schema (outbox_schema).")
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option("--log-level", help="DEBUG, INFO, WARNING, ERROR, CRITICAL (log_level)."),
    ] = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Global options go before or after the command (after wins): cdc-outbox init --dsn ..."""
    opts = ctx.obj = GlobalOptions()
    given = {"config": config, "dsn": dsn, "slot": slot, "publication": publication}
    given.update(table=table, schema=schema, log_level=log_level)
    for name, value in given.items():
        set_global(opts, name, value)


# -- command registration ------------------------------------------------------------------
# Each command module exposes `register(app)` (or a Typer sub-app) and gets its settings with
# `cdc_outbox.cli.common.settings_from(ctx)`.
lifecycle_cmd.register(app)  # init, status, drop

relay_cmd.register(app)  # run

lag_cmd.register(app)  # lag (slot lag, retained WAL, oldest unpublished; --watch)

outbox_ops_cmd.register(app)  # redrive, cleanup (outbox rows, every mode)

consume_cmd.register(app)  # consume (the idempotent consumer, cdc_outbox.consumer)
schemas_cmd.register(app)  # schemas check (Avro schemas against the registry)
config_cmd.register(app)  # config show (effective settings and their sources)
debezium_cmd.register(app)  # config import-debezium (Debezium connector -> TOML)
sql_cmd.register(app)  # sql outbox|processed-events|roles (prints DDL, no database)


def _register_dev_commands(app: typer.Typer) -> None:
    """demo, sandbox up/down/status: only in a dev checkout (cdc_outbox_dev is not shipped)."""
    import importlib.util

    if importlib.util.find_spec("cdc_outbox_dev") is not None:
        from cdc_outbox_dev.cli import register

        register(app)


_register_dev_commands(app)
unwrap_help(app)  # docstrings are hard-wrapped; --help shows each paragraph unbroken


def main() -> None:
    """Console-script entry point; maps errors to exit codes (see module docstring)."""
    run_app(app, "cdc-outbox")
