"""Pure parts of the idempotent consumer: settings, subscription, backoff, handler loading,
record -> event, and the rule that only the kafka package imports confluent_kafka."""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from pathlib import Path

import pytest

from cdc_outbox.config.backoff import doubling
from cdc_outbox.config.settings import Settings
from cdc_outbox.consumer.event_types import BadRecord, Event, make_event
from cdc_outbox.consumer.events import decoder_for, event_of, json_value
from cdc_outbox.consumer.settings import (
    ConsumerSettings,
    load_handler,
    topics_from_template,
)
from cdc_outbox.errors import ConfigError
from cdc_outbox.kafka.consumer import RawRecord

PACKAGE = Path(__file__).resolve().parents[2] / "cdc_outbox"
NOOP = "tests.support.consumer_handlers:noop"


def _record(**kw: object) -> RawRecord:
    values: dict[str, object] = {
        "topic": "outbox.event.order", "partition": 1, "offset": 7, "key": b"o-1",
        "value": b'{"total": 5}',
        "headers": (("id", str(uuid.UUID(int=1)).encode()), ("event_type", b"Created"),
                    ("aggregate_type", b"order")),
    }  # fmt: skip
    values.update(kw)
    return RawRecord(**values)  # type: ignore[arg-type]


def test_subscription_matches_every_topic_of_the_template() -> None:
    (pattern,) = topics_from_template("outbox.event.{aggregate_type}")
    assert pattern == r"^outbox\.event\.[A-Za-z0-9._-]+$"
    assert re.match(pattern, "outbox.event.order")
    assert not re.match(pattern, "outbox.eventXorder")
    assert not re.match(pattern, "cdc_outbox.dead_letter")
    (two,) = topics_from_template("app.{aggregate_type}.{event_type}.v1")
    assert re.match(two, "app.order.Created.v1") and not re.match(two, "app.order.v1")
    assert topics_from_template("all-events") == ("all-events",)
    with pytest.raises(ConfigError, match="no constant prefix"):
        topics_from_template("{aggregate_type}")


def test_settings_default_from_the_relay_and_flags_win() -> None:
    relay = Settings(
        dsn="host=db", topic_template="shop.{aggregate_type}",
        kafka={"bootstrap_servers": "k:9092", "config": {"client.id": "x"}},
    )  # fmt: skip
    extra = {"fetch.min.bytes": "1"}
    s = ConsumerSettings.from_relay(relay, group_id="billing", kafka_config=extra)
    assert (s.group_id, s.consumer_name, s.bootstrap_servers) == ("billing", "billing", "k:9092")
    assert s.topics == (r"^shop\.[A-Za-z0-9._-]+$",)
    assert s.kafka_consumer_config() == {
        "bootstrap.servers": "k:9092", "client.id": "x", "fetch.min.bytes": "1",
    }  # fmt: skip
    assert ConsumerSettings.from_relay(relay, consumer_name="n", topics=("t",)).topics == ("t",)
    with pytest.raises(ConfigError, match="consumer group"):
        ConsumerSettings.from_relay(relay)
    with pytest.raises(ConfigError, match=r"^consumer: dead_letter_topic: .*legal Kafka topic"):
        ConsumerSettings.from_relay(relay, group_id="g", dead_letter_topic="bad topic")
    with pytest.raises(ConfigError, match=r"^consumer: max_attempts"):
        ConsumerSettings.from_relay(relay, group_id="g", max_attempts=0)
    assert s.value_format == "json"
    with pytest.raises(ConfigError, match=r"value_format 'avro' needs schema_registry\.url"):
        ConsumerSettings.from_relay(relay, group_id="g", value_format="avro")


def test_avro_settings_come_from_the_relay() -> None:
    relay = Settings(
        dsn="host=db", value_format="avro",
        schema_registry={"url": "http://sr:8080/apis/ccompat/v7", "basic_auth_user_info": "u:pw",
                         "timeout_s": 2},
    )  # fmt: skip
    s = ConsumerSettings.from_relay(relay, group_id="g")
    assert s.value_format == "avro"
    assert s.schema_registry.url == "http://sr:8080/apis/ccompat/v7"
    assert s.schema_registry.basic_auth_user_info.get_secret_value() == "u:pw"
    assert "pw" not in repr(s)
    assert ConsumerSettings.from_relay(relay, group_id="g", value_format="json").value_format == (
        "json"
    )


def test_avro_decoder_bad_bytes_dead_letter_unreachable_registry_retries() -> None:
    """A value that is not the wire format is a BadRecord without asking the registry; an id
    that needs a registry nobody listens on is DecodeUnavailable (retry), not a BadRecord."""
    from cdc_outbox.config.models import SchemaRegistrySettings
    from cdc_outbox.consumer.event_types import DecodeUnavailable
    from cdc_outbox_dev.sandbox._proc import free_port

    registry = SchemaRegistrySettings(url=f"http://127.0.0.1:{free_port()}", timeout_s=1)
    decode = decoder_for("avro", registry)
    assert decode(_record(value=None)) is None
    with pytest.raises(BadRecord, match="value is not Avro: not Confluent wire format"):
        decode(_record(value=b'{"total": 5}'))
    with pytest.raises(DecodeUnavailable, match="schema id 7: schema registry unreachable"):
        decode(_record(value=b"\x00\x00\x00\x00\x07\x02"))


def test_backoff_doubles_and_is_capped() -> None:
    assert [doubling(n, 0.2, 1.0) for n in range(1, 6)] == [0.2, 0.4, 0.8, 1.0, 1.0]


def test_handler_loading_errors_are_one_line() -> None:
    assert load_handler("tests.support.consumer_handlers:noop").__name__ == "noop"
    for spec, fragment in [
        ("no_colon", "must look like"),
        ("tests.nope_missing:f", "cannot import"),
        ("tests.support.consumer_handlers:missing", "has no attribute"),
        ("tests.support.consumer:EVENTS_NOT_THERE", "has no attribute"),
        ("tests.support.consumer:APPLIED_DDL", "not callable"),
    ]:
        with pytest.raises(ConfigError, match=fragment):
            load_handler(spec)


def test_record_to_event() -> None:
    event = event_of(_record(), json_value)
    assert event.event_id == uuid.UUID(int=1)
    names = (event.aggregate_type, event.aggregate_id, event.event_type)
    assert names == ("order", "o-1", "Created")
    assert event.payload == {"total": 5}
    assert (event.topic, event.partition, event.offset) == ("outbox.event.order", 1, 7)
    assert event_of(_record(value=None), json_value).payload is None  # a tombstone
    with pytest.raises(BadRecord, match="no 'id' header"):
        event_of(_record(headers=()), json_value)
    with pytest.raises(BadRecord, match="not a UUID"):
        event_of(_record(headers=(("id", b"42"),)), json_value)
    with pytest.raises(BadRecord, match="not JSON"):
        event_of(_record(value=b"\x00avro"), json_value)
    assert decoder_for("json") is json_value
    with pytest.raises(ConfigError, match=r"value_format 'avro' needs schema_registry\.url"):
        decoder_for("avro")
    with pytest.raises(ConfigError, match="value_format 'xml' is not supported"):
        decoder_for("xml")
    json.dumps(event.payload)


def test_make_event_is_the_frozen_event() -> None:
    fields = (uuid.UUID(int=2), "order", "o-1", "Created", {"a": 1}, {"id": b"x"}, "t", 0, 9)
    made = make_event(*fields)
    assert type(made) is Event and made == Event(*fields) and repr(made) == repr(Event(*fields))
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.offset = 10  # type: ignore[misc]
    assert event_of(_record(), json_value) == Event(
        uuid.UUID(int=1), "order", "o-1", "Created", {"total": 5},
        dict(_record().headers), "outbox.event.order", 1, 7,
    )  # fmt: skip


def test_consume_command_bad_input_is_one_line_and_exit_2() -> None:
    from tests.support.helpers import run_cli

    for args, fragment in [
        (("--handler", "tests.support.consumer_handlers:missing"), "has no attribute 'missing'"),
        (("--handler", "tests.support.consumer_handlers:noop", "--kafka-config", "novalue"),
         "must look like KEY=VALUE"),
        (("--handler", NOOP, "--group", "g", "--max-attempts", "0"),
         "consumer: max_attempts"),
        (("--handler", NOOP, "--group", "g", "--value-format", "avro"),
         "consumer: value_format 'avro' needs schema_registry.url"),
    ]:  # fmt: skip
        out = run_cli("consume", *args, dsn="host=127.0.0.1 port=1 password=s3cret")
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("cdc-outbox: error: "), out.stderr
        assert fragment in lines[0]
        assert "s3cret" not in out.stderr
