"""A per-schema compiled pre-check of JSON data, faster than ``fastavro.validation.validate``.

Contract of :func:`compile_check`: it returns ``check(datum) -> bool`` or ``None``. The check
is *sound but not complete*: ``True`` means fastavro's ``validate`` accepts the datum (same
rules: ints in range and not bool, strings, booleans, null, doubles, enums, unions and nested
records of these, defaults of absent fields); ``False`` only means "not sure", and the caller
then asks fastavro, which stays the one authority and gives the reason. ``None`` means the
schema holds a type without a fast check (arrays, maps, bytes, fixed, float, logical types,
named references): use fastavro for every datum.
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


_PRIMITIVES: dict[str, Check] = {
    "null": lambda v: v is None,
    "boolean": lambda v: type(v) is bool,
    "string": lambda v: type(v) is str,
    "int": _int_range(INT_MIN_VALUE, INT_MAX_VALUE),
    "long": _int_range(LONG_MIN_VALUE, LONG_MAX_VALUE),
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


def _record(schema: dict[str, Any]) -> Check | None:
    fields: list[tuple[str, Check, bool]] = []
    for field in schema["fields"]:
        check = compile_check(field["type"])
        if check is None:
            return None
        default_ok = "default" in field and check(field["default"])
        fields.append((field["name"], check, default_ok))
    spec = tuple(fields)

    def record(datum: Any) -> bool:
        if type(datum) is not dict or "-type" in datum:  # fastavro's union-branch marker
            return False
        get = datum.get
        for name, check, default_ok in spec:
            value = get(name, _MISSING)
            if value is _MISSING:
                if not default_ok:
                    return False
            elif not check(value):
                return False
        return True

    return record
