"""The field-by-field write of a top-level record (``wire._write_fields`` with
``precheck.field_checks``): what it writes is what ``schemaless_writer`` writes, it writes
nothing fastavro's ``validate`` refuses, and it takes every valid record itself."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from fastavro import schemaless_writer
from fastavro.validation import validate
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_outbox.avro import wire
from cdc_outbox.avro.precheck import MISSING, field_checks
from cdc_outbox.avro.wire import AvroEncodeError, JsonToAvro, parse

RECORD = parse(
    json.dumps(
        {
            "type": "record",
            "name": "ns.Event",
            "fields": [
                {"name": "l", "type": "long"},
                {"name": "i", "type": "int", "default": 3},
                {"name": "u", "type": ["null", "string"]},
                {
                    "name": "e",
                    "type": {"type": "enum", "name": "Color", "symbols": ["RED", "BLUE"]},
                },
                {"name": "b", "type": "boolean", "default": False},
                {"name": "d", "type": "double"},
                {"name": "n", "type": "null", "default": None},
                {
                    "name": "inner",
                    "type": {
                        "type": "record",
                        "name": "Inner",
                        "fields": [
                            {"name": "x", "type": "long"},
                            {"name": "s", "type": ["null", "string"]},
                        ],
                    },
                },
                {"name": "again", "type": ["null", "Inner"], "default": None},
                {"name": "text", "type": "string"},
            ],
        }
    )
)
NAMES = frozenset(f["name"] for f in RECORD["fields"])

_any = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.sampled_from(["RED", "GREEN", ""])
    | st.text(max_size=3)
)
_valid_inner = st.fixed_dictionaries(
    {"x": st.integers(-(2**63), 2**63 - 1), "s": st.none() | st.text(max_size=3)}
)
_inner = _valid_inner | st.dictionaries(st.sampled_from(["x", "s", "z"]), _any, max_size=3) | _any


def _field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, valid, valid, _any)  # mostly valid: whole records often are


_records = st.fixed_dictionaries(
    {},
    optional={
        "l": _field(st.integers(-(2**63), 2**63 - 1)),
        "i": _field(st.integers(-(2**31), 2**31 - 1)),
        "u": _field(st.none() | st.text(max_size=3)),
        "e": _field(st.sampled_from(["RED", "BLUE"])),
        "b": _field(st.booleans()),
        "d": _field(st.floats(allow_nan=False) | st.integers(-(2**53), 2**53)),
        "n": _field(st.none()),
        "inner": _field(_inner),
        "again": _field(st.none() | _valid_inner),
        "text": _field(st.text(max_size=3)),
        "unknown": _any,
    },
)


def _fields() -> Any:
    fields = field_checks(RECORD)
    assert fields is not None
    return fields


def _named() -> dict[str, Any]:
    return JsonToAvro(RECORD)._named


def _reference(datum: Any) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, RECORD, datum)
    return out.getvalue()


@settings(max_examples=400)
@given(_records)
def test_written_only_if_valid_and_then_as_schemaless_writer_writes(datum: dict[str, Any]) -> None:
    got = wire._write_fields(b"h", _fields(), _named(), datum)
    valid = validate(datum, RECORD, raise_errors=False)
    if got is not None:
        assert valid, datum
        assert got == b"h" + _reference(datum)
    elif valid and NAMES.issuperset(datum) and all(f["name"] in datum for f in _required()):
        pytest.fail(f"a valid record left to the slow path: {datum!r}")


def _required() -> list[dict[str, Any]]:
    return [f for f in RECORD["fields"] if "default" not in f]


@settings(max_examples=200)
@given(_records)
def test_encode_takes_the_field_path_for_valid_records_and_refuses_the_rest(
    datum: dict[str, Any],
) -> None:
    payload = json.dumps(datum).encode()
    known = NAMES.issuperset(datum) and all(f["name"] in datum for f in _required())
    if validate(datum, RECORD, raise_errors=False) and known:
        assert JsonToAvro(RECORD, b"h").encode(payload) == b"h" + _reference(datum)
    else:
        with pytest.raises(AvroEncodeError):
            JsonToAvro(RECORD, b"h").encode(payload)


def test_the_common_case_never_asks_the_authority(monkeypatch: pytest.MonkeyPatch) -> None:
    """A valid record is written by the field path alone: neither fastavro's validate (the
    authority behind ``_problem``) nor the whole-record writer is called."""

    def never(*_args: object) -> None:
        raise AssertionError("the slow path was taken")

    monkeypatch.setattr(wire, "_problem", never)
    monkeypatch.setattr(wire, "_write", never)
    datum = {"l": 1, "u": None, "e": "BLUE", "d": 0.5, "inner": {"x": 2, "s": "a"}, "text": "t"}
    assert JsonToAvro(RECORD).encode(json.dumps(datum).encode()) == _reference(datum)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"l": True}, r"ns\.Event\.l is <True>"),  # the writer would write a 1
        ({"l": 1.5}, r"ns\.Event\.l is <1\.5>"),  # ... a truncated 1
        ({"i": 2**31}, r"ns\.Event\.i is <2147483648>"),  # ... a long as an int
        ({"b": 0}, r"ns\.Event\.b is <0>"),  # ... a false from anything
        ({"d": True}, r"ns\.Event\.d is <True>"),  # ... a 1.0
        ({"n": 0}, r"ns\.Event\.n is <0>"),  # ... nothing, for any value
        ({"inner": {"x": False, "s": None}}, r"ns\.Inner\.x is <False>"),
        ({"u": MISSING}, r"field u is missing"),  # the writer would write a null
        ({"e": MISSING}, r"field e is missing"),
        ({"e": "GREEN"}, r"ns\.Event\.e is <GREEN>"),
        ({"text": 5}, r"ns\.Event\.text is <5>"),
        ({"extra": 1}, r"has no field extra"),
    ],
)
def test_what_the_writer_would_take_wrongly_is_refused_with_a_reason(
    change: dict[str, Any], reason: str
) -> None:
    datum: dict[str, Any] = {
        "l": 1,
        "u": "x",
        "e": "RED",
        "d": 1.0,
        "inner": {"x": 1, "s": None},
        "text": "t",
    }
    datum.update(change)
    datum = {k: v for k, v in datum.items() if v is not MISSING}
    if "extra" not in change:  # unknown fields are encode's check, before the field path
        assert wire._write_fields(b"", _fields(), _named(), datum) is None
    with pytest.raises(AvroEncodeError, match=reason):
        JsonToAvro(RECORD).encode(json.dumps(datum).encode())


def test_a_field_without_a_fast_check_leaves_the_whole_record_to_fastavro() -> None:
    schema = parse(
        '{"type": "record", "name": "F", "fields": [{"name": "f", "type": "float"},'
        ' {"name": "a", "type": {"type": "array", "items": "long"}}]}'
    )
    assert field_checks(schema) is None
    assert field_checks(parse('"long"')) is None
    encoder = JsonToAvro(schema)
    out = io.BytesIO()
    schemaless_writer(out, schema, {"f": 1.5, "a": [1, 2]})
    assert encoder.encode(b'{"f": 1.5, "a": [1, 2]}') == out.getvalue()
    with pytest.raises(AvroEncodeError, match=r"F\.a is <x> of type <class 'str'> expected long"):
        encoder.encode(b'{"f": 1.5, "a": ["x"]}')
