"""Convert a Debezium outbox connector configuration into cdc-outbox settings (pure, no I/O).

Input: the connector's settings as a flat ``{key: value}`` mapping, as
:mod:`cdc_outbox.debezium.files` reads them from a ``.properties`` file or Kafka Connect's JSON.

Contract of :func:`convert`: it returns the equivalent settings (what docs/debezium.md maps,
setting by setting) and the notes to print with them, or raises :class:`ConfigError` with one
line naming the first setting cdc-outbox cannot honour: every option of the outbox
``EventRouter`` is either mapped, accepted because the records come out the same, or refused;
connector keys that cannot change the records (``tasks.max``, ``snapshot.mode``, ...) are
listed as not carried over. Several tables in ``table.include.list`` become ``[[outboxes]]``
entries (one EventRouter serves them all: each gets its columns and topic). The password is
never copied (libpq reads ``PGPASSWORD``).
:func:`to_toml` renders the settings as a TOML file for ``cdc-outbox --config``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdc_outbox.config.models import COLUMN_PRESETS, IDENT_RE
from cdc_outbox.errors import ConfigError
from cdc_outbox.names import is_free_header_name, is_legal_topic

__all__ = [
    "EVENT_ROUTER",
    "ROUTER_OPTIONS",
    "Conversion",
    "convert",
    "to_toml",
]

EVENT_ROUTER = "io.debezium.transforms.outbox.EventRouter"
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
STRING_CONVERTER = "org.apache.kafka.connect.storage.StringConverter"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
_HEADER_CONVERTERS = {"org.apache.kafka.connect.storage.SimpleHeaderConverter", STRING_CONVERTER}
DEFAULT_REGEX = "(?<routedByValue>.*)"

#: Every option of Debezium's outbox EventRouter, with its Debezium default.
ROUTER_OPTIONS: dict[str, str | None] = {
    "table.op.invalid.behavior": "warn",
    "table.field.event.id": "id",
    "table.field.event.key": "aggregateid",
    "table.field.event.type": "type",
    "table.field.event.timestamp": None,
    "table.field.event.payload": "payload",
    "table.expand.json.payload": "false",
    "table.json.payload.null.behavior": "ignore",
    "table.fields.additional.placement": None,
    "table.fields.additional.error.on.missing": "true",
    "table.field.event.schema.version": None,
    "route.by.field": "aggregatetype",
    "route.topic.regex": DEFAULT_REGEX,
    "route.topic.replacement": "outbox.event.${routedByValue}",
    "route.tombstone.on.empty.payload": "false",
    "tracing.span.context.field": "tracingspancontext",
    "tracing.operation.name": "debezium-read",
    "tracing.with.context.field.only": "false",
}
#: Router options whose only effect cdc-outbox cannot reproduce: refused when set at all.
_REFUSED_WHEN_SET = {
    "table.field.event.timestamp": "the Kafka timestamp is the produce time; cdc-outbox cannot"
    " take it from a column",
    "table.field.event.schema.version": "Connect schema versions exist only with schema-carrying"
    " converters; cdc-outbox publishes the payload as stored",
    "tracing.span.context.field": "cdc-outbox does not read a tracing span context column",
    "tracing.operation.name": "cdc-outbox does not emit Debezium tracing spans",
    "tracing.with.context.field.only": "cdc-outbox does not emit Debezium tracing spans",
}
_DSN_KEYS = (
    ("database.hostname", "host"),
    ("database.port", "port"),
    ("database.dbname", "dbname"),
    ("database.user", "user"),
    ("database.sslmode", "sslmode"),
)
_HANDLED = {"connector.class", "plugin.name", "transforms", "table.include.list"}
_HANDLED |= {"slot.name", "publication.name", "database.password", "name"}
_HANDLED |= {"key.converter", "value.converter", "header.converter"}
_HANDLED |= {"value.converter.schemas.enable", "key.converter.schemas.enable"}
_HANDLED |= {key for key, _ in _DSN_KEYS}


@dataclass(slots=True)
class Conversion:
    """The settings (nested like the TOML file) and the notes for the reader."""

    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: ``(schema, table)`` of each table of ``table.include.list``.
    tables: list[tuple[str, str]] = field(default_factory=list)


def _refuse(key: str, value: str | None, why: str) -> ConfigError:
    shown = key if value is None else f"{key}={value}"
    return ConfigError(f"config import-debezium: {shown}: {why}")


# -- conversion ------------------------------------------------------------------------


def _router_name(config: Mapping[str, str]) -> str:
    names = [n.strip() for n in config.get("transforms", "").split(",") if n.strip()]
    routers = [n for n in names if config.get(f"transforms.{n}.type") == EVENT_ROUTER]
    if not routers:
        raise _refuse("transforms", config.get("transforms"), f"no {EVENT_ROUTER} among them")
    for name in names:
        if name not in routers:
            kind = config.get(f"transforms.{name}.type")
            raise _refuse(f"transforms.{name}.type", kind, "only the outbox EventRouter is"
                          " supported; cdc-outbox applies no other transformation")  # fmt: skip
    if len(routers) > 1:
        raise _refuse("transforms", config["transforms"], "more than one EventRouter")
    return routers[0]


def _router_options(config: Mapping[str, str], router: str) -> dict[str, str]:
    prefix = f"transforms.{router}."
    options: dict[str, str] = {}
    for key, value in config.items():
        if not key.startswith(prefix) or key == prefix + "type":
            continue
        option = key[len(prefix) :]
        if option in ("predicate", "negate"):
            continue  # selects the outbox table's records: cdc-outbox reads nothing else
        if option not in ROUTER_OPTIONS:
            raise _refuse(key, value, "not an option of the outbox EventRouter")
        options[option] = value.strip()
    return options


def _check_converters(config: Mapping[str, str], expand: bool) -> None:
    key_conv = config.get("key.converter", STRING_CONVERTER).strip()
    if key_conv != STRING_CONVERTER:
        raise _refuse("key.converter", key_conv, "cdc-outbox keys are the aggregate id's text,"
                      f" as {STRING_CONVERTER} writes them")  # fmt: skip
    value_conv = config.get("value.converter", "").strip()
    if value_conv in ("", STRING_CONVERTER) and expand:
        raise _refuse("table.expand.json.payload", "true", "an expanded payload needs"
                      f" value.converter={JSON_CONVERTER} with schemas.enable=false")  # fmt: skip
    if value_conv == JSON_CONVERTER:
        schemas = config.get("value.converter.schemas.enable", "true").strip().lower()
        if schemas != "false":
            raise _refuse("value.converter.schemas.enable", schemas, "JsonConverter with"
                          " schemas wraps each value in a schema envelope; cdc-outbox publishes"
                          " the payload itself (set it to false)")  # fmt: skip
        if not expand:
            raise _refuse("table.expand.json.payload", "false", "with JsonConverter Debezium"
                          " publishes the payload as one JSON string; cdc-outbox publishes the"
                          " JSON itself (set it to true)")  # fmt: skip
    elif value_conv not in ("", STRING_CONVERTER):
        raise _refuse("value.converter", value_conv, "cdc-outbox publishes the payload column's"
                      f" text, as {STRING_CONVERTER} (or {JSON_CONVERTER} with an expanded"
                      " payload) does")  # fmt: skip
    header_conv = config.get("header.converter", "").strip()
    if header_conv and header_conv not in _HEADER_CONVERTERS:
        raise _refuse("header.converter", header_conv, "cdc-outbox headers are UTF-8 text")


def _column(option: str, value: str) -> str:
    if not IDENT_RE.fullmatch(value):
        raise _refuse(f"transforms.*.{option}", value, "not a column name cdc-outbox accepts")
    return value


def _topic_template(opts: Mapping[str, str], placeholder: str) -> str:
    regex = opts.get("route.topic.regex", DEFAULT_REGEX)
    if regex != DEFAULT_REGEX:
        raise _refuse("route.topic.regex", regex, f"only the default {DEFAULT_REGEX} (the whole"
                      " routing value) is supported")  # fmt: skip
    replacement = opts.get("route.topic.replacement", "outbox.event.${routedByValue}")
    out: list[str] = []
    for token in re.findall(r"\\.|\$\{[^}]*\}|\$\d+|\$|[^\\$]+", replacement):
        if token in ("${routedByValue}", "$0", "$1"):
            out.append(placeholder)
        elif token.startswith("\\"):
            out.append(token[1:])
        elif token.startswith("$"):
            raise _refuse("route.topic.replacement", replacement, f"{token} is not a group of"
                          f" the default route.topic.regex")  # fmt: skip
        else:
            out.append(token)
    template = "".join(out)
    if "{" in template.replace(placeholder, "") or "}" in template.replace(placeholder, ""):
        raise _refuse("route.topic.replacement", replacement, "not a legal Kafka topic name")
    sample = template.replace(placeholder, "a")
    if not is_legal_topic(sample):
        raise _refuse("route.topic.replacement", replacement, "not a legal Kafka topic name")
    return template


def _placements(opts: Mapping[str, str], columns: Mapping[str, str]) -> dict[str, str]:
    """``columns.header_columns`` for the ``column:header[:alias]`` placements (those of
    headers cdc-outbox sends anyway are dropped); any other placement is refused."""
    key = "table.fields.additional.placement"
    sent = {
        (columns["id"], "id"),
        (columns["event_type"], "event_type"),
        (columns["aggregate_type"], "aggregate_type"),
    }
    headers: dict[str, str] = {}
    for entry in (e.strip() for e in opts.get(key, "").split(",") if e.strip()):
        parts = [p.strip() for p in entry.split(":")]
        if len(parts) not in (2, 3) or not all(parts):
            raise _refuse(key, entry, "not column:placement[:alias]")
        column, placement = _column(key, parts[0]), parts[1].lower()
        alias = parts[2] if len(parts) == 3 else column
        if placement == "envelope":
            raise _refuse(key, entry, "cdc-outbox has no envelope: the value is the payload"
                          " column as stored (place the column in a header instead)")  # fmt: skip
        if placement != "header":
            raise _refuse(key, entry, "cdc-outbox places columns in headers only (the partition"
                          " follows the key, the aggregate id)")  # fmt: skip
        if (column, alias) in sent:
            continue
        if not is_free_header_name(alias):
            raise _refuse(key, entry, f"cdc-outbox sets header {alias!r} itself (id, event_type"
                          " and aggregate_type come from their columns)")  # fmt: skip
        if alias in headers:
            raise _refuse(key, entry, f"header {alias!r} is placed twice")
        headers[alias] = column
    return headers


def _connection(config: Mapping[str, str], conv: Conversion) -> None:
    cls = config.get("connector.class", POSTGRES_CONNECTOR).strip()
    if cls != POSTGRES_CONNECTOR:
        raise _refuse("connector.class", cls, f"cdc-outbox reads PostgreSQL ({POSTGRES_CONNECTOR})")
    plugin = config.get("plugin.name", "pgoutput").strip()
    if plugin != "pgoutput":
        raise _refuse("plugin.name", plugin, "cdc-outbox decodes pgoutput only (the slot must"
                      " be a pgoutput slot)")  # fmt: skip
    parts: list[str] = []
    for key, word in _DSN_KEYS:
        value = config.get(key, "").strip()
        if "${" in value:
            conv.notes.append(f"{key} uses a config provider ({value}): add {word}= to dsn")
        elif value:
            parts.append(f"{word}={value}" if re.fullmatch(r"[^\s'\\]+", value) else
                         f"{word}='{value}'")  # fmt: skip
    if parts:
        conv.settings["dsn"] = " ".join(parts)
    if "database.password" in config:
        conv.notes.append("database.password is not copied: set PGPASSWORD, or put the whole"
                          " conninfo in CDC_OUTBOX_DSN")  # fmt: skip
    conv.tables = _included_tables(config)
    for key, setting in (("slot.name", "slot_name"), ("publication.name", "publication_name")):
        if config.get(key, "").strip():
            conv.settings[setting] = config[key].strip()


def _included_tables(config: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(schema, table)`` of each ``table.include.list`` entry (plain names only, each once)."""
    tables: list[tuple[str, str]] = []
    for entry in (t.strip() for t in config.get("table.include.list", "").split(",")):
        if not entry:
            continue
        schema, _, table = entry.rpartition(".")
        for what, name in (("schema", schema or "public"), ("table", table)):
            if not IDENT_RE.fullmatch(name):
                raise _refuse("table.include.list", entry, f"{what} {name!r} is not a plain"
                              " identifier (regular expressions are not supported)")  # fmt: skip
        if (schema or "public", table) in tables:
            raise _refuse("table.include.list", entry, "listed twice")
        tables.append((schema or "public", table))
    return tables


def _place_tables(conv: Conversion) -> None:
    """One included table: the single-table keys; several: an ``[[outboxes]]`` entry each,
    with the router's columns and topic (one EventRouter serves every table)."""
    if len(conv.tables) == 1:
        conv.settings["outbox_schema"], conv.settings["outbox_table"] = conv.tables[0]
        return
    if not conv.tables:
        return
    shared = {key: conv.settings.pop(key) for key in ("topic_template", "columns")}
    conv.settings["outboxes"] = [
        {"schema": schema, "table": table, **shared} for schema, table in conv.tables
    ]


def convert(config: Mapping[str, str]) -> Conversion:
    """The cdc-outbox settings equivalent to a Debezium outbox connector (module contract)."""
    conv = Conversion(settings={"mode": "cdc"})
    _connection(config, conv)
    router = _router_name(config)
    opts = _router_options(config, router)
    for option, why in _REFUSED_WHEN_SET.items():
        if option in opts and opts[option] != ROUTER_OPTIONS[option]:
            raise _refuse(f"transforms.{router}.{option}", opts[option], why)
    expand = opts.get("table.expand.json.payload", "false").lower() == "true"
    _check_converters(config, expand)
    behaviour = opts.get("table.op.invalid.behavior", "warn").lower()
    if behaviour == "fatal":
        raise _refuse(f"transforms.{router}.table.op.invalid.behavior", behaviour, "cdc-outbox"
                      " never sees updates (its publication publishes inserts only), so it"
                      " cannot stop on one")  # fmt: skip
    columns = {
        "id": _column("table.field.event.id", opts.get("table.field.event.id", "id")),
        "aggregate_id": _column("table.field.event.key",
                                opts.get("table.field.event.key", "aggregateid")),
        "event_type": _column("table.field.event.type", opts.get("table.field.event.type", "type")),
        "payload": _column("table.field.event.payload",
                           opts.get("table.field.event.payload", "payload")),
        "aggregate_type": "aggregatetype",
    }  # fmt: skip
    route_by = _column("route.by.field", opts.get("route.by.field", "aggregatetype"))
    placeholder = "{event_type}" if route_by == columns["event_type"] else "{aggregate_type}"
    if placeholder == "{aggregate_type}":
        columns["aggregate_type"] = route_by
    header_columns = _placements(opts, columns)
    preset = COLUMN_PRESETS["debezium"]
    overrides: dict[str, Any] = {k: v for k, v in columns.items() if preset[k] != v}
    if header_columns:
        overrides["header_columns"] = header_columns
        if opts.get("table.fields.additional.error.on.missing", "true").lower() == "false":
            conv.notes.append(
                "table.fields.additional.error.on.missing=false: cdc-outbox"
                " needs the header columns (`run` stops if one is missing)"
            )
    conv.settings["columns"] = {"preset": "debezium", **overrides}
    conv.settings["topic_template"] = _topic_template(opts, placeholder)
    _place_tables(conv)
    if opts.get("route.tombstone.on.empty.payload", "false").lower() == "true":
        conv.settings["null_payload"] = "tombstone"
    if expand and opts.get("table.json.payload.null.behavior", "ignore").lower() == "ignore":
        conv.notes.append(
            "table.json.payload.null.behavior=ignore: Debezium drops null fields"
            " of an expanded payload; cdc-outbox keeps the payload as stored"
        )
    skipped = sorted(k for k in config if k not in _HANDLED and not k.startswith("transforms."))
    if skipped:
        conv.notes.append("not carried over (they do not change the records): "
                          + ", ".join(skipped))  # fmt: skip
    conv.notes.append("set kafka.bootstrap_servers (the Connect worker's bootstrap.servers)")
    return conv


# -- output ----------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML escapes


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_table(lines: list[str], name: str, table: Mapping[str, Any], array: bool = False) -> None:
    """``table`` as ``[name]`` (``array``: ``[[name]]``), then its sub-tables as
    ``[name.key]`` and its lists of tables as ``[[name.key]]``, appended to ``lines``."""
    if name:
        lines += ["", f"[[{name}]]" if array else f"[{name}]"]
    subs = {k: v for k, v in table.items() if isinstance(v, Mapping)}
    arrays = {
        k: v for k, v in table.items()
        if isinstance(v, list) and v and all(isinstance(x, Mapping) for x in v)
    }  # fmt: skip
    lines += [
        f"{_toml_key(k)} = {_toml_value(v)}"
        for k, v in table.items()
        if k not in subs and k not in arrays
    ]
    for key, sub in subs.items():
        _toml_table(lines, f"{name}.{_toml_key(key)}" if name else _toml_key(key), sub)
    for key, items in arrays.items():
        for item in items:
            _toml_table(lines, f"{name}.{_toml_key(key)}" if name else _toml_key(key), item, True)


def to_toml(conv: Conversion, source: str) -> str:
    """``conv`` as a TOML settings file, its notes as comments at the top."""
    lines = [f"# cdc-outbox settings converted from the Debezium connector {source}"]
    lines += [f"# {note}" for note in conv.notes]
    _toml_table(lines, "", conv.settings)
    return "\n".join(lines) + "\n"
