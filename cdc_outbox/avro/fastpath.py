"""The common case of a top-level record: typed JSON decoding, then unrolled field writes.

Contract of :func:`compile_fast`: for a record schema whose every field it can type (below) it
returns ``encode(payload)``, else ``None``. ``encode`` gives ``head`` then the Avro binary of
the JSON ``payload``, the same bytes as ``schemaless_writer`` writes for the parsed payload, or
what ``general(payload)`` gives (returns or raises) for anything it is not sure of: the caller's
general path (fastavro's validate, the authority, and its reason) then decides. It never
writes a payload ``validate`` refuses.

How: a ``msgspec`` Struct made from the schema decodes the payload and checks while it parses
what msgspec types exactly: JSON syntax, no field the record does not have, every field without
a default present (so an absent union is refused, never written as a null), and each primitive
field's type: a ``long`` or ``int`` an integer in range (not a boolean), a ``boolean`` a
boolean, a ``double`` a number, a ``null`` a null, a ``string`` a string. Other fields decode as
plain JSON values: enums and unions are checked by fastavro's writer itself (it refuses any
other value), nested records by :func:`cdc_outbox.avro.precheck.compile_check`. A field whose
type has none of these (arrays, maps, bytes, fixed, float, logical types, named references) or
a default its type refuses makes the schema ineligible. The fields are then written in order by
fastavro's ``write_data`` (a record's encoding is its fields' encodings in order) from a function
generated once per schema: one statement per field, no loop (for four fields, about 3,400
instructions fewer per payload than a loop over them, callgrind). Its source holds only
attribute names ``f0``..``fN`` and local names; no text of the schema.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import msgspec

from cdc_outbox.avro.precheck import INT_BOUNDS, Check, compile_check, writer_checks

__all__ = ["WRITE_OPTIONS", "Encode", "WriteData", "compile_fast"]

Encode = Callable[[bytes], Any]
WriteData = Callable[[bytearray, Any, Any, dict[str, Any], str, dict[str, Any]], None]

# The options fastavro's schemaless_writer passes its write_data (none of them set).
WRITE_OPTIONS = {"strict": False, "strict_allow_default": False, "disable_tuple_notation": False}

# What msgspec checks exactly as fastavro's validate does, for JSON values.
_TYPED: dict[str, Any] = {
    "string": str,
    **{
        kind: Annotated[int, msgspec.Meta(ge=lo, le=hi)]  # never a boolean
        for kind, (lo, hi) in INT_BOUNDS.items()
    },
    "boolean": bool,
    "double": float,  # an integer reads as the double the writer would make of it
    "null": None,
}


def _field_type(kind: Any) -> tuple[Any, Check | None] | None:
    """``(msgspec type, extra check or None)`` of a field's Avro type, or None (ineligible)."""
    if isinstance(kind, str) and kind in _TYPED:
        return _TYPED[kind], None
    if writer_checks(kind):  # an enum or a union: the writer refuses any other value
        return Any, None
    if isinstance(kind, dict) and kind.get("type") == "record":
        check = compile_check(kind)
        return None if check is None else (Any, check)
    return None


def _default_ok(kind: Any, default: Any) -> bool:
    """A default the fast path may write as it is: immutable and, for a typed or checked
    field, one its type accepts (the writer would write some wrong ones)."""
    if isinstance(default, dict | list):
        return False
    if writer_checks(kind):
        return True
    check = compile_check(kind)
    return check is not None and check(default)


def compile_fast(
    schema: Any, named: dict[str, Any], write_data: WriteData, head: bytes, general: Encode
) -> Encode | None:
    """The fast ``encode`` of a parsed record ``schema`` (see the module contract), or None."""
    if not (isinstance(schema, dict) and schema.get("type") == "record"):
        return None
    spec: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    scope: dict[str, Any] = {
        "write": write_data,
        "named": named,
        "options": WRITE_OPTIONS,
        "head": head,
        "general": general,
    }
    lines = [
        "def encode(payload):",
        "    try:",
        "        s = decode(payload)",
        "        buf = bytearray(head)",
    ]
    for i, field in enumerate(schema["fields"]):
        kind = field["type"]
        typed = _field_type(kind)
        if typed is None:
            return None
        msgspec_type, check = typed
        if "default" not in field:
            spec.append((f"f{i}", msgspec_type))
        elif _default_ok(kind, field["default"]):
            spec.append((f"f{i}", msgspec_type, field["default"]))
        else:
            return None
        scope[f"t{i}"], scope[f"n{i}"] = kind, field["name"]
        if check is not None:
            scope[f"c{i}"] = check
            lines.append(f"        if not c{i}(s.f{i}):")
            lines.append("            return general(payload)")
        lines.append(f"        write(buf, s.f{i}, t{i}, named, n{i}, options)")
    lines += [
        "        return bytes(buf)",
        "    except Exception:  # not valid JSON, not this record, or refused by the writer",
        "        pass",
        "    return general(payload)  # outside the handler: its errors chain to nothing",
    ]
    try:
        struct = msgspec.defstruct(
            "Fast" + str(schema.get("name", "")).rpartition(".")[2],
            spec,
            rename={f"f{i}": f["name"] for i, f in enumerate(schema["fields"])},
            forbid_unknown_fields=True,
            kw_only=True,
        )
    except (TypeError, ValueError):  # e.g. a field name with a quote: msgspec refuses it
        return None
    scope["decode"] = msgspec.json.Decoder(struct).decode
    exec(compile("\n".join(lines), "<cdc_outbox.avro.fastpath>", "exec"), scope)
    encode: Encode = scope["encode"]
    return encode
