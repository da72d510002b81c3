"""``cdc-outbox config import-debezium FILE``: print the TOML equivalent of a Debezium outbox
connector configuration (``.properties`` or Kafka Connect REST ``.json``).

Exit 0 with the TOML on stdout; 2 with one line naming the first setting cdc-outbox cannot
honour (or an unreadable file). The conversion itself is :mod:`cdc_outbox.debezium.config_import`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cdc_outbox.errors import ConfigError


def _config_group(app: typer.Typer) -> typer.Typer:
    """The ``config`` sub-app of ``app``: the one another module registered, or a new one."""
    for group in app.registered_groups:
        if group.name == "config" and isinstance(group.typer_instance, typer.Typer):
            return group.typer_instance
    config_app = typer.Typer(help="Settings: import and inspect.", no_args_is_help=True)
    app.add_typer(config_app, name="config")
    return config_app


def register(app: typer.Typer) -> None:
    _config_group(app).command("import-debezium")(import_debezium)


def import_debezium(
    file: Annotated[
        Path,
        typer.Argument(
            metavar="FILE", help="Debezium connector config: .properties or Kafka Connect .json."
        ),
    ],
) -> None:
    """Print the cdc-outbox TOML equivalent to a Debezium outbox connector configuration;
    refuse (exit 2) with one line naming a setting cdc-outbox does not support."""
    from cdc_outbox.debezium.config_import import convert, to_toml
    from cdc_outbox.debezium.files import parse_connect_json, parse_properties

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config import-debezium: cannot read {file}: {exc}") from None
    is_json = file.suffix.lower() == ".json" or text.lstrip().startswith("{")
    config = parse_connect_json(text) if is_json else parse_properties(text)
    typer.echo(to_toml(convert(config), file.name), nl=False)
