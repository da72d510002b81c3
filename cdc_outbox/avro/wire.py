"""Avro in the Confluent wire format, pure (no I/O): reusable by producers and consumers.

Wire format: byte 0 (magic), the writer schema id as 4 bytes big-endian, then the Avro binary
encoding of the datum (``fastavro.schemaless_writer``).

- :class:`JsonToAvro` (one per schema; :func:`encode_json` for a single payload) turns a JSON
  payload into Avro binary against a parsed schema, or raises
  :class:`AvroEncodeError` whose text is fastavro's reason (wrong type, missing field, a field
  the schema does not have, invalid JSON). Never a partial result.
- :func:`frame` / :func:`unframe` add and split the 5-byte header.
- :func:`decode` reads a framed value back with the writer schema looked up by id (``schemas``:
  any ``id -> parsed schema`` callable, e.g. a dict's ``__getitem__``).
- :func:`subject_name` is the Confluent subject naming: ``topic`` (``<topic>-value``),
  ``record`` (``<record full name>-value``), ``topic_record`` (``<topic>-<record>-value``).
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.validation import validate

from cdc_outbox.avro.fastpath import WRITE_OPTIONS, WriteData, compile_fast
from cdc_outbox.avro.precheck import Check, compile_check

__all__ = [
    "MAGIC",
    "AvroEncodeError",
    "JsonToAvro",
    "decode",
    "encode_json",
    "frame",
    "header",
    "parse",
    "record_names",
    "subject_name",
    "unframe",
]

MAGIC = 0
_HEADER = struct.Struct(">bI")
_from_json = json.JSONDecoder().decode
_decode_json = msgspec.json.decode


class AvroEncodeError(ValueError):
    """The payload cannot be written with the schema (the text says why)."""


def parse(schema_text: str) -> Any:
    """Parse Avro schema JSON text (``ValueError``/fastavro errors for an invalid schema)."""
    return parse_schema(json.loads(schema_text))


def record_names(schema: Any) -> set[str]:
    """Names a record schema answers to: its full name and its simple name."""
    if isinstance(schema, dict) and schema.get("type") == "record":
        name = str(schema.get("name", ""))
        return {name, name.rpartition(".")[2]}
    return set()


class JsonToAvro:
    """Encodes JSON payloads under one parsed schema, the checks worked out once.

    ``encode(payload)`` gives ``header`` then the Avro binary of the JSON ``payload``, or
    raises :class:`AvroEncodeError`. Checked: JSON syntax, the top-level record's fields
    (none unknown, none without default missing), then every value's type. The common case
    of a record is decoded and written by :func:`cdc_outbox.avro.fastpath.compile_fast`'s
    function, which *is* ``encode`` then (typed decoding, then fastavro's ``write_data``
    field by field: the same bytes as ``schemaless_writer``). Anything it is unsure of takes
    the general path: the parsed payload, a per-schema compiled pre-check
    (:mod:`cdc_outbox.avro.precheck`) for the common case, else
    ``fastavro.validation.validate``, the authority and the source of the reason, as for
    anything fastavro's writer refuses. Unknown fields of nested records are not checked
    (fastavro drops them).
    """

    __slots__ = ("_check", "_named", "_names", "_rule", "encode", "header", "schema")

    encode: Callable[[bytes], bytes]  # see the class contract

    def __init__(self, parsed_schema: Any, header: bytes = b"") -> None:
        self.schema = parsed_schema
        self.header = header
        self._named: dict[str, Any] = {}  # the named types it defines, for the writer
        parse_schema(parsed_schema, self._named)
        self._rule = rule = _new_rule(parsed_schema)
        self._check = None if rule is None else rule.check  # None: always ask fastavro
        self._names = frozenset() if rule is None else rule.names
        fast = None
        if _write_data is not None:
            fast = compile_fast(parsed_schema, self._named, _write_data, header, self._general)
        self.encode = self._general if fast is None else fast

    def _general(self, payload: bytes) -> bytes:
        """The general path of ``encode`` (see the class contract)."""
        datum = _json(payload)
        check = self._check
        if type(datum) is dict and self._names.issuperset(datum) and check and check(datum):
            return self._write(datum)  # valid, or else the writer refuses it
        problem = _problem(self._rule, datum, self.schema)
        if problem is not None:
            raise AvroEncodeError(f"avro: {problem[:500]}")
        return self._write(datum)

    def _write(self, datum: Any) -> bytes:
        try:
            return _write(self.header, self.schema, self._named, datum)
        except Exception as exc:  # refused by the writer: fastavro's validate words why
            problem = _problem(self._rule, datum, self.schema) or f"{type(exc).__name__}: {exc}"
            raise AvroEncodeError(f"avro: {problem[:500]}") from None


def encode_json(parsed_schema: Any, payload: bytes, header: bytes = b"") -> bytes:
    """``JsonToAvro(parsed_schema, header).encode(payload)``: for one payload (a relay keeps
    one :class:`JsonToAvro` per schema)."""
    return JsonToAvro(parsed_schema, header).encode(payload)


def _problem(rule: _Rule | None, datum: Any, parsed_schema: Any) -> str | None:
    """Why ``datum`` is not valid for the schema (None: fastavro's validate accepts it)."""
    problem = None if rule is None else rule.top_level(datum)
    if problem is None:
        try:
            validate(datum, parsed_schema, raise_errors=True)
        except Exception as exc:  # fastavro's ValidationError (a list of messages)
            problem = " ".join(str(exc).split()).strip('[]" ')
    return problem


def _json(payload: bytes) -> Any:
    """The parsed JSON ``payload``: msgspec's, or (for what msgspec refuses: ``NaN``, numbers
    beyond a double, lone surrogates, invalid JSON) the stdlib's, which also words the error.
    Where both parse, they agree (integers of any size stay integers)."""
    try:
        return _decode_json(payload)
    except msgspec.MsgspecError:
        pass
    try:
        return _from_json(payload.decode())
    except (ValueError, RecursionError) as exc:
        raise AvroEncodeError(f"avro: payload is not valid JSON: {exc}") from None


def _schemaless(head: bytes, schema: Any, named: dict[str, Any], datum: Any) -> bytes:
    """``head`` then ``datum`` written by fastavro's public ``schemaless_writer``."""
    buf = io.BytesIO(head)
    buf.seek(len(head))
    schemaless_writer(buf, schema, datum)
    return buf.getvalue()


Writer = Callable[[bytes, Any, dict[str, Any], Any], bytes]


def _pick_writer() -> tuple[Writer, WriteData | None]:
    """``(writer, write_data)``: fastavro's Cython ``write_data``, which ``schemaless_writer``
    wraps, called directly (about 0.3 us less per record: the wrapper re-reads the parsed
    schema's named types and builds its options on every call), if this fastavro has it and
    it writes exactly what ``schemaless_writer`` writes for a probe record, with that
    ``write_data`` itself (for :mod:`cdc_outbox.avro.fastpath`); else
    ``(schemaless_writer, None)``. The choice is made once, at import
    (``tests/unit/test_avro.py`` checks which one)."""
    try:
        from fastavro import _write as cython_writer
    except ImportError:  # a fastavro built without its Cython modules
        return _schemaless, None
    write_data = getattr(cython_writer, "write_data", None)  # not in fastavro's stubs
    if write_data is None:
        return _schemaless, None

    def direct(head: bytes, schema: Any, named: dict[str, Any], datum: Any) -> bytes:
        buf = bytearray(head)
        write_data(buf, datum, schema, named, "", WRITE_OPTIONS)
        return bytes(buf)

    probe_schema = parse_schema(
        {
            "type": "record",
            "name": "P",
            "fields": [{"name": "n", "type": "long"}, {"name": "s", "type": ["null", "string"]}],
        }
    )
    probe = {"n": -3, "s": "x"}
    try:
        same = direct(b"h", probe_schema, {}, probe) == _schemaless(b"h", probe_schema, {}, probe)
    except Exception:  # another signature: not the function this was written against
        return _schemaless, None
    return (direct, write_data) if same else (_schemaless, None)


_write, _write_data = _pick_writer()


@dataclass(frozen=True, slots=True)
class _Rule:
    """What is worked out once per record schema: field names, required fields, pre-check."""

    name: str
    names: frozenset[str]
    required: tuple[str, ...]
    check: Check | None

    def top_level(self, datum: Any) -> str | None:
        """Why ``datum`` cannot be this record at the top level (None: it may be)."""
        if not isinstance(datum, dict):
            return f"payload is a JSON {type(datum).__name__}, record {self.name} needs an object"
        if not self.names.issuperset(datum):
            unknown = sorted(set(datum) - self.names)
            return f"record {self.name} has no field {', '.join(unknown)}"
        for field in self.required:
            if field not in datum:
                missing = [f for f in self.required if f not in datum]
                return (
                    f"record {self.name} field {', '.join(missing)} is missing (and has no default)"
                )
        return None


def _new_rule(schema: Any) -> _Rule | None:
    """The :class:`_Rule` of a record schema (None for other schemas)."""
    if not (isinstance(schema, dict) and schema.get("type") == "record"):
        return None
    fields = schema["fields"]
    return _Rule(
        str(schema.get("name")),
        frozenset(f["name"] for f in fields),
        tuple(f["name"] for f in fields if "default" not in f),
        compile_check(schema),
    )


def header(schema_id: int) -> bytes:
    """The Confluent wire format's 5-byte header: magic byte, 4-byte big-endian schema id."""
    return _HEADER.pack(MAGIC, schema_id)


def frame(schema_id: int, body: bytes) -> bytes:
    """Confluent wire format: magic byte, 4-byte big-endian schema id, Avro body."""
    return header(schema_id) + body


def unframe(data: bytes) -> tuple[int, bytes]:
    """``(schema id, Avro body)`` of a framed value (``ValueError`` if it is not one)."""
    if len(data) < _HEADER.size or data[0] != MAGIC:
        raise ValueError("not Confluent wire format (magic byte 0 + 4-byte schema id)")
    _, schema_id = _HEADER.unpack_from(data)
    return schema_id, data[_HEADER.size :]


def decode(data: bytes, schemas: Callable[[int], Any]) -> Any:
    """Read a framed Avro value with its writer schema ``schemas(id)`` (parsed)."""
    schema_id, body = unframe(data)
    return schemaless_reader(io.BytesIO(body), schemas(schema_id), None)


def subject_name(strategy: str, topic: str, record: str, part: str = "value") -> str:
    """The subject of ``record`` on ``topic`` under ``strategy`` (topic/record/topic_record)."""
    if strategy == "topic":
        return f"{topic}-{part}"
    if strategy == "record":
        return f"{record}-{part}"
    if strategy == "topic_record":
        return f"{topic}-{record}-{part}"
    raise ValueError(f"unknown subject name strategy {strategy!r}")
