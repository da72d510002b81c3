"""Read a Debezium connector configuration file into a flat ``{key: value}`` dict (pure).

Two forms: a Java ``.properties`` file (:func:`parse_properties`) and Kafka Connect's REST
JSON, either ``{"name": ..., "config": {...}}`` or the bare config object
(:func:`parse_connect_json`). A malformed JSON file is a :class:`ConfigError` (one line).
"""

from __future__ import annotations

import json
import re

from cdc_outbox.errors import ConfigError

__all__ = ["parse_connect_json", "parse_properties"]

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_BLANK = " \t\f"  # the whitespace of a .properties file
#: key (escapes allowed), then blanks, an optional ``=`` or ``:``, blanks, and the value
_PROPERTY = re.compile(r"((?:\\.|[^\\=: \t\f])*)[ \t\f]*[=: \t\f]?[ \t\f]*(.*)$", re.DOTALL)


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
                out.append(chr(int(text[i + 2 : i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _logical_lines(text: str) -> list[str]:
    """Lines of a .properties file with comments dropped and continuations joined."""
    lines: list[str] = []
    pending = ""
    for raw in re.split(r"\r\n|\r|\n", text):  # Java's line terminators only
        line = raw.lstrip(_BLANK)
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # an odd number of backslashes: the line continues
            pending += line[:-1]
            continue
        lines.append(pending + line)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


def parse_properties(text: str) -> dict[str, str]:
    """A Java ``.properties`` file as a dict (``key=value``, ``key: value`` or ``key value``;
    ``#``/``!`` comments, backslash continuations and escapes)."""
    out: dict[str, str] = {}
    for line in _logical_lines(text):
        match = _PROPERTY.match(line)
        assert match is not None  # the pattern matches every string
        out[_unescape(match.group(1))] = _unescape(match.group(2))
    return out


def parse_connect_json(text: str) -> dict[str, str]:
    """Kafka Connect's REST form (``{"name": ..., "config": {...}}``) or a bare config."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"config import-debezium: not valid JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        data = data["config"]
    if not isinstance(data, dict):
        raise ConfigError("config import-debezium: the JSON must be an object of settings")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}
