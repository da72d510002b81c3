"""``cdc-outbox sql outbox|processed-events|roles``: print DDL, connect to nothing.

The statements are the ones ``init --create-table`` (outbox and relay state table),
``consume`` (its de-duplication tables) and the least-privilege relay role use, for the
configured schema, table and columns; ``sql/*.sql`` in the repository holds the same DDL for
the default settings, and this command is how an installed wheel shows it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from psycopg import sql

from cdc_outbox.cli.common import global_options, settings_from


class DdlName(StrEnum):
    outbox = "outbox"
    processed_events = "processed-events"
    roles = "roles"


def register(app: typer.Typer) -> None:
    app.command("sql")(print_sql)


def print_sql(
    ctx: typer.Context,
    name: Annotated[DdlName, typer.Argument(help="Which DDL to print.")],
) -> None:
    """Print the DDL of the outbox tables (each configured one, with its schema unless it is
    public, and the relay's state table), the consumer's processed-events tables, or the relay
    role's grants; needs no database."""
    from cdc_outbox.store import schema

    # No connection is made, so no dsn is needed: a placeholder stands in for it.
    global_options(ctx).overrides["dsn"] = "dbname=unused"
    settings = settings_from(ctx)
    statements: list[sql.Composed]
    if name is DdlName.outbox:
        statements = []
        for outbox in settings.outbox_settings():
            if outbox.schema_name != "public":
                statements.append(schema.create_schema_ddl(outbox.schema_name))
            statements += schema.outbox_table_ddl(settings, outbox)
        statements += schema.relay_state_ddl(settings)
    elif name is DdlName.processed_events:
        statements = schema.processed_events_ddl(settings.outbox().schema_name)
    else:
        statements = schema.role_ddl(settings)
    for statement in statements:
        typer.echo(statement.as_string(None) + ";")
