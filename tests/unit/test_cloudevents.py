"""CloudEvents Kafka binding, both ways (pure): the relay's mapping of an outbox row in binary
and structured mode, the consumer's reading of such records back into the same event fields,
and the settings that refuse combinations without a meaning."""

from __future__ import annotations

import json
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from cloudevents.core.bindings import kafka
from cloudevents.core.formats.json import JSONFormat
from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.config.settings import load_settings
from cdc_outbox.consumer.event_types import BadRecord
from cdc_outbox.consumer.events import event_of, json_value
from cdc_outbox.errors import ConfigError
from cdc_outbox.kafka.consumer import RawRecord
from cdc_outbox.mapping.build import outbox_mapper
from cdc_outbox.mapping.cloudevents import CloudEventsMapper, default_source
from cdc_outbox.mapping.rows import DEFAULT_COLUMNS, OutboxMapper
from cdc_outbox.pgwire.pgoutput import Relation, RelationColumn
from cdc_outbox.records import DeadLetter, OutboxRecord

EID = "00000000-0000-4000-8000-000000000007"
COLUMNS = ("id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "created_at")
REL = Relation(1, "public", "outbox", "d", tuple(RelationColumn(0, n, 25, -1) for n in COLUMNS))
CREATED = b"2026-12-02 21:28:04.123456+00"
SOURCE = "cdc-outbox/app/public.outbox"
DSN = {"dsn": "dbname=shop user=app"}


def mapper(mode: str, **kwargs: Any) -> CloudEventsMapper:
    return CloudEventsMapper(
        "public",
        "outbox",
        DEFAULT_COLUMNS,
        "t.{aggregate_type}",
        mode=mode,
        source=SOURCE,
        **kwargs,
    )


def row(payload: bytes | None = b'{"n": 1}', created: bytes | None = CREATED) -> tuple[Any, ...]:
    return (EID.encode(), b"order", b"o-42", b"OrderPaid", payload, b'{"x": "y"}', created)


def consumed(record: OutboxRecord) -> RawRecord:
    return RawRecord(record.topic, 0, 5, record.key, record.value, tuple(record.headers))


def test_binary_mode_adds_ce_headers_and_keeps_key_value_and_relay_headers() -> None:
    rec = mapper("binary").map_insert(REL, row())
    assert isinstance(rec, OutboxRecord)
    assert (rec.topic, rec.key, rec.value) == ("t.order", b"o-42", b'{"n": 1}')
    headers = dict(rec.headers)
    assert headers["ce_specversion"] == b"1.0"
    assert headers["ce_id"] == EID.encode()
    assert headers["ce_source"] == SOURCE.encode()
    assert headers["ce_type"] == b"OrderPaid"
    assert headers["ce_subject"] == b"o-42"
    assert headers["ce_time"] == b"2026-12-02T21:28:04.123456Z"
    assert headers["content-type"] == b"application/json"
    assert headers["id"] == EID.encode() and headers["x"] == b"y"


def test_structured_mode_puts_the_envelope_in_the_value() -> None:
    rec = mapper("structured").map_insert(REL, row())
    assert isinstance(rec, OutboxRecord)
    assert rec.key == b"o-42"
    headers = dict(rec.headers)
    assert headers["content-type"] == b"application/cloudevents+json"
    assert not any(name.startswith("ce_") for name in headers)
    envelope = json.loads(rec.value or b"")
    assert envelope == {
        "specversion": "1.0",
        "id": EID,
        "source": SOURCE,
        "type": "OrderPaid",
        "subject": "o-42",
        "time": "2026-12-02T21:28:04.123456Z",
        "datacontenttype": "application/json",
        "data": {"n": 1},
    }


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_the_consumer_reads_both_modes_into_the_plain_event_fields(mode: str) -> None:
    plain = OutboxMapper("public", "outbox", DEFAULT_COLUMNS, "t.{aggregate_type}")
    expected = event_of(consumed(plain.map_insert(REL, row())), json_value)  # type: ignore[arg-type]
    rec = mapper(mode).map_insert(REL, row())
    assert isinstance(rec, OutboxRecord)
    got = event_of(consumed(rec), json_value)
    assert (got.event_id, got.event_type, got.aggregate_type, got.aggregate_id, got.payload) == (
        expected.event_id,
        expected.event_type,
        expected.aggregate_type,
        expected.aggregate_id,
        expected.payload,
    )
    assert got.event_id == uuid.UUID(EID) and got.payload == {"n": 1}


def test_the_consumer_reads_cloudevents_of_other_producers_by_their_attributes() -> None:
    """No relay headers: id, type and aggregate (the subject, without a key) come from the
    CloudEvent itself."""
    from cloudevents.core.v1.event import CloudEvent

    event = CloudEvent({"id": EID, "source": "/x", "type": "T", "subject": "a-1"}, {"k": [1]})
    for message in (
        kafka.to_binary(event, JSONFormat()),
        kafka.to_structured(event, JSONFormat()),
    ):
        raw = RawRecord("t", 0, 1, None, message.value, tuple(message.headers.items()))
        got = event_of(raw, json_value)
        assert (got.event_id, got.event_type, got.aggregate_id, got.payload) == (
            uuid.UUID(EID),
            "T",
            "a-1",
            {"k": [1]},
        )


def test_invalid_cloudevents_records_are_bad_records() -> None:
    ct = ("content-type", b"application/cloudevents+json")
    for value, headers in (
        (b"not json", (ct,)),
        (b'{"specversion": "1.0", "id": "x", "source": "/s", "type": "T"}', (ct,)),
        (b"{}", (("ce_specversion", b"1.0"),)),  # no id, source, type
        (b"{}", (("ce_id", b"7"), ("ce_source", b"/s"), ("ce_type", b"T"))),  # id not a UUID
    ):
        with pytest.raises(BadRecord):
            event_of(RawRecord("t", 0, 1, b"k", value, headers), json_value)


def test_without_created_at_time_is_the_mapping_moment_and_tombstones_stay_tombstones() -> None:
    before = datetime.now(UTC)
    rec = mapper("binary", tombstones=True).map_insert(REL, row(payload=None, created=None))
    assert isinstance(rec, OutboxRecord) and rec.value is None
    time = datetime.fromisoformat(dict(rec.headers)["ce_time"].decode())
    assert before <= time <= datetime.now(UTC)


def test_structured_mode_dead_letters_a_payload_that_is_not_json() -> None:
    out = mapper("structured").map_insert(REL, row(payload=b"plain text"))
    assert isinstance(out, DeadLetter)
    assert "structured mode needs a JSON payload" in out.reason
    assert out.key == b"o-42" and out.value == b"plain text"


def test_map_row_polling_and_catch_up_get_the_same_envelope() -> None:
    rec = mapper("structured").map_row([EID, "order", "o-42", "OrderPaid", '[1, "a"]', None])
    assert isinstance(rec, OutboxRecord)
    assert json.loads(rec.value or b"")["data"] == [1, "a"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(payload=json_values, aggregate=st.text(min_size=1).filter(lambda s: "\x00" not in s))
def test_any_json_payload_round_trips_in_both_modes(payload: Any, aggregate: str) -> None:
    values = [EID, "order", aggregate, "E", json.dumps(payload), None]
    for mode in ("binary", "structured"):
        rec = mapper(mode).map_row(values)
        assert isinstance(rec, OutboxRecord)
        got = event_of(consumed(rec), json_value)
        assert (got.event_id, got.aggregate_id, got.payload) == (uuid.UUID(EID), aggregate, payload)


def test_settings_build_the_cloudevents_mapper_with_a_default_source() -> None:
    s = load_settings(overrides={"cloudevents": "binary", **DSN})
    m = outbox_mapper(s)
    assert isinstance(m, CloudEventsMapper)
    assert m._source == "cdc-outbox/shop/public.outbox"
    assert default_source(None, "s", "t") == "cdc-outbox/s.t"
    custom = load_settings(
        overrides={"cloudevents": "structured", "cloudevents_source": "/x", **DSN}
    )
    assert outbox_mapper(custom)._source == "/x"  # type: ignore[attr-defined]
    assert type(outbox_mapper(load_settings(overrides=DSN))) is OutboxMapper


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"cloudevents": "sometimes"}, "cloudevents"),
        (
            {
                "cloudevents": "structured",
                "value_format": "avro",
                "schema_registry": {"url": "http://r"},
            },
            'cannot be value_format = "avro"',
        ),
        ({"cloudevents": "structured", "null_payload": "tombstone"}, "never publishes a null"),
    ],
)
def test_settings_refuse_bad_values_and_meaningless_combinations(
    overrides: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(overrides={**overrides, **DSN})
    message = str(info.value)
    assert "\n" not in message and message.startswith("config: ") and needle in message


def test_the_env_var_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_OUTBOX_CLOUDEVENTS", "structured")
    assert load_settings(overrides=DSN).cloudevents == "structured"
    monkeypatch.setenv("CDC_OUTBOX_CLOUDEVENTS", "bogus")
    with pytest.raises(ConfigError, match="cloudevents"):
        load_settings(overrides=DSN)


def test_without_the_sdk_the_setting_is_refused_and_plain_records_still_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The extra is optional: the core imports no cloudevents module until it is used."""
    for name in [m for m in sys.modules if m == "cloudevents" or m.startswith("cloudevents.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cloudevents", None)  # what an absent package looks like
    with pytest.raises(ConfigError, match=r"pip install 'cdc-outbox\[cloudevents\]'"):
        load_settings(overrides={"cloudevents": "binary", **DSN})
    plain = outbox_mapper(load_settings(overrides=DSN)).map_insert(REL, row())
    assert isinstance(plain, OutboxRecord)
    assert event_of(consumed(plain), json_value).payload == {"n": 1}
    ce = RawRecord("t", 0, 1, b"k", b"{}", (("ce_id", EID.encode()),))
    with pytest.raises(ConfigError, match="cloudevents SDK is not installed"):
        event_of(ce, json_value)
