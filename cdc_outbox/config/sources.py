"""Where each effective setting came from, for ``cdc-outbox config show`` (pure: no I/O).

:func:`effective_settings` flattens :meth:`Settings.redacted` (secrets already ``***``) to
dotted keys (``polling.batch_size``; ``kafka.config.sasl.password`` for a librdkafka key)
and names each value's source by the precedence of :func:`cdc_outbox.config.settings.load_settings`:
``flag`` > ``env`` > ``file`` > ``default``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from cdc_outbox.config.settings import ENV_ALLOWED, ENV_ALLOWED_PREFIXES, ENV_PREFIX, Settings

__all__ = ["Source", "effective_settings"]

Source = Literal["default", "file", "env", "flag"]


def effective_settings(
    settings: Settings,
    *,
    file_data: Mapping[str, Any] | None,
    environ: Mapping[str, str],
    flags: Mapping[str, Any],
) -> dict[str, tuple[Any, Source]]:
    """``{dotted key: (display value, source)}`` in the order of the settings model."""
    given: dict[Source, set[str]] = {
        "flag": set(_flat_keys({k: v for k, v in flags.items() if v is not None})),
        "env": set(_env_keys(environ)),
        "file": set(_flat_keys(file_data or {})),
    }
    out: dict[str, tuple[Any, Source]] = {}
    for key, value in _flat(settings.redacted()):
        source: Source = "default"
        names: tuple[Source, ...] = ("flag", "env", "file")
        for name in names:
            if _covered(key, given[name]):
                source = name
                break
        out[key] = (value, source)
    return out


def _covered(key: str, given: set[str]) -> bool:
    """``key`` or a table above it (a JSON table from one variable) was given."""
    parts = key.split(".")
    return any(".".join(parts[:n]) in given for n in range(1, len(parts) + 1))


def _flat(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _flat_keys(data: Mapping[str, Any]) -> Iterator[str]:
    return (key for key, _ in _flat(data))


def _env_keys(environ: Mapping[str, str]) -> Iterator[str]:
    for name, value in environ.items():
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in ENV_ALLOWED:
            continue
        if upper.startswith(ENV_ALLOWED_PREFIXES):
            continue
        key = ".".join(name[len(ENV_PREFIX) :].lower().split("__"))
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):  # a whole table as JSON: the keys it gives
            yield from (f"{key}.{sub}" for sub in _flat_keys(parsed))
        else:
            yield key
