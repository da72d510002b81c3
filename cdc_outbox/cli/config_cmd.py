"""``cdc-outbox config show``: the effective configuration, secrets redacted, with the source
of each value (default / file / env / flag)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from cdc_outbox.cli.common import global_options, print_json, scrub, settings_from, stdout
from cdc_outbox.config.input import ENV_PREFIX
from cdc_outbox.config.sources import effective_settings

config_app = typer.Typer(help="The configuration in effect.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")


@config_app.command("show")
def show(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Every setting as run would use it (flags > env > TOML file > defaults), secrets shown
    as ***, and where each value came from."""
    settings = settings_from(ctx)
    opts = global_options(ctx)
    path = opts.config
    if path is None and os.environ.get(f"{ENV_PREFIX}CONFIG"):
        path = Path(os.environ[f"{ENV_PREFIX}CONFIG"])
    file_data = tomllib.loads(path.read_text(encoding="utf-8")) if path is not None else None
    flags = dict(opts.overrides)
    if opts.log_level is not None:
        flags["log_level"] = opts.log_level
    rows = effective_settings(settings, file_data=file_data, environ=os.environ, flags=flags)
    if json_out:
        print_json(
            {
                "config_file": str(path) if path else None,
                "settings": {k: {"value": v, "source": s} for k, (v, s) in rows.items()},
            }
        )
        return
    table = Table(title=f"settings (file: {path or 'none'})", title_justify="left")
    for column in ("key", "value", "source"):
        table.add_column(column)
    for key, (value, source) in rows.items():
        table.add_row(key, scrub(_text(value)), source)
    stdout.print(table)


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if value != {} else "{}"
