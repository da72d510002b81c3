"""Avro pure cores: the wire format, the JSON -> Avro encoding checks, subject names, the
delivery policy for encoding failures, the ``[schema_registry]`` settings and schemas_dir."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from fastavro import schemaless_reader, schemaless_writer
from fastavro.validation import validate
from hypothesis import example, given
from hypothesis import strategies as st

from cdc_outbox.avro import wire
from cdc_outbox.avro.precheck import compile_check
from cdc_outbox.avro.serializer import _avro_string, load_schemas_dir
from cdc_outbox.avro.wire import (
    AvroEncodeError,
    decode,
    encode_json,
    frame,
    header,
    parse,
    record_names,
    subject_name,
    unframe,
)
from cdc_outbox.config.settings import load_settings
from cdc_outbox.delivery.policy import FailureAction, on_encode_failure
from cdc_outbox.errors import ConfigError
from tests.support.helpers import RecordingHandle

SCHEMA = parse(
    json.dumps(
        {
            "type": "record",
            "name": "shop.Paid",
            "fields": [
                {"name": "amount", "type": "long"},
                {"name": "note", "type": ["null", "string"], "default": None},
                {
                    "name": "item",
                    "type": {
                        "type": "record",
                        "name": "Item",
                        "fields": [{"name": "sku", "type": "string"}],
                    },
                },
            ],
        }
    )
)


def test_wire_format_round_trip() -> None:
    body = encode_json(SCHEMA, b'{"amount": 5, "note": "n", "item": {"sku": "a"}}')
    framed = frame(258, body)
    assert framed[:5] == b"\x00\x00\x00\x01\x02"  # magic 0, id 258 big-endian
    assert unframe(framed) == (258, body)
    assert decode(framed, {258: SCHEMA}.__getitem__) == {
        "amount": 5,
        "note": "n",
        "item": {"sku": "a"},
    }


def test_default_fields_may_be_omitted() -> None:
    framed = frame(1, encode_json(SCHEMA, b'{"amount": 1, "item": {"sku": "a"}}'))
    assert decode(framed, lambda _: SCHEMA)["note"] is None


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"amount": "ten", "item": {"sku": "a"}}', "shop.Paid.amount is <ten>"),
        (b'{"amount": 1.5, "item": {"sku": "a"}}', "expected long"),
        (b'{"amount": true, "item": {"sku": "a"}}', "expected long"),
        (b'{"amount": 1, "item": {"sku": 7}}', "shop.Item.sku is <7>"),
        (b'{"amount": 1, "extra": 2, "item": {"sku": "a"}}', "has no field extra"),
        (b'{"item": {"sku": "a"}}', "field amount is missing"),
        (b"[1, 2]", "JSON list"),
        (b"{not json", "not valid JSON"),
    ],
)
def test_mismatches_are_refused_with_fastavros_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(AvroEncodeError, match=r"^avro: ") as err:
        encode_json(SCHEMA, payload)
    assert reason in str(err.value)


@given(st.integers(-(2**63), 2**63 - 1), st.text(max_size=50))
def test_any_valid_payload_round_trips(amount: int, sku: str) -> None:
    payload = json.dumps({"amount": amount, "note": None, "item": {"sku": sku}}).encode()
    assert decode(frame(9, encode_json(SCHEMA, payload)), lambda _: SCHEMA) == json.loads(payload)


DOUBLE = parse('{"type": "record", "name": "D", "fields": [{"name": "x", "type": "double"}]}')


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"x": NaN}', math.nan),  # msgspec refuses these three; the stdlib reads them
        (b'{"x": 1e400}', math.inf),
        (b'{"x": -Infinity}', -math.inf),
        (b'{"x": 123456789012345678901234567890}', 1.2345678901234568e29),  # beyond 64 bits
        (b'{"x": 2}', 2.0),
    ],
)
def test_what_msgspec_refuses_or_widens_encodes_as_with_the_stdlib(
    payload: bytes, expected: float
) -> None:
    got = decode(frame(1, encode_json(DOUBLE, payload)), lambda _: DOUBLE)["x"]
    assert got == expected or (math.isnan(got) and math.isnan(expected))


def test_an_integer_beyond_64_bits_is_no_long_and_a_lone_surrogate_no_string() -> None:
    with pytest.raises(AvroEncodeError, match="amount"):
        encode_json(SCHEMA, b'{"amount": 123456789012345678901234567890, "item": {"sku": "a"}}')
    with pytest.raises(AvroEncodeError, match=r"^avro: "):
        encode_json(SCHEMA, b'{"amount": 1, "item": {"sku": "\\ud800"}}')


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@given(_JSON)
def test_payloads_parse_as_the_stdlib_parses_them(value: object) -> None:
    text = json.dumps(value).encode()
    assert repr(wire._json(text)) == repr(json.loads(text))  # same types too (1 is not 1.0)


def test_integers_beyond_64_bits_stay_integers() -> None:
    assert repr(wire._json(b"[18446744073709551616, -9223372036854775809]")) == repr(
        [18446744073709551616, -9223372036854775809]
    )


def test_the_header_goes_in_front_of_the_body() -> None:
    payload = b'{"amount": 5, "item": {"sku": "a"}}'
    assert encode_json(SCHEMA, payload, header(258)) == frame(258, encode_json(SCHEMA, payload))


def test_unframe_refuses_other_bytes() -> None:
    with pytest.raises(ValueError, match="wire format"):
        unframe(b"{}")


def test_subject_names_and_record_names() -> None:
    assert subject_name("topic", "t", "a.B") == "t-value"
    assert subject_name("record", "t", "a.B") == "a.B-value"
    assert subject_name("topic_record", "t", "a.B", "key") == "t-a.B-key"
    assert record_names(SCHEMA) == {"shop.Paid", "Paid"}


def test_avro_string_key_is_readable() -> None:
    for key in (b"", b"order-1", "é".encode() * 100):
        assert schemaless_reader(io.BytesIO(_avro_string(key)), "string", None) == key.decode()


def test_policy_outage_retries_mismatch_dead_letters() -> None:
    assert on_encode_failure("unavailable", False) is FailureAction.RETRY
    assert on_encode_failure("unavailable", True) is FailureAction.RETRY
    assert on_encode_failure("invalid", False) is FailureAction.DEAD_LETTER
    assert on_encode_failure("invalid", True) is FailureAction.HALT


def test_schema_registry_settings_env_and_redaction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_OUTBOX_DSN", "host=db")
    monkeypatch.setenv("CDC_OUTBOX_VALUE_FORMAT", "avro")
    monkeypatch.setenv("CDC_OUTBOX_SCHEMA_REGISTRY__URL", "http://reg:8080/apis/ccompat/v7/")
    monkeypatch.setenv("CDC_OUTBOX_SCHEMA_REGISTRY__BASIC_AUTH_USER_INFO", "bob:s3cr3tpw")
    monkeypatch.setenv("CDC_OUTBOX_SCHEMA_REGISTRY__SUBJECT_NAME_STRATEGY", "topic_record")
    s = load_settings()
    assert s.schema_registry.url == "http://reg:8080/apis/ccompat/v7"
    assert s.schema_registry.subject_name_strategy == "topic_record"
    assert s.schema_registry.basic_auth_user_info.get_secret_value() == "bob:s3cr3tpw"
    for text in (repr(s), str(s), str(s.redacted())):
        assert "s3cr3tpw" not in text
    assert s.redacted()["schema_registry"]["basic_auth_user_info"] == "***"
    assert "s3cr3tpw" in s.secret_values()


def test_avro_needs_a_registry_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_OUTBOX_DSN", "host=db")
    monkeypatch.setenv("CDC_OUTBOX_VALUE_FORMAT", "avro")
    with pytest.raises(ConfigError, match=r"needs schema_registry\.url"):
        load_settings()
    monkeypatch.setenv("CDC_OUTBOX_SCHEMA_REGISTRY__SUBJECT_NAME_STRATEGY", "nope")
    with pytest.raises(ConfigError, match=r"subject_name_strategy must be"):
        load_settings()


def test_schemas_dir(tmp_path: Path) -> None:
    (tmp_path / "a.avsc").write_text(
        json.dumps({"type": "record", "name": "x.Paid", "fields": [{"name": "a", "type": "int"}]})
    )
    found = load_schemas_dir(str(tmp_path))
    assert set(found) == {"x.Paid", "Paid"} and found["Paid"].name == "x.Paid"
    (tmp_path / "b.avsc").write_text('"string"')
    with pytest.raises(ConfigError, match="one Avro record schema"):
        load_schemas_dir(str(tmp_path))
    (tmp_path / "b.avsc").write_text("{")
    with pytest.raises(ConfigError, match="not a valid Avro schema"):
        load_schemas_dir(str(tmp_path))


def test_unreachable_registry_is_a_retry_and_nothing_overtakes_it() -> None:
    """Delivery with a registry nobody listens on (and a producer that never connects):
    the event is retried (restart), not dead-lettered; later events are not produced."""
    from cdc_outbox.config.delivery import delivery_section
    from cdc_outbox.config.settings import Settings
    from cdc_outbox.delivery.engine import Delivery
    from cdc_outbox.records import OutboxRecord
    from cdc_outbox.telemetry.relay_stats import RelayStats
    from cdc_outbox_dev.sandbox._proc import free_port

    settings = Settings.model_validate(
        {
            "dsn": "host=127.0.0.1",
            "value_format": "avro",
            "schema_registry": {"url": f"http://127.0.0.1:{free_port()}", "timeout_s": 1},
            "kafka": {"bootstrap_servers": "127.0.0.1:9"},
        }
    )
    delivery = Delivery(delivery_section(settings), RelayStats())
    try:
        headers = [("id", b"1"), ("event_type", b"Paid"), ("aggregate_type", b"order")]
        first, later = RecordingHandle(), RecordingHandle()
        delivery.submit(OutboxRecord("t", b"k", b'{"amount": 1}', headers, "1"), first)
        assert first.outcomes and first.outcomes[0].startswith("retry: no cached schema for Paid")
        assert delivery.restart_reason is not None and "unreachable" in delivery.restart_reason
        delivery.submit(OutboxRecord("t", b"k", b'{"amount": 2}', headers, "2"), later)
        assert later.outcomes == [f"retry: {delivery.restart_reason}"]
        # a later event of a type that needs no registry (a tombstone) is held back too
        tomb = RecordingHandle()
        delivery.submit(OutboxRecord("t", b"k", None, headers, "3"), tomb)
        assert tomb.outcomes == [f"retry: {delivery.restart_reason}"]
        assert len(delivery.keys) == 0 and not delivery.to_mark  # nothing produced, none dead
        delivery.service()  # pending dead letters would be produced here
        assert later.outcomes == [f"retry: {delivery.restart_reason}"] and not delivery.to_mark
    finally:
        delivery.close(0)


_PRECHECK_SCHEMAS = [
    SCHEMA,
    parse('"int"'),
    parse('["null", "boolean", "double"]'),
    parse('{"type": "enum", "name": "E", "symbols": ["A", "B"]}'),
    parse(
        '{"type": "record", "name": "R", "fields": [{"name": "i", "type": "int", "default": 0},'
        ' {"name": "s", "type": ["null", "string"]}, {"name": "l", "type": "long"}]}'
    ),
    parse(
        json.dumps(
            {
                "type": "record",
                "name": "T",
                "fields": [
                    {"name": "i", "type": "int"},
                    {"name": "l", "type": "long", "default": 7},
                    {"name": "s", "type": ["null", "long", "boolean"], "default": None},
                    {"name": "x", "type": ["double", "string"]},
                    {"name": "item", "type": "boolean"},
                    {"name": "sku", "type": "double", "default": 0.5},
                    {"name": "amount", "type": "null"},
                    {
                        "name": "note",
                        "type": {
                            "type": "record",
                            "name": "N",
                            "fields": [
                                {"name": "l", "type": "long"},
                                {"name": "s", "type": ["null", "string"]},
                            ],
                        },
                    },
                ],
            }
        )
    ),
]
_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.sampled_from(["A", "C", "", "-type"])
    | st.text(max_size=5),
    lambda inner: st.dictionaries(
        st.sampled_from(["amount", "note", "item", "sku", "i", "s", "l", "-type", "x"]),
        inner,
        max_size=4,
    ),
    max_leaves=8,
)


def _writer_refuses(datum: object, schema: object) -> bool:
    """The relay's writer (``wire._write``: fastavro's) raises for ``datum``."""
    try:
        wire._write(b"", schema, {}, datum)
    except Exception:
        return True
    return False


@given(st.sampled_from(range(len(_PRECHECK_SCHEMAS))), _json_values)
@example(4, {"l": 0, "s": None, "-type": None})  # validate refuses a "-type" not the name
@example(
    5, {"i": 1, "x": 1.0, "item": True, "amount": None, "note": {"l": 1, "s": None, "-type": "M"}}
)
def test_precheck_is_sound(which: int, datum: object) -> None:
    """Whatever the compiled pre-check accepts, fastavro's validate accepts too, or else
    fastavro's writer refuses it (nothing invalid is ever written)."""
    schema = _PRECHECK_SCHEMAS[which]
    check = compile_check(schema)
    assert check is not None
    if check(datum):
        assert validate(datum, schema, raise_errors=False) or _writer_refuses(datum, schema), datum


@given(st.sampled_from(range(len(_PRECHECK_SCHEMAS))), _json_values)
def test_encode_writes_what_schemaless_writer_writes_and_refuses_what_validate_refuses(
    which: int, datum: object
) -> None:
    schema = _PRECHECK_SCHEMAS[which]
    try:
        got: bytes | None = encode_json(schema, json.dumps(datum).encode(), b"h")
    except AvroEncodeError:
        got = None
    if not validate(datum, schema, raise_errors=False):
        assert got is None, datum
    elif got is not None:  # a top-level record also refuses fields the schema does not have
        out = io.BytesIO()
        schemaless_writer(out, schema, datum)
        assert got == b"h" + out.getvalue()


def test_the_writer_is_fastavros_write_data_unless_it_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the fastavro this project pins, the relay calls its Cython ``write_data``
    directly; a fastavro without it (or with another signature) gets ``schemaless_writer``."""
    assert wire._write is not wire._schemaless
    assert wire._write_data is not None
    import fastavro._write

    monkeypatch.delattr(fastavro._write, "write_data")
    assert wire._pick_writer() == (wire._schemaless, None)
    monkeypatch.setattr(fastavro._write, "write_data", lambda *args: None, raising=False)
    assert wire._pick_writer() == (wire._schemaless, None)  # writes nothing: the probe sees it


def test_named_types_referenced_by_name_are_written() -> None:
    schema = parse(
        json.dumps(
            {
                "type": "record",
                "name": "ns.R",
                "fields": [
                    {
                        "name": "a",
                        "type": {
                            "type": "record",
                            "name": "P",
                            "fields": [{"name": "x", "type": "long"}],
                        },
                    },
                    {"name": "b", "type": "P"},
                    {"name": "c", "type": ["null", "P"]},
                ],
            }
        )
    )
    datum = {"a": {"x": 1}, "b": {"x": 2}, "c": {"x": 3}}
    out = io.BytesIO()
    schemaless_writer(out, schema, datum)
    assert encode_json(schema, json.dumps(datum).encode()) == out.getvalue()


def test_an_absent_union_field_without_default_is_refused_not_written_as_null() -> None:
    schema = _PRECHECK_SCHEMAS[4]  # "s": ["null", "string"], no default
    assert _writer_refuses({"l": 1}, schema) is False  # fastavro's writer would write a null
    with pytest.raises(AvroEncodeError, match=r"record R field s is missing"):
        encode_json(schema, b'{"l": 1}')
    assert encode_json(schema, b'{"l": 1, "s": null}') == encode_json(
        schema, b'{"l": 1, "s": null, "i": 0}'
    )


def test_string_fields_are_left_to_the_writer_which_refuses_anything_else() -> None:
    check = compile_check(SCHEMA)
    assert check is not None
    for item in ({}, {"sku": 7}, {"sku": None}, {"sku": ["a"]}):
        datum = {"amount": 0, "item": item}
        assert check(datum) and not validate(datum, SCHEMA, raise_errors=False)
        assert _writer_refuses(datum, SCHEMA)
        with pytest.raises(AvroEncodeError, match=r"shop\.Item\.sku"):  # validate's reason
            encode_json(SCHEMA, json.dumps(datum).encode())


def test_precheck_passes_the_common_case_and_defers_the_rest() -> None:
    check = compile_check(SCHEMA)
    assert check is not None
    assert check({"amount": 5, "item": {"sku": "a"}})  # "note" absent: its default
    assert not check({"amount": True, "item": {"sku": "a"}})  # unsure: fastavro decides
    assert not check({"amount": 1.0, "item": {"sku": "a"}})
    # A long out of range passes: fastavro's writer refuses it, its validate gives the reason.
    assert check({"amount": 2**63, "item": {"sku": "a"}})
    with pytest.raises(AvroEncodeError, match=r"shop\.Paid\.amount is <9223372036854775808>"):
        encode_json(SCHEMA, json.dumps({"amount": 2**63, "item": {"sku": "a"}}).encode())
    assert compile_check(parse('{"type": "array", "items": "int"}')) is None
    assert compile_check(parse('{"type": "long", "logicalType": "timestamp-millis"}')) is None
