"""Debezium outbox connector configurations to cdc-outbox settings (pure conversion)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from cdc_outbox.config.settings import load_settings
from cdc_outbox.debezium.config_import import ROUTER_OPTIONS, convert, to_toml
from cdc_outbox.debezium.files import parse_connect_json, parse_properties
from cdc_outbox.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "debezium-outbox.properties"
ROUTER = "io.debezium.transforms.outbox.EventRouter"


def minimal(**extra: str) -> dict[str, str]:
    return {"transforms": "outbox", "transforms.outbox.type": ROUTER, **extra}


def test_the_example_converts_to_settings_that_run_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in __import__("os").environ if n.startswith("CDC_OUTBOX_")]:
        monkeypatch.delenv(name)
    conv = convert(parse_properties(EXAMPLE.read_text()))
    assert conv.settings == {
        "mode": "cdc",
        "dsn": "host=db.internal port=5432 dbname=shop user=debezium",
        "outbox_schema": "app",
        "outbox_table": "outboxevent",
        "slot_name": "shop_outbox",
        "publication_name": "shop_outbox_pub",
        "columns": {"preset": "debezium", "id": "event_id", "aggregate_id": "aggregate_id",
                    "aggregate_type": "aggregate_type",
                    "header_columns": {"eventType": "type", "tenant": "tenant_id"}},
        "topic_template": "shop.{aggregate_type}.events",
        "null_payload": "tombstone",
    }  # fmt: skip
    assert any("database.password is not copied" in n for n in conv.notes)
    assert not any("secrets" in n for n in conv.notes)  # the password's source is not shown
    path = tmp_path / "relay.toml"
    path.write_text(to_toml(conv, EXAMPLE.name))
    settings = load_settings(path)
    assert settings.topic_template == "shop.{aggregate_type}.events"
    assert settings.column_names().id == "event_id"
    assert settings.column_names().event_type == "type"
    headers = settings.column_names().header_columns
    assert headers == (("eventType", "type"), ("tenant", "tenant_id"))
    assert (settings.mode, settings.null_payload, settings.outbox_table) == (
        "cdc", "tombstone", "outboxevent",
    )  # fmt: skip


def test_the_connect_rest_json_form_gives_the_same_settings() -> None:
    config = parse_properties(EXAMPLE.read_text())
    rest = json.dumps({"name": config.pop("name"), "config": {**config, "tasks.max": 1}})
    assert convert(parse_connect_json(rest)).settings == convert(config).settings
    assert parse_connect_json(json.dumps(config)) == config  # the bare config object too


def test_defaults_give_the_debezium_preset_and_topic() -> None:
    conv = convert(minimal())
    assert conv.settings == {
        "mode": "cdc",
        "columns": {"preset": "debezium"},
        "topic_template": "outbox.event.{aggregate_type}",
    }
    load_settings(None, {"dsn": "dbname=x", **conv.settings})


@pytest.mark.parametrize(
    ("replacement", "template"),
    [
        ("${routedByValue}", "{aggregate_type}"),
        ("events.$1", "events.{aggregate_type}"),
        ("a.$0.b", "a.{aggregate_type}.b"),
        ("fixed-topic", "fixed-topic"),
    ],
)
def test_topic_replacements(replacement: str, template: str) -> None:
    conv = convert(minimal(**{"transforms.outbox.route.topic.replacement": replacement}))
    assert conv.settings["topic_template"] == template


def test_routing_by_the_event_type_column_uses_the_event_type_placeholder() -> None:
    conv = convert(minimal(**{"transforms.outbox.route.by.field": "type"}))
    assert conv.settings["topic_template"] == "outbox.event.{event_type}"
    assert conv.settings["columns"] == {"preset": "debezium"}


def test_headers_cdc_outbox_sends_anyway_are_accepted() -> None:
    placement = "type:header:event_type,aggregatetype:header:aggregate_type,id:header"
    conv = convert(minimal(**{"transforms.outbox.table.fields.additional.placement": placement}))
    assert conv.settings["columns"] == {"preset": "debezium"}


def test_header_placements_become_header_columns() -> None:
    placement = " type:header:eventType , tenant:HEADER,aggregateid:header:key.copy,id:header:id"
    conv = convert(minimal(**{
        "transforms.outbox.table.fields.additional.placement": placement,
        "transforms.outbox.table.fields.additional.error.on.missing": "false",
    }))  # fmt: skip
    headers = {"eventType": "type", "tenant": "tenant", "key.copy": "aggregateid"}
    assert conv.settings["columns"] == {"preset": "debezium", "header_columns": headers}
    assert any("error.on.missing=false" in n for n in conv.notes)
    text = to_toml(conv, "x")
    assert '[columns.header_columns]\neventType = "type"\ntenant = "tenant"\n"key.copy" =' in text
    settings = load_settings(None, {"dsn": "dbname=x", **tomllib.loads(text)})
    assert settings.column_names().header_columns == tuple(headers.items())
    assert settings.column_names().row_columns()[-1] == "tenant"  # read by polling, catch-up


def test_expanded_json_with_schemaless_json_converter_is_accepted_with_a_note() -> None:
    conv = convert(minimal(**{
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "transforms.outbox.table.expand.json.payload": "true",
    }))  # fmt: skip
    assert any("drops null fields" in n for n in conv.notes)
    conv = convert(minimal(**{
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "transforms.outbox.table.expand.json.payload": "true",
        "transforms.outbox.table.json.payload.null.behavior": "optional_bytes",
    }))  # fmt: skip
    assert not any("drops null fields" in n for n in conv.notes)


JSONC = "org.apache.kafka.connect.json.JsonConverter"
REFUSED = [
    ({"connector.class": "io.debezium.connector.mysql.MySqlConnector"}, "connector.class="),
    ({"plugin.name": "decoderbufs"}, "plugin.name=decoderbufs"),
    ({"table.include.list": "app.a,app.b.*"}, "table.include.list=app.b.*"),
    ({"table.include.list": "app.a, app.a"}, "table.include.list=app.a: listed twice"),
    ({"table.include.list": "app.out.*"}, "table.include.list=app.out.*"),
    ({"transforms": "outbox,unwrap",
      "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState"},
     "transforms.unwrap.type="),
    ({"transforms.outbox.type": "org.apache.kafka.connect.transforms.RegexRouter"},
     "transforms=outbox: no io.debezium.transforms.outbox.EventRouter"),
    ({"transforms.outbox.table.field.event.timestamp": "created_at"},
     "transforms.outbox.table.field.event.timestamp=created_at"),
    ({"transforms.outbox.table.field.event.schema.version": "v"},
     "table.field.event.schema.version=v"),
    ({"transforms.outbox.tracing.span.context.field": "ctx"}, "tracing.span.context.field=ctx"),
    ({"transforms.outbox.table.op.invalid.behavior": "fatal"}, "table.op.invalid.behavior=fatal"),
    ({"transforms.outbox.route.topic.regex": "(?<routedByValue>[a-z]+)"}, "route.topic.regex="),
    ({"transforms.outbox.route.topic.replacement": "x.${other}"}, "route.topic.replacement="),
    ({"transforms.outbox.route.topic.replacement": "bad topic"}, "route.topic.replacement="),
    ({"transforms.outbox.table.fields.additional.placement": "type:header:id"},
     "table.fields.additional.placement=type:header:id: cdc-outbox sets header 'id' itself"),
    ({"transforms.outbox.table.fields.additional.placement": "a:header:x,b:header:x"},
     "table.fields.additional.placement=b:header:x: header 'x' is placed twice"),
    ({"transforms.outbox.table.fields.additional.placement": "a:header:cdc_outbox.x"},
     "placement=a:header:cdc_outbox.x"),
    ({"transforms.outbox.table.fields.additional.placement": "bad-col:header:x"},
     "placement=bad-col"),
    ({"transforms.outbox.table.fields.additional.placement": "a:header:x:y"},
     "placement=a:header:x:y: not column:placement[:alias]"),
    ({"transforms.outbox.table.fields.additional.placement": "region:envelope"},
     "table.fields.additional.placement=region:envelope: cdc-outbox has no envelope"),
    ({"transforms.outbox.table.fields.additional.placement": "region:envelope:r"},
     "table.fields.additional.placement=region:envelope:r: cdc-outbox has no envelope"),
    ({"transforms.outbox.table.fields.additional.placement": "p:partition"},
     "table.fields.additional.placement=p:partition"),
    ({"transforms.outbox.table.field.event.key": "bad-name"}, "table.field.event.key=bad-name"),
    ({"transforms.outbox.no.such.option": "1"}, "transforms.outbox.no.such.option=1"),
    ({"key.converter": JSONC}, "key.converter="),
    ({"value.converter": "io.debezium.converters.BinaryDataConverter"}, "value.converter="),
    ({"value.converter": JSONC, "transforms.outbox.table.expand.json.payload": "true"},
     "value.converter.schemas.enable=true"),
    ({"value.converter": JSONC, "value.converter.schemas.enable": "false"},
     "table.expand.json.payload=false"),
    ({"transforms.outbox.table.expand.json.payload": "true"}, "table.expand.json.payload=true"),
    ({"header.converter": JSONC}, "header.converter="),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "fragment"), REFUSED)
def test_unsupported_settings_are_refused_in_one_line(extra: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        convert(minimal(**extra))
    message = str(info.value)
    assert message.startswith("config import-debezium: ") and "\n" not in message
    assert fragment in message


def test_every_router_option_is_mapped_refused_or_accepted_in_the_docs() -> None:
    doc = (REPO / "docs" / "debezium.md").read_text()
    for option in ROUTER_OPTIONS:
        assert f"| `{option}`" in doc, option


def test_cli_prints_toml_or_refuses_with_exit_2(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "cdc_outbox", "config", "import-debezium"]
    done = subprocess.run([*cli, str(EXAMPLE)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert 'topic_template = "shop.{aggregate_type}.events"' in done.stdout
    assert "secrets" not in done.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"config": minimal(**{"plugin.name": "wal2json"})}))
    refused = subprocess.run([*cli, str(bad)], capture_output=True, text=True, check=False)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        "cdc-outbox: error: config import-debezium: plugin.name=wal2json: cdc-outbox decodes"
        " pgoutput only (the slot must be a pgoutput slot)"
    ]


def test_several_included_tables_become_outboxes_entries(tmp_path: Path) -> None:
    """One EventRouter serves every table Debezium includes: each becomes an [[outboxes]]
    entry with the router's columns and topic, and the TOML loads as those outboxes."""
    include = {"table.include.list": "app.orders_outbox, billing.outbox,shipping",
               "database.hostname": "db"}  # fmt: skip
    options = {"transforms.outbox.table.field.event.id": "event_id",
               "transforms.outbox.route.topic.replacement": "shop.${routedByValue}"}  # fmt: skip
    conv = convert(minimal(**include, **options))
    entry = {"topic_template": "shop.{aggregate_type}",
             "columns": {"preset": "debezium", "id": "event_id"}}  # fmt: skip
    assert conv.settings["outboxes"] == [
        {"schema": "app", "table": "orders_outbox", **entry},
        {"schema": "billing", "table": "outbox", **entry},
        {"schema": "public", "table": "shipping", **entry},
    ]
    for key in ("outbox_schema", "outbox_table", "columns", "topic_template"):
        assert key not in conv.settings  # the entries replace the single-table keys
    text = to_toml(conv, "connector.json")
    assert text.count("[[outboxes]]") == 3 and text.count("[outboxes.columns]") == 3
    path = tmp_path / "relay.toml"
    path.write_text(text)
    settings = load_settings(path)
    assert [o.name for o in settings.outbox_settings()] == [
        "app.orders_outbox", "billing.outbox", "public.shipping",
    ]  # fmt: skip
    for outbox in settings.outbox_settings():
        assert settings.column_names(outbox).id == "event_id"
        assert outbox.topic_template == "shop.{aggregate_type}"
        assert not outbox.columns.has_status and outbox.cdc_mark_published == "off"
