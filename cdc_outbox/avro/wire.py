"""Avro in the Confluent wire format, pure (no I/O): reusable by producers and consumers.

Wire format: byte 0 (magic), the writer schema id as 4 bytes big-endian, then the Avro binary
encoding of the datum (``fastavro.schemaless_writer``).

- :func:`encode_json` turns a JSON payload into Avro binary against a parsed schema, or raises
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
import json.scanner
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.validation import validate

from cdc_outbox.avro.precheck import Check, compile_check

__all__ = [
    "MAGIC",
    "AvroEncodeError",
    "decode",
    "encode_json",
    "frame",
    "parse",
    "record_names",
    "subject_name",
    "unframe",
]

MAGIC = 0
_HEADER = struct.Struct(">bI")
_from_json = json.JSONDecoder().decode
_scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


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


def encode_json(parsed_schema: Any, payload: bytes) -> bytes:
    """Avro binary of the JSON ``payload`` under ``parsed_schema`` (see the module contract).

    Checked: JSON syntax, the top-level record's fields (none unknown, none without default
    missing), then every value's type: a per-schema compiled pre-check
    (:mod:`cdc_outbox.avro.precheck`) passes the common case; anything it is unsure of goes
    to ``fastavro.validation.validate``, the authority and the source of the reason. Unknown
    fields of nested records are not checked (fastavro drops them).
    """
    datum = _json(payload)
    rule = _rule(parsed_schema)
    if rule is None or not rule.passes(datum):  # else: the pre-check implies both checks below
        problem = None if rule is None else rule.top_level(datum)
        if problem is None:
            try:
                validate(datum, parsed_schema, raise_errors=True)
            except Exception as exc:  # fastavro's ValidationError (a list of messages)
                problem = " ".join(str(exc).split()).strip('[]" ')
        if problem is not None:
            raise AvroEncodeError(f"avro: {problem[:500]}")
    buf = io.BytesIO()
    try:
        schemaless_writer(buf, parsed_schema, datum)
    except Exception as exc:  # what validate let through (fastavro raises various types)
        raise AvroEncodeError(f"avro: {type(exc).__name__}: {exc}"[:500]) from None
    return buf.getvalue()


def _json(payload: bytes) -> Any:
    """The parsed JSON ``payload``: the stdlib's C scanner directly when the text is exactly
    one value, else the full decoder (which also words the error)."""
    try:
        text = payload.decode()
        datum, end = _scan(text, 0)
        if end == len(text):
            return datum
    except (StopIteration, ValueError, RecursionError):
        pass
    try:
        return _from_json(payload.decode())
    except (ValueError, RecursionError) as exc:
        raise AvroEncodeError(f"avro: payload is not valid JSON: {exc}") from None


@dataclass(frozen=True, slots=True)
class _Rule:
    """What is worked out once per record schema: field names, required fields, pre-check."""

    schema: Any
    name: str
    names: frozenset[str]
    required: tuple[str, ...]
    check: Check | None

    def passes(self, datum: Any) -> bool:
        """True: ``datum`` is surely valid (no unknown top-level field, the pre-check holds)."""
        check = self.check
        return check is not None and check(datum) and self.names.issuperset(datum)

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
                    f"record {self.name} field {', '.join(missing)} is missing"
                    " (and has no default)"
                )
        return None


_rules: dict[int, _Rule] = {}


def _rule(schema: Any) -> _Rule | None:
    """The cached :class:`_Rule` of a record schema (None for other schemas)."""
    rule = _rules.get(id(schema))
    if rule is not None and rule.schema is schema:
        return rule
    if not (isinstance(schema, dict) and schema.get("type") == "record"):
        return None
    fields = schema["fields"]
    if len(_rules) > 1024:
        _rules.clear()
    rule = _rules[id(schema)] = _Rule(
        schema,
        str(schema.get("name")),
        frozenset(f["name"] for f in fields),
        tuple(f["name"] for f in fields if "default" not in f),
        compile_check(schema),
    )
    return rule


def frame(schema_id: int, body: bytes) -> bytes:
    """Confluent wire format: magic byte, 4-byte big-endian schema id, Avro body."""
    return _HEADER.pack(MAGIC, schema_id) + body


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
