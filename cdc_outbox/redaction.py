"""Secret handling for settings: DSN passwords and secret-looking Kafka config keys.

:func:`redact_dsn` and :data:`MASK` give the display form (password shown as ``***``),
:func:`redact` masks known secret strings in any text (error lines, log records) and
:func:`redact_kafka_config` the secret values of a librdkafka config (the only two maskers),
:func:`dsn_password` and :func:`is_secret_kafka_key` find the values to scrub, and
:func:`validate_dsn` checks a conninfo without ever echoing its password.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = [
    "KAFKA_SECRET_MARKERS",
    "MASK",
    "dsn_password",
    "is_secret_kafka_key",
    "redact",
    "redact_dsn",
    "redact_kafka_config",
    "validate_dsn",
]

MASK = "***"
#: A Kafka config key containing any of these (case-insensitive) has its value masked; the one
#: list used for settings display, log scrubbing and the producer's debug log.
KAFKA_SECRET_MARKERS = (
    "password",
    "secret",
    "token",
    "sasl.jaas",
    "sasl.oauthbearer.config",
    "ssl.key",
    "passphrase",
    "private.key",
)

_V = TypeVar("_V")

_URI_PASSWORD_RE = re.compile(r"^(postgres(?:ql)?://[^/@?#]*?:)([^@/]*)(@)", re.IGNORECASE)
_KV_PASSWORD_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE)


def dsn_password(dsn: str) -> str | None:
    """The password embedded in a conninfo/URI, if any (``None`` if unparsable or absent)."""
    try:
        return conninfo_to_dict(dsn).get("password") or None  # type: ignore[return-value]
    except psycopg.Error:
        return None


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each non-empty secret replaced by :data:`MASK`.

    One left-to-right pass trying the longest secret first, so a secret that contains another
    is masked whole (never ``x***x``) and a mask is never re-scanned. No secret survives unless
    it contains ``*`` (a piece of the mask itself).
    """
    ordered = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not ordered:
        return text
    return re.sub("|".join(map(re.escape, ordered)), MASK, text)


def redact_kafka_config(config: Mapping[str, _V]) -> dict[str, _V | str]:
    """A copy of a librdkafka config safe to show or log: the value of every secret key
    (:func:`is_secret_kafka_key`) replaced by :data:`MASK`."""
    return {k: (MASK if is_secret_kafka_key(k) else v) for k, v in config.items()}


def redact_dsn(dsn: str) -> str:
    """Display form of a DSN with any password replaced by ``***`` (URI or key=value)."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.Error:
        text = _URI_PASSWORD_RE.sub(lambda m: m.group(1) + MASK + m.group(3), dsn)
        return _KV_PASSWORD_RE.sub(lambda m: m.group(1) + MASK, text)
    if "password" in parts:
        parts["password"] = MASK
    return make_conninfo(**{k: str(v) for k, v in parts.items()})


def validate_dsn(dsn: str) -> None:
    """Raise ``ValueError`` (one line, password-free) unless ``dsn`` is a usable conninfo."""
    if not dsn.strip():
        raise ValueError("dsn is required (set CDC_OUTBOX_DSN or --dsn)")
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise ValueError(f"dsn is malformed: {_scrub(str(exc), dsn)}") from None
    for port in str(parts.get("port") or "").split(","):
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"dsn is malformed: invalid port {port!r}")


def _scrub(message: str, dsn: str) -> str:
    """``message`` on one line with ``dsn`` in its display form and its password masked."""
    message = " ".join(message.split())
    message = message.replace(dsn, redact_dsn(dsn))
    m = _URI_PASSWORD_RE.match(dsn)
    return redact(message, [dsn_password(dsn) or "", m.group(2) if m else ""])


def is_secret_kafka_key(key: str) -> bool:
    """True for librdkafka keys whose value must never be shown."""
    lowered = key.lower()
    return any(marker in lowered for marker in KAFKA_SECRET_MARKERS)
