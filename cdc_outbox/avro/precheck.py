"""A per-schema compiled pre-check of JSON data, faster than ``fastavro.validation.validate``.

Contract of :func:`compile_check`: it returns ``check(datum) -> bool`` or ``None``. The check
is *sound but not complete*: ``True`` means fastavro's ``validate`` accepts the datum (same
rules: ints in range and not bool, strings, booleans, null, doubles, enums, unions and nested
records of these, defaults of absent fields), or else ``fastavro.schemaless_writer`` raises for
it: inside a record, a field whose type is ``string`` or an enum is not checked, because the
writer refuses any other value there (a missing one included) on its own. So nothing invalid
is ever written. ``False`` only means "not sure", and the caller then asks fastavro, which
stays the one authority and gives the reason. ``None`` means the schema holds a type without
a fast check (arrays, maps, bytes, fixed, float, logical types, named references): use
fastavro for every datum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastavro.const import INT_MAX_VALUE, INT_MIN_VALUE, LONG_MAX_VALUE, LONG_MIN_VALUE

__all__ = ["Check", "compile_check"]

Check = Callable[[Any], bool]
_MISSING = object()


def _int_range(lo: int, hi: int) -> Check:
    return lambda v: type(v) is int and lo <= v <= hi


_INT_BOUNDS = {"int": (INT_MIN_VALUE, INT_MAX_VALUE), "long": (LONG_MIN_VALUE, LONG_MAX_VALUE)}

_PRIMITIVES: dict[str, Check] = {
    "null": lambda v: v is None,
    "boolean": lambda v: type(v) is bool,
    "string": lambda v: type(v) is str,
    "int": _int_range(*_INT_BOUNDS["int"]),
    "long": _int_range(*_INT_BOUNDS["long"]),
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


def _writer_refuses_others(schema: Any) -> bool:
    """fastavro's writer raises for any value but a valid one of this type (a string, or one
    of the enum's symbols); other types it would write from a wrong value (a bool as a long,
    anything as a boolean or a null)."""
    if schema == "string":
        return True
    return isinstance(schema, dict) and schema.get("type") == "enum" and "logicalType" not in schema


def _record(schema: dict[str, Any]) -> Check | None:
    ints: list[tuple[str, int, int, bool]] = []  # checked inline: the common case
    others: list[tuple[str, Check, bool]] = []
    for field in schema["fields"]:
        kind = field["type"]
        if _writer_refuses_others(kind):
            continue  # see the module contract
        check = compile_check(kind)
        if check is None:
            return None
        default_ok = "default" in field and check(field["default"])
        bounds = _INT_BOUNDS.get(kind) if isinstance(kind, str) else None
        if bounds is not None:
            ints.append((field["name"], *bounds, default_ok))
        else:
            others.append((field["name"], check, default_ok))
    int_spec, other_spec = tuple(ints), tuple(others)

    def record(datum: Any) -> bool:
        if type(datum) is not dict or "-type" in datum:  # fastavro's union-branch marker
            return False
        get = datum.get
        for name, lo, hi, default_ok in int_spec:
            value = get(name, _MISSING)
            if type(value) is int:
                if not lo <= value <= hi:
                    return False
            elif value is not _MISSING or not default_ok:
                return False
        for name, check, default_ok in other_spec:
            value = get(name, _MISSING)
            if value is _MISSING:
                if not default_ok:
                    return False
            elif not check(value):
                return False
        return True

    return record
