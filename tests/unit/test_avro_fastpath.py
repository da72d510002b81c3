"""The fast path of a top-level record (``fastpath.compile_fast``: typed decoding, then
unrolled field writes): what it writes is what ``schemaless_writer`` writes, it writes nothing
fastavro's ``validate`` refuses, and it takes every valid record itself."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from fastavro.validation import validate
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_outbox.avro import wire
from cdc_outbox.avro.fastpath import Encode, compile_fast
from cdc_outbox.avro.wire import AvroEncodeError, JsonToAvro, parse

MISSING: Any = object()  # in a change below: the field is absent

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

# JSON has no NaN or infinity, and encodes a lone surrogate as an escape no parser reads as
# a string of it (the stdlib path and test_avro.py cover those payloads).
_text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=3)
_floats = st.floats(allow_nan=False, allow_infinity=False)
_any = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | _floats
    | st.sampled_from(["RED", "GREEN", ""])
    | _text
)
_valid_inner = st.fixed_dictionaries(
    {"x": st.integers(-(2**63), 2**63 - 1), "s": st.none() | _text}
)
_inner = _valid_inner | st.dictionaries(st.sampled_from(["x", "s", "z"]), _any, max_size=3) | _any


def _field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, valid, valid, _any)  # mostly valid: whole records often are


_records = st.fixed_dictionaries(
    {},
    optional={
        "l": _field(st.integers(-(2**63), 2**63 - 1)),
        "i": _field(st.integers(-(2**31), 2**31 - 1)),
        "u": _field(st.none() | _text),
        "e": _field(st.sampled_from(["RED", "BLUE"])),
        "b": _field(st.booleans()),
        "d": _field(_floats | st.integers(-(2**70), 2**70)),
        "n": _field(st.none()),
        "inner": _field(_inner),
        "again": _field(st.none() | _valid_inner),
        "text": _field(_text),
        "unknown": _any,
    },
)


def _unsure(payload: bytes) -> None:
    """The general path, for these tests: None says the fast path was not sure."""


def _fast(head: bytes = b"") -> Encode:
    assert wire._write_data is not None
    fast = compile_fast(RECORD, JsonToAvro(RECORD)._named, wire._write_data, head, _unsure)
    assert fast is not None
    return fast


def _reference(datum: Any) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, RECORD, datum)
    return out.getvalue()


@settings(max_examples=400)
@given(_records)
def test_written_only_if_valid_and_then_as_schemaless_writer_writes(datum: dict[str, Any]) -> None:
    got = _fast(b"h")(json.dumps(datum).encode())
    known = NAMES.issuperset(datum) and all(f["name"] in datum for f in _required())
    valid = validate(datum, RECORD, raise_errors=False)
    if got is not None:
        assert valid and known, datum
        assert got == b"h" + _reference(datum)
    elif valid and known:
        pytest.fail(f"a valid record left to the slow path: {datum!r}")


def _required() -> list[dict[str, Any]]:
    return [f for f in RECORD["fields"] if "default" not in f]


@settings(max_examples=200)
@given(_records)
def test_encode_writes_valid_records_and_refuses_the_rest(
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
    """A valid record is written by the fast path alone: neither the general parse, nor
    fastavro's validate (the authority behind ``_problem``), nor the whole-record writer is
    called."""

    def never(*_args: object) -> None:
        raise AssertionError("the slow path was taken")

    monkeypatch.setattr(wire, "_json", never)
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
    assert _fast()(json.dumps(datum).encode()) is None
    with pytest.raises(AvroEncodeError, match=reason) as refused:
        JsonToAvro(RECORD).encode(json.dumps(datum).encode())
    # The general path ran outside the fast one's handler: no fast-path error chained.
    assert refused.value.__context__ is None or refused.value.__suppress_context__


@pytest.mark.parametrize(
    "fields",
    [
        [{"name": "f", "type": "float"}],  # no fast check for these types
        [{"name": "a", "type": {"type": "array", "items": "long"}}],
        [{"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
        # Defaults fastavro's parse refuses, but its writer would write (a false, nothing):
        [{"name": "b", "type": "boolean", "default": 0}],
        [{"name": "n", "type": "null", "default": 1}],
        [{"name": "i", "type": {"type": "record", "name": "I", "fields": []}, "default": {}}],
        [{"name": 'a"b', "type": "long"}],  # a name msgspec will not rename to
    ],
)
def test_a_schema_the_fast_path_cannot_type_is_left_to_the_general_path(
    fields: list[dict[str, Any]],
) -> None:
    raw = {"type": "record", "name": "F", "fields": fields}
    schema = parse_schema(raw, _ignore_default_error=True)
    assert wire._write_data is not None
    assert compile_fast(schema, {}, wire._write_data, b"", _unsure) is None
    assert compile_fast(parse('"long"'), {}, wire._write_data, b"", _unsure) is None


def test_the_general_path_writes_and_refuses_what_the_fast_path_cannot_type() -> None:
    schema = parse(
        '{"type": "record", "name": "F", "fields": [{"name": "f", "type": "float"},'
        ' {"name": "a", "type": {"type": "array", "items": "long"}}]}'
    )
    encoder = JsonToAvro(schema)
    out = io.BytesIO()
    schemaless_writer(out, schema, {"f": 1.5, "a": [1, 2]})
    assert encoder.encode(b'{"f": 1.5, "a": [1, 2]}') == out.getvalue()
    with pytest.raises(AvroEncodeError, match=r"F\.a is <x> of type <class 'str'> expected long"):
        encoder.encode(b'{"f": 1.5, "a": ["x"]}')


def test_no_text_of_the_schema_enters_the_generated_source() -> None:
    """A field name is data to the generated writer, never code (fastavro does not check
    that names are identifiers)."""
    name = "x, n0); raise SystemExit(1); (y"
    schema = parse(
        json.dumps({"type": "record", "name": "R", "fields": [{"name": name, "type": "long"}]})
    )
    assert wire._write_data is not None
    fast = compile_fast(schema, {}, wire._write_data, b"", _unsure)
    assert fast is not None
    out = io.BytesIO()
    schemaless_writer(out, schema, {name: 7})
    assert fast(json.dumps({name: 7}).encode()) == out.getvalue()


def test_defaults_are_written_for_absent_fields() -> None:
    datum = {"l": 1, "u": None, "e": "BLUE", "d": 2, "inner": {"x": 2, "s": None}, "text": ""}
    got = _fast()(json.dumps(datum).encode())
    assert got == _reference(datum)  # i=3, b=false, n=null, again=null from the defaults
