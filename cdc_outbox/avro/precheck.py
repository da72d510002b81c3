"""A per-schema compiled pre-check of JSON data, faster than ``fastavro.validation.validate``.

Contract of :func:`compile_check`: it returns ``check(datum) -> bool`` or ``None``. The check
is *sound but not complete*: ``True`` means fastavro's ``validate`` accepts the datum (same
rules: ints in range and not bool, strings, booleans, null, doubles, enums, unions and nested
records of these, defaults of absent fields), or else fastavro's writer raises for it: inside
a record, the value of a field whose type is ``string``, an enum or a union is not checked,
because the writer refuses any other value there on its own (only an absent union field
without a default is checked: the writer would write a null). So nothing invalid is ever
written. ``False`` only means "not sure", and the caller then asks fastavro, which
stays the one authority and gives the reason. ``None`` means the schema holds a type without
a fast check outside the fields left to the writer (arrays, maps, bytes, fixed, float,
logical types, named references): use fastavro for every datum.

A record datum carrying fastavro's ``"-type"`` key (the name of the record it means) is
never judged here: ``validate`` refuses it unless the name matches, while the writer ignores
the key and writes the record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastavro.const import INT_MAX_VALUE, INT_MIN_VALUE, LONG_MAX_VALUE, LONG_MIN_VALUE

__all__ = ["INT_BOUNDS", "Check", "compile_check", "writer_checks"]

Check = Callable[[Any], bool]
_MISSING: Any = object()  # an absent field without default: every check refuses it


def _int_range(lo: int, hi: int) -> Check:
    return lambda v: type(v) is int and lo <= v <= hi


# The ranges fastavro accepts for its integer types (inclusive).
INT_BOUNDS = {"int": (INT_MIN_VALUE, INT_MAX_VALUE), "long": (LONG_MIN_VALUE, LONG_MAX_VALUE)}

_PRIMITIVES: dict[str, Check] = {
    "null": lambda v: v is None,
    "boolean": lambda v: type(v) is bool,
    "string": lambda v: type(v) is str,
    "int": _int_range(*INT_BOUNDS["int"]),
    "long": _int_range(*INT_BOUNDS["long"]),
    "double": lambda v: type(v) is float or type(v) is int,
}


def compile_check(schema: Any) -> Check | None:
    """The pre-check of a parsed schema (see the module contract)."""
    if isinstance(schema, str):
        return _PRIMITIVES.get(schema)
    if isinstance(schema, list):
        branches = [compile_check(s) for s in schema]
        if any(b is None for b in branches):
            return None
        checks = tuple(b for b in branches if b is not None)
        return lambda v: any(c(v) for c in checks)
    if not isinstance(schema, dict) or "logicalType" in schema:
        return None
    kind = schema.get("type")
    if kind == "enum":
        symbols = frozenset(schema["symbols"])
        return lambda v: type(v) is str and v in symbols
    if kind == "record":
        return _record(schema)
    if isinstance(kind, str) and set(schema) <= {"type", "doc"}:
        return _PRIMITIVES.get(kind)
    return None


def writer_checks(schema: Any) -> bool:
    """fastavro's writer raises for any value but a valid one of this type: a string, one of
    an enum's symbols, or a union's (it picks the branch with fastavro's own validation; but
    it writes an absent union field without a default as a null). Other types it would write
    from a wrong value (a bool or a float as a long, an int out of an int's range, anything as
    a boolean or a null)."""
    if schema == "string" or isinstance(schema, list):
        return True
    return isinstance(schema, dict) and schema.get("type") == "enum" and "logicalType" not in schema


def _record(schema: dict[str, Any]) -> Check | None:
    # An absent field reads as its default (_MISSING without one: every check refuses it).
    longs: list[tuple[str, Any]] = []  # type(v) is int: the writer refuses ints out of range
    ints: list[tuple[str, Any, int, int]] = []
    others: list[tuple[str, Any, Check]] = []
    present: list[str] = []  # unions without a default: the writer would write a null
    for field in schema["fields"]:
        kind = field["type"]
        if writer_checks(kind):  # see the module contract
            if isinstance(kind, list) and "default" not in field:
                present.append(field["name"])
            continue
        check = compile_check(kind)
        if check is None:
            return None
        name, default = field["name"], field.get("default", _MISSING)
        if kind == "long":
            longs.append((name, default))
        elif kind == "int":
            ints.append((name, default, *INT_BOUNDS["int"]))
        else:
            others.append((name, default, check))
    long_spec, int_spec, other_spec = tuple(longs), tuple(ints), tuple(others)
    present_spec = tuple(present)

    def record(datum: Any) -> bool:
        if type(datum) is not dict or "-type" in datum:
            return False  # "-type": validate compares it with the record's name; not sure
        for name in present_spec:
            if name not in datum:
                return False
        get = datum.get
        for name, default in long_spec:
            if type(get(name, default)) is not int:
                return False
        for name, default, lo, hi in int_spec:
            value = get(name, default)
            if type(value) is not int or not lo <= value <= hi:
                return False
        return not other_spec or all(check(get(n, d)) for n, d, check in other_spec)

    return record
