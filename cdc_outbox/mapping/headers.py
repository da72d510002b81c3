"""The headers an outbox row adds to the relay's own (pure, no I/O).

* The relay sets ``id``, ``event_type`` and ``aggregate_type`` itself, and dead letters add
  ``cdc_outbox.*`` headers: a row may set none of these; :func:`is_free_header_name` (also
  not empty) is the rule for a configured header name.
* :func:`parse_headers_json`: the headers column's JSON object as Kafka headers, in order
  (string values as UTF-8, integers as text, other values as compact JSON text), or the
  dead-letter reason: not JSON, not an object, a name of the relay's own or in ``taken``
  (the ``columns.header_columns`` names), or a name or value that cannot be UTF-8 encoded.
"""

from __future__ import annotations

import functools
import json

from cdc_outbox.names import RESERVED_HEADER_PREFIX, RESERVED_HEADERS, is_free_header_name

__all__ = ["is_free_header_name", "parse_headers_json"]

_from_json = json.JSONDecoder().decode
_to_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@functools.lru_cache(maxsize=1024)
def parse_headers_json(
    name: str, hv: bytes, taken: frozenset[str] = frozenset()
) -> tuple[tuple[str, bytes], ...] | str:
    """The headers of column ``name``'s text ``hv``, or the dead-letter reason (see the module
    contract). Cached: the events of one transaction (one request) usually share them."""
    try:
        obj = _from_json(hv.decode())
    except (ValueError, RecursionError) as e:  # ValueError covers JSON and UTF-8 errors
        return f"column {name!r} is not valid JSON: {e}"
    if not isinstance(obj, dict):
        return f"column {name!r} is not a JSON object (got {type(obj).__name__})"
    out: list[tuple[str, bytes]] = []
    try:
        for k, v in obj.items():
            if k in RESERVED_HEADERS or k.startswith(RESERVED_HEADER_PREFIX) or k in taken:
                return f"column {name!r}: header {k!r} is reserved"
            t = type(v)
            if t is str:
                text = v
            elif t is int:
                text = str(v)
            else:  # bool, None, float, list, dict
                text = _to_json(v)
            k.encode()  # the key must be encodable too (the publisher encodes it)
            out.append((k, text.encode()))
    except (UnicodeEncodeError, RecursionError) as e:  # e.g. a lone surrogate escape
        return f"column {name!r} has a header that cannot be encoded: {e}"
    return tuple(out)
