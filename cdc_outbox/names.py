"""Naming rules shared by every layer (pure, no imports beyond the standard library: the
writer-only install uses it too)."""

from __future__ import annotations

import re

#: A PostgreSQL identifier the project accepts unquoted-safe: letter or underscore, then
#: letters, digits, ``_`` or ``$``, at most 63 bytes (NAMEDATALEN - 1). Use ``fullmatch``.
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")

#: Kafka's topic name rule (``is_legal_topic``).
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")

#: Header names the relay sets itself (dead letters add ``cdc_outbox.*`` ones): a row may not.
RESERVED_HEADERS = frozenset({"id", "event_type", "aggregate_type"})
RESERVED_HEADER_PREFIX = "cdc_outbox."


def is_legal_topic(name: str) -> bool:
    """Kafka's rule: 1..249 chars of ``[A-Za-z0-9._-]``, and not ``.`` or ``..``."""
    return _TOPIC_RE.fullmatch(name) is not None and name not in (".", "..")


def is_free_header_name(name: str) -> bool:
    """Whether a row may set header ``name``: not empty, not the relay's own (``id``,
    ``event_type``, ``aggregate_type``, ``cdc_outbox.*``)."""
    return (
        bool(name) and name not in RESERVED_HEADERS and not name.startswith(RESERVED_HEADER_PREFIX)
    )
