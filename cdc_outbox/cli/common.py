"""Shared CLI plumbing: global options, settings loading, logging, output, error mapping.

Commands get their settings with :func:`settings_from` (global flags override env/TOML).
The global options are accepted before and after the command (:class:`GlobalOptionsGroup`);
given in both places, the one after the command wins.
Errors are turned into exit codes in one place, :func:`error_exit` (called by ``main``):
``CdcOutboxError`` -> its ``exit_code`` (ConfigError 2, PreflightError 3, others 1),
``psycopg.Error`` -> 1; always one line on stderr, secrets masked.
"""

from __future__ import annotations

import copy
import json
import logging
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import typer
from rich.console import Console
from typer.core import TyperGroup

from cdc_outbox.config.settings import Settings, load_settings
from cdc_outbox.errors import CdcOutboxError
from cdc_outbox.redaction import redact

#: Secret strings seen in loaded settings; masked in error lines and log records.
_SECRETS: set[str] = set()

stdout = Console(highlight=False, soft_wrap=False)


@dataclass(slots=True)
class GlobalOptions:
    """Values of the global flags (``None`` = not given)."""

    config: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    log_level: str | None = None
    #: ``--table schema.table`` (dotted): names one configured outbox table (commands that
    #: work per table, redrive and cleanup, take only it); undotted, ``--table`` sets
    #: ``outbox_table``.
    table: str | None = None


#: Global options that set a setting: parameter name -> setting key (``config`` and
#: ``log_level`` are kept apart: the file is a source, the level also sets up logging).
SETTING_OF = {
    "dsn": "dsn",
    "slot": "slot_name",
    "publication": "publication_name",
    "table": "outbox_table",
    "schema": "outbox_schema",
}
GLOBAL_PARAMS = frozenset({*SETTING_OF, "config", "log_level"})


def global_options(ctx: typer.Context) -> GlobalOptions:
    obj = ctx.find_root().obj
    if not isinstance(obj, GlobalOptions):
        obj = ctx.find_root().obj = GlobalOptions()
    return obj


def set_global(opts: GlobalOptions, name: str, value: Any) -> None:
    """Record global option ``name`` (a :data:`GLOBAL_PARAMS` name); ``None`` = not given."""
    if value is None:
        return
    if name == "config":
        opts.config = Path(value)
    elif name == "table" and "." in str(value):
        opts.table = str(value)
    elif name == "log_level":
        opts.log_level = str(value)
    else:
        opts.overrides[SETTING_OF[name]] = value


class GlobalOptionsGroup(TyperGroup):
    """The root group: every command (also in sub-groups) accepts the root's global options
    too, as copies that record their value after the root callback ran, so they win."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        shared = [p for p in self.params if p.name in GLOBAL_PARAMS]
        for command in self.commands.values():
            _add_options(command, shared)
        _tidy_metavars(self)


def _tidy_metavars(command: Any) -> None:
    """Real metavars in ``--help`` instead of typer's ``<str>``/``<bool>``: none for a flag,
    the choices for a choice (``cdc|polling|auto``), else the option's name (``--slot SLOT``)."""
    for param in command.params:
        _tidy(param)
    get_help_option = command.get_help_option

    def help_option(ctx: Any) -> Any:
        option = get_help_option(ctx)
        if option is not None:
            _tidy(option)
        return option

    command.get_help_option = help_option
    for sub in (getattr(command, "commands", None) or {}).values():
        _tidy_metavars(sub)


def _tidy(param: Any) -> None:
    if param.metavar is not None or getattr(param, "param_type_name", "") != "option":
        return
    desc = getattr(param, "type_descriptor", None)
    choices = desc.choices if desc is not None and desc.is_choice else None
    if getattr(param, "is_flag", False):
        param.metavar = ""
    elif choices:
        param.metavar = "|".join(str(c) for c in choices)
    else:
        param.metavar = str(param.name).upper()


def _add_options(command: Any, shared: list[Any]) -> None:
    subcommands = getattr(command, "commands", None)
    if isinstance(subcommands, dict):  # a sub-group: its commands take them
        for sub in subcommands.values():
            _add_options(sub, shared)
        return
    for param in shared:
        option = copy.copy(param)
        option.expose_value = False
        option.callback = _record
        option.rich_help_panel = "Global options (also before the command)"
        command.params.append(option)


def _record(ctx: typer.Context, param: Any, value: Any) -> Any:
    set_global(global_options(ctx), str(param.name), value)
    return value


def settings_from(ctx: typer.Context) -> Settings:
    """Load settings (flags > env > TOML > defaults), register secrets, set up logging."""
    opts = global_options(ctx)
    overrides = dict(opts.overrides)
    if opts.log_level is not None:
        overrides["log_level"] = opts.log_level
    settings = load_settings(opts.config, overrides)
    _SECRETS.update(settings.secret_values())
    setup_logging(settings.log_level, settings.log_format)
    if opts.table is not None:
        settings.outbox(opts.table)  # ConfigError (exit 2) unless it is a configured one
    return settings


def selected_table(ctx: typer.Context) -> str | None:
    """The outbox table ``--table schema.table`` names (None: not given; every table)."""
    return global_options(ctx).table


def scrub(text: str) -> str:
    """``text`` with every known secret replaced by ``***``."""
    return redact(text, _SECRETS)


#: Context fields a log call may pass with ``extra={...}``; they become keys of a JSON line
#: (and ``key=value`` pairs after a text line).
LOG_CONTEXT_FIELDS = ("event_id", "aggregate_id", "event_type", "topic", "lsn", "mode", "slot")


def _context(record: logging.LogRecord) -> dict[str, str]:
    return {
        name: str(getattr(record, name))
        for name in LOG_CONTEXT_FIELDS
        if getattr(record, name, None) is not None
    }


class _ScrubbingFormatter(logging.Formatter):
    def __init__(self, json_lines: bool) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.json_lines = json_lines

    def formatMessage(self, record: logging.LogRecord) -> str:  # text lines, before exc text
        text = super().formatMessage(record)
        context = _context(record)
        if context:
            text += " [" + " ".join(f"{k}={v}" for k, v in context.items()) + "]"
        return text

    def format(self, record: logging.LogRecord) -> str:
        if not self.json_lines:
            return scrub(super().format(record))
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_context(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        # Scrub the values before JSON escaping could hide a secret from the final pass.
        return scrub(json.dumps({k: scrub(v) for k, v in entry.items()}))


def setup_logging(level: str, fmt: str = "text") -> None:
    """Log to stderr at ``level``; ``fmt`` is "text" or "json" (one object per line)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_ScrubbingFormatter(json_lines=fmt == "json"))
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_cdc_outbox", False):
            root.removeHandler(old)
    handler._cdc_outbox = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)


def print_json(data: Any) -> None:
    """Machine output: one JSON document on stdout."""
    typer.echo(scrub(json.dumps(data, indent=2, default=str)))


def run_app(app: typer.Typer, prog_name: str) -> None:
    """Run a typer app as a console entry point: errors become one line and an exit code
    (:func:`error_exit`); anything not ours is raised as is."""
    try:
        app(prog_name=prog_name)
    except Exception as exc:
        code = error_exit(exc)
        if code is None:
            raise
        sys.exit(code)


def error_exit(exc: BaseException) -> int | None:
    """Print ``exc`` as one stderr line and return its exit code; ``None`` = not ours."""
    if isinstance(exc, CdcOutboxError):
        code = exc.exit_code
        message = str(exc)
    elif isinstance(exc, psycopg.Error):
        code = 1
        message = f"database error: {exc}"
    else:
        return None
    line = scrub(" ".join(message.split())) or type(exc).__name__
    print(f"cdc-outbox: error: {line}", file=sys.stderr)
    return code
