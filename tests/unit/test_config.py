"""Settings: precedence, presets, validation messages, redaction (no I/O but env and tmp files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import SecretStr

from cdc_outbox.config.settings import ColumnSettings, Settings, load_settings, redact_dsn
from cdc_outbox.errors import ConfigError
from cdc_outbox.mapping.build import outbox_mapper
from cdc_outbox.mapping.rows import DEBEZIUM_COLUMNS, DEFAULT_COLUMNS
from tests.support.settings import config_error

DSN = "host=db.example port=5432 user=app dbname=shop"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see only the CDC_OUTBOX_* variables they set themselves."""
    for name in list(os.environ):
        if name.upper().startswith("CDC_OUTBOX_"):
            monkeypatch.delenv(name)


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cdc-outbox.toml"
    path.write_text(text, encoding="utf-8")
    return path


# -- precedence ----------------------------------------------------------------------------


def test_defaults() -> None:
    s = load_settings(overrides={"dsn": DSN})
    assert s.slot_name == "cdc_outbox"
    assert s.publication_name == "cdc_outbox_pub"
    assert (s.outbox_schema, s.outbox_table) == ("public", "outbox")
    assert s.topic_template == "outbox.event.{aggregate_type}"
    assert s.status_interval_s == 10.0
    assert s.polling.batch_size == 500
    assert s.kafka_config() == {"bootstrap.servers": "127.0.0.1:9092"}
    assert s.column_names() == DEFAULT_COLUMNS


def test_flag_beats_env_beats_toml_beats_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = write_toml(
        tmp_path, f'dsn = "{DSN}"\nslot_name = "from_toml"\nmax_in_flight = 7\nmode = "cdc"\n'
    )
    monkeypatch.setenv("CDC_OUTBOX_SLOT_NAME", "from_env")
    monkeypatch.setenv("CDC_OUTBOX_MAX_IN_FLIGHT", "8")

    s = load_settings(toml, {"slot_name": "from_flag"})
    assert s.slot_name == "from_flag"  # flag > env
    assert s.max_in_flight == 8  # env > TOML
    assert s.mode == "cdc"  # TOML > default
    assert s.publication_name == "cdc_outbox_pub"  # default

    monkeypatch.delenv("CDC_OUTBOX_SLOT_NAME")
    assert load_settings(toml).slot_name == "from_toml"
    assert load_settings(None, {"dsn": DSN}).slot_name == "cdc_outbox"


def test_none_override_means_flag_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_OUTBOX_DSN", DSN)
    monkeypatch.setenv("CDC_OUTBOX_SLOT_NAME", "from_env")
    assert load_settings(overrides={"slot_name": None}).slot_name == "from_env"


def test_config_file_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = write_toml(tmp_path, f'dsn = "{DSN}"\noutbox_table = "events"\n')
    monkeypatch.setenv("CDC_OUTBOX_CONFIG", str(toml))
    assert load_settings().outbox_table == "events"


def test_nested_values_merge_across_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = write_toml(
        tmp_path,
        f'dsn = "{DSN}"\n[polling]\nbatch_size = 10\nlease_s = 5\n'
        '[kafka]\nbootstrap_servers = "k1:9092"\n[kafka.config]\n"linger.ms" = 5\n'
        '"enable.idempotence" = true\n',
    )
    monkeypatch.setenv("CDC_OUTBOX_POLLING__BATCH_SIZE", "20")
    s = load_settings(toml)
    assert s.polling.batch_size == 20
    assert s.polling.lease_s == 5.0
    assert s.kafka_config() == {
        "bootstrap.servers": "k1:9092",
        "linger.ms": "5",
        "enable.idempotence": "true",
    }


# -- column presets ------------------------------------------------------------------------


def test_debezium_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_OUTBOX_COLUMNS__PRESET", "debezium")
    s = load_settings(overrides={"dsn": DSN})
    assert s.column_names() == DEBEZIUM_COLUMNS


def test_column_override_wins_over_preset(tmp_path: Path) -> None:
    toml = write_toml(
        tmp_path, f'dsn = "{DSN}"\n[columns]\npreset = "debezium"\nevent_type = "kind"\n'
    )
    cols = load_settings(toml).column_names()
    assert cols.event_type == "kind"
    assert cols.aggregate_type == "aggregatetype"
    assert cols.headers is None


def test_empty_headers_disables_headers_column(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_OUTBOX_COLUMNS__HEADERS", "")
    cols = load_settings(overrides={"dsn": DSN}).column_names()
    assert cols.headers is None
    assert cols.payload == "payload"


def test_header_columns_from_toml_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = write_toml(tmp_path, f'dsn = "{DSN}"\n[columns.header_columns]\neventType = "event_type"'
                      '\n"x.tenant" = "tenant_id"\n')  # fmt: skip
    cols = load_settings(toml).column_names()
    assert cols.header_columns == (("eventType", "event_type"), ("x.tenant", "tenant_id"))
    debezium = load_settings(overrides={"dsn": DSN, "columns": {"preset": "debezium"}})
    assert debezium.column_names().header_columns == ()  # no preset sets any
    monkeypatch.setenv("CDC_OUTBOX_COLUMNS__HEADER_COLUMNS__REGION", "region")
    assert load_settings(overrides={"dsn": DSN}).column_names().header_columns == (
        ("region", "region"),
    )


@pytest.mark.parametrize(
    ("headers", "fragment"),
    [
        ({"id": "x"}, "header 'id' is empty or the relay's own"),
        ({"aggregate_type": "x"}, "header 'aggregate_type'"),
        ({"cdc_outbox.error": "x"}, "header 'cdc_outbox.error'"),
        ({"": "x"}, "header ''"),
        ({"h": "bad name"}, "columns.header_columns.h 'bad name' is not a valid identifier"),
    ],
)
def test_bad_header_columns_are_one_line(headers: dict[str, str], fragment: str) -> None:
    message = config_error(overrides={"dsn": DSN, "columns": {"header_columns": headers}})
    assert fragment in message


# -- validation messages -------------------------------------------------------------------


def test_unknown_toml_key_names_key_and_file(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, f'dsn = "{DSN}"\nslott_name = "x"\n')
    assert config_error(config_file=toml) == f"config: unknown key 'slott_name' (in {toml})"


def test_unknown_nested_toml_key(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, f'dsn = "{DSN}"\n[polling]\nbatch = 3\n')
    assert "unknown key 'polling.batch'" in config_error(config_file=toml)


def test_unknown_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_OUTBOX_SLOTT", "x")
    assert config_error(overrides={"dsn": DSN}) == "config: unknown setting CDC_OUTBOX_SLOTT"
    monkeypatch.delenv("CDC_OUTBOX_SLOTT")
    monkeypatch.setenv("CDC_OUTBOX_POLLING__BATCH", "1")
    assert "CDC_OUTBOX_POLLING__BATCH" in config_error(overrides={"dsn": DSN})


def test_allow_listed_env_vars_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_OUTBOX_CACHE_DIR", "/tmp/x")
    monkeypatch.setenv("CDC_OUTBOX_KAFKA_CDS", "0")
    monkeypatch.setenv("CDC_OUTBOX_PG_BINDIR", "/usr/lib/postgresql/15/bin")
    monkeypatch.setenv("CDC_OUTBOX_SANDBOX_DIR", "/tmp/y")
    monkeypatch.setenv("CDC_OUTBOX_KAFKA__CONFIG__SASL.MECHANISM", "PLAIN")
    s = load_settings(overrides={"dsn": DSN})
    assert s.kafka.config == {"sasl.mechanism": "PLAIN"}


def test_missing_dsn() -> None:
    assert config_error() == "config: dsn is required (set CDC_OUTBOX_DSN or --dsn)"


@pytest.mark.parametrize(
    "dsn",
    [
        "host=db port",
        "postgresql://app:pa55word@[::1/db",
        "host=db port=notaport password=pa55word",
    ],
)
def test_malformed_dsn_never_echoes_password(dsn: str) -> None:
    message = config_error(overrides={"dsn": dsn})
    assert message.startswith("config: dsn is malformed: ")
    assert "pa55word" not in message


def test_slot_name_rules() -> None:
    assert config_error(overrides={"dsn": DSN, "slot_name": "x;drop table"}) == (
        "config: slot_name 'x;drop table' is not a valid identifier "
        "(lowercase letters, digits, underscore; max 63)"
    )
    assert "slot_name" in config_error(overrides={"dsn": DSN, "slot_name": "Upper"})
    assert "slot_name" in config_error(overrides={"dsn": DSN, "slot_name": "s" * 64})
    assert "slot_name" in config_error(overrides={"dsn": DSN, "slot_name": "slot\n"})
    assert load_settings(overrides={"dsn": DSN, "slot_name": "s" * 63}).slot_name == "s" * 63


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("outbox_table", 'out"box'),
        ("outbox_schema", "1schema"),
        ("publication_name", "pub lication"),
        ("outbox_table", "t" * 64),
        ("outbox_table", "outbox\n"),  # a trailing newline is not part of a name
    ],
)
def test_identifier_rules(key: str, value: str) -> None:
    assert "is not a valid identifier" in config_error(overrides={"dsn": DSN, key: value})


def test_identifiers_allow_dollar_and_case() -> None:
    s = load_settings(overrides={"dsn": DSN, "outbox_table": "Out$box", "outbox_schema": "_s"})
    assert (s.outbox_schema, s.outbox_table) == ("_s", "Out$box")


def test_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_OUTBOX_STATUS_INTERVAL_S", "-1")
    assert config_error(overrides={"dsn": DSN}) == "config: status_interval_s must be > 0"
    monkeypatch.setenv("CDC_OUTBOX_STATUS_INTERVAL_S", "60")
    assert "status_interval_s must be < 60" in config_error(overrides={"dsn": DSN})
    monkeypatch.delenv("CDC_OUTBOX_STATUS_INTERVAL_S")
    monkeypatch.setenv("CDC_OUTBOX_POLLING__POLL_INTERVAL_S", "0")
    assert config_error(overrides={"dsn": DSN}) == "config: polling.poll_interval_s must be > 0"


def test_type_and_choice_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_OUTBOX_MAX_IN_FLIGHT", "lots")
    assert config_error(overrides={"dsn": DSN}) == "config: max_in_flight must be an integer"
    monkeypatch.delenv("CDC_OUTBOX_MAX_IN_FLIGHT")
    monkeypatch.setenv("CDC_OUTBOX_MODE", "magic")
    assert config_error(overrides={"dsn": DSN}) == "config: mode must be 'auto', 'cdc' or 'polling'"


def test_null_payload_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(overrides={"dsn": DSN}).null_payload == "dead_letter"
    monkeypatch.setenv("CDC_OUTBOX_NULL_PAYLOAD", "tombstone")
    assert load_settings(overrides={"dsn": DSN}).null_payload == "tombstone"
    monkeypatch.setenv("CDC_OUTBOX_NULL_PAYLOAD", "drop")
    message = config_error(overrides={"dsn": DSN})
    assert message == "config: null_payload must be 'dead_letter' or 'tombstone'"


def test_topic_template_fields() -> None:
    message = config_error(overrides={"dsn": DSN, "topic_template": "t.{tenant}"})
    assert "'tenant'" in message
    ok = load_settings(overrides={"dsn": DSN, "topic_template": "{aggregate_type}.{event_type}"})
    assert ok.topic_template == "{aggregate_type}.{event_type}"
    assert "legal Kafka topic" in config_error(overrides={"dsn": DSN, "topic_template": "a b"})
    assert "dead_letter_topic" in config_error(overrides={"dsn": DSN, "dead_letter_topic": "x/y"})


def test_bootstrap_servers_not_in_passthrough(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, f'dsn = "{DSN}"\n[kafka.config]\n"bootstrap.servers" = "x:1"\n')
    assert "kafka.bootstrap_servers" in config_error(config_file=toml)


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, "dsn = \n")
    assert f"{toml} is not valid TOML" in config_error(config_file=toml)
    missing = tmp_path / "nope.toml"
    assert config_error(config_file=missing) == f"config: file not found: {missing}"


# -- redaction -----------------------------------------------------------------------------

SECRET_DSNS = [
    "postgresql://app:pa55word@db.example:5432/shop",
    "host=db.example user=app password=pa55word dbname=shop",
    "host=db.example user=app password='pa55word' dbname=shop",
    "postgresql://app@db.example/shop?password=pa55word",
]


@pytest.mark.parametrize("dsn", SECRET_DSNS)
def test_dsn_password_redacted_everywhere(dsn: str) -> None:
    s = load_settings(overrides={"dsn": dsn})
    assert s.postgres_dsn() == dsn
    for text in (repr(s), str(s), str(s.redacted()), redact_dsn(dsn)):
        assert "pa55word" not in text
    assert "***" in s.redacted()["dsn"]
    assert "db.example" in s.redacted()["dsn"]
    assert s.secret_values() == ["pa55word"]


def test_redact_unparsable_dsn() -> None:
    assert "pa55word" not in redact_dsn("postgresql://app:pa55word@[::1/db")
    assert "pa55word" not in redact_dsn("host=x password=pa55word port")


def test_kafka_secrets_redacted(tmp_path: Path) -> None:
    toml = write_toml(
        tmp_path,
        f'dsn = "{DSN}"\n[kafka.config]\n"sasl.password" = "kafka-pw"\n'
        '"sasl.jaas.config" = "jaas-secret"\n"ssl.key.pem" = "PEMDATA"\n'
        '"sasl.oauthbearer.client.secret" = "oauth-secret"\n"sasl.username" = "alice"\n',
    )
    s = load_settings(toml)
    for text in (repr(s), str(s), str(s.redacted()), repr(s.kafka)):
        for secret in ("kafka-pw", "jaas-secret", "PEMDATA", "oauth-secret"):
            assert secret not in text
        assert "alice" in text
    assert s.kafka_config()["sasl.password"] == "kafka-pw"
    assert s.redacted()["kafka"]["config"]["sasl.password"] == "***"
    assert sorted(s.secret_values()) == ["PEMDATA", "jaas-secret", "kafka-pw", "oauth-secret"]


def test_settings_construct_directly() -> None:
    """Library users may build Settings without load_settings (no TOML then)."""
    s = Settings(dsn=SecretStr(DSN))
    assert s.postgres_dsn() == DSN


def test_delivery_setting_and_eos_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings(overrides={"dsn": DSN})
    assert s.delivery == "at_least_once"
    assert (s.eos.commit_interval_ms, s.eos.max_events) == (100, 10_000)
    assert s.eos.checkpoint_topic == "cdc_outbox.checkpoints"
    toml = write_toml(
        tmp_path, f'dsn = "{DSN}"\ndelivery = "exactly_once"\n[eos]\nmax_events = 50\n'
    )
    monkeypatch.setenv("CDC_OUTBOX_EOS__COMMIT_INTERVAL_MS", "250")
    s = load_settings(toml)
    assert (s.delivery, s.eos.max_events, s.eos.commit_interval_ms) == ("exactly_once", 50, 250)
    assert load_settings(toml, {"delivery": "at_least_once"}).delivery == "at_least_once"
    monkeypatch.setenv("CDC_OUTBOX_DELIVERY", "twice")
    message = config_error(overrides={"dsn": DSN})
    assert message == "config: delivery must be 'at_least_once' or 'exactly_once'"


def test_exactly_once_refuses_what_it_cannot_honour() -> None:
    eos = {"dsn": DSN, "delivery": "exactly_once"}
    assert "status columns" in config_error(overrides={**eos, "columns": {"preset": "debezium"}})
    assert "polling is at-least-once" in config_error(overrides={**eos, "mode": "polling"})
    assert "eos.checkpoint_topic" in config_error(
        overrides={**eos, "eos": {"checkpoint_topic": "bad topic"}}
    )


# -- several outbox tables ([[outboxes]]) ------------------------------------------------------


def test_the_single_table_keys_are_the_one_outbox() -> None:
    s = Settings.model_validate(
        {"dsn": "host=db", "outbox_schema": "billing", "columns": {"preset": "debezium"}}
    )
    (only,) = s.outbox_settings()
    assert (only.name, only.columns.preset, only.cdc_mark_published) == (
        "billing.outbox",
        "debezium",
        "off",
    )
    assert s.outbox() == only


def test_outboxes_list_each_with_its_own_layout(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        'dsn = "host=db"\non_permanent_error = "halt"\nmode = "cdc"\n'
        '[[outboxes]]\nschema = "billing"\ntopic_template = "billing.{aggregate_type}"\n'
        '[[outboxes]]\nschema = "shipping"\ntable = "events"\ncdc_mark_published = "delete"\n'
        '[outboxes.columns]\npreset = "debezium"\n'
    )
    s = load_settings(path)
    assert [o.name for o in s.outboxes] == ["billing.outbox", "shipping.events"]
    assert s.outboxes[1].columns.has_status is False
    assert outbox_mapper(s, s.outboxes[1]).table == "events"
    assert s.outbox("shipping.events") is s.outboxes[1]
    with pytest.raises(ConfigError, match=r"no outbox .x\.y. is configured"):
        s.outbox("x.y")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"outbox_table": "t"}, "replaces the single-table key"),
        ({}, "listed twice"),
    ],
)
def test_outboxes_refuses_ambiguity(extra: dict[str, object], message: str) -> None:
    entries = [{"table": "a"}] if extra else [{"table": "a"}, {"table": "a"}]
    with pytest.raises(ValueError, match=message):
        Settings.model_validate({"dsn": "host=db", "outboxes": entries, **extra})


def test_a_statusless_entry_makes_permanent_errors_halt_and_refuses_exactly_once() -> None:
    entries = [{"table": "a"}, {"table": "b", "columns": {"preset": "debezium"}}]
    s = Settings.model_validate({"dsn": "host=db", "mode": "cdc", "outboxes": entries})
    assert (s.on_permanent_error, s.outboxes[1].cdc_mark_published) == ("halt", "off")
    with pytest.raises(ValueError, match=r"public\.b"):
        Settings.model_validate(
            {"dsn": "host=db", "mode": "cdc", "outboxes": entries, "delivery": "exactly_once"}
        )
    with pytest.raises(ValueError, match=r'public\.b: cdc_mark_published = "update"'):
        Settings.model_validate(
            {
                "dsn": "host=db",
                "outboxes": [
                    {
                        "table": "b",
                        "cdc_mark_published": "update",
                        "columns": {"preset": "debezium"},
                    }
                ],
            }
        )


def test_the_single_table_entry_is_built_once_and_follows_a_copy() -> None:
    s = Settings.model_validate({"dsn": "host=db"})
    assert s.outbox() is s.outbox()  # validated once, not per call (catch-up rows ask it)
    other = s.model_copy(update={"outbox_table": "other"})
    debezium = s.model_copy(
        update={"columns": ColumnSettings.model_validate({"preset": "debezium"})}
    )
    assert (other.outbox().table, s.outbox().table, other.outbox().table) == (
        "other",
        "outbox",
        "other",
    )
    assert (debezium.outbox().cdc_mark_published, s.outbox().cdc_mark_published) == (
        "off",
        "update",
    )
