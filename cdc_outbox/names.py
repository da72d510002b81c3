"""Naming rules shared by every layer (pure, no imports beyond the standard library: the
writer-only install uses it too)."""

from __future__ import annotations

import re

#: A PostgreSQL identifier the project accepts unquoted-safe: letter or underscore, then
#: letters, digits, ``_`` or ``$``, at most 63 bytes (NAMEDATALEN - 1). Use ``fullmatch``.
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
