"""``cdc-outbox schemas check``: validate (and register) the Avro schemas before a run.

Exit 0 when every schema of ``schema_registry.schemas_dir`` is compatible with its subject;
3 with one line per refused subject (naming the subject and the rule) otherwise; 1 when the
registry cannot be reached; 2 for a configuration problem.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from cdc_outbox.cli.common import print_json, settings_from, stdout
from cdc_outbox.errors import CdcOutboxError, ConfigError, PreflightError

schemas_app = typer.Typer(help="Avro schemas and the schema registry.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(schemas_app, name="schemas")


@schemas_app.command("check")
def check(
    ctx: typer.Context,
    topic: Annotated[
        list[str] | None,
        typer.Option(
            "--topic",
            metavar="RECORD=TOPIC",
            help="Topic of a record (topic strategies with {aggregate_type}); repeatable.",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Check the schemas of schema_registry.schemas_dir against the registry (BACKWARD by
    default) and register them with auto_register; exit 3 if one is refused."""
    from cdc_outbox.avro.check import check_schemas
    from cdc_outbox.avro.registry import RegistryUnavailable

    settings = settings_from(ctx)
    topics: dict[str, str] = {}
    for item in topic or []:
        record, sep, name = item.partition("=")
        if not sep or not record or not name:
            raise ConfigError(f"config: --topic {item!r} must be RECORD=TOPIC")
        topics[record] = name
    try:
        results = check_schemas(settings, topics)
    except RegistryUnavailable as exc:
        raise CdcOutboxError(str(exc)) from None
    if json_out:
        print_json([dataclasses.asdict(r) for r in results])
    else:
        for r in results:
            if r.problem is None:
                registered = f" (id {r.schema_id})" if r.schema_id is not None else ""
                stdout.print(f"ok {r.subject}: {r.record}{registered}")
    problems = [r.problem for r in results if r.problem is not None]
    if problems:
        raise PreflightError("; ".join(problems))
