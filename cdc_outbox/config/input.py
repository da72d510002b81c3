"""What the user gave, checked before it becomes settings (used by
:mod:`cdc_outbox.config.settings`).

- :func:`check_toml` / :func:`check_env`: unknown keys in the TOML file or ``CDC_OUTBOX_*``
  variables are refused with one ``config: ...`` line naming them (a typo never falls back
  to a default silently);
- :func:`describe`: the first pydantic validation error as one line, never echoing input
  (which may be a secret).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from cdc_outbox.errors import ConfigError

__all__ = [
    "ENV_ALLOWED",
    "ENV_ALLOWED_PREFIXES",
    "ENV_PREFIX",
    "check_env",
    "check_toml",
    "describe",
    "parse_standby_names",
]

ENV_PREFIX = "CDC_OUTBOX_"
#: Variables with our prefix that are not settings but are read elsewhere (config file path;
#: sandbox: cache directory, Kafka class-data-sharing archive, PostgreSQL binaries and major
#: version; the test harness's backend and the knobs of its longer runs).
ENV_ALLOWED = frozenset(
    {
        "CDC_OUTBOX_CONFIG",
        "CDC_OUTBOX_CACHE_DIR",
        "CDC_OUTBOX_KAFKA_CDS",
        "CDC_OUTBOX_PG_BINDIR",
        "CDC_OUTBOX_PG_VERSION",
        "CDC_OUTBOX_CRASH_AT",
        "CDC_OUTBOX_TEST_BACKEND",
        "CDC_OUTBOX_CHAOS_SEED",
        "CDC_OUTBOX_CHAOS_ONLY",
        "CDC_OUTBOX_CATCH_UP_ORDER_TRANSACTIONS",
        "CDC_OUTBOX_RESTART_EXAMPLES",
        "CDC_OUTBOX_LEDGER_EXAMPLES",
    }
)
ENV_ALLOWED_PREFIXES = ("CDC_OUTBOX_SANDBOX_",)


def _model_fields(model: type[BaseModel]) -> dict[str, type[BaseModel] | None]:
    """Field name -> nested model class (or None for a leaf / free-form dict)."""
    out: dict[str, type[BaseModel] | None] = {}
    for name, info in model.model_fields.items():
        ann = info.annotation
        out[name] = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return out


def check_toml(path: Path, settings_model: type[BaseModel]) -> None:
    """Refuse an unreadable or invalid TOML file, or one with a key ``settings_model`` lacks."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None

    def walk(table: Mapping[str, Any], model: type[BaseModel], prefix: str) -> None:
        fields = _model_fields(model)
        for key, value in table.items():
            if key not in fields:
                raise ConfigError(f"config: unknown key '{prefix}{key}' (in {path})")
            sub = fields[key]
            if sub is not None and isinstance(value, Mapping):
                walk(value, sub, f"{prefix}{key}.")

    walk(data, settings_model, "")


def check_env(environ: Mapping[str, str], settings_model: type[BaseModel]) -> None:
    """Refuse a ``CDC_OUTBOX_*`` variable that names no setting (and is not allowed)."""
    fields = _model_fields(settings_model)
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in ENV_ALLOWED:
            continue
        if upper.startswith(ENV_ALLOWED_PREFIXES):
            continue
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        model_fields: dict[str, type[BaseModel] | None] | None = fields
        for part in parts:
            if model_fields is None:  # below a free-form dict (kafka.config)
                break
            if part not in model_fields:
                raise ConfigError(f"config: unknown setting {name}")
            sub = model_fields[part]
            model_fields = _model_fields(sub) if sub is not None else None


_PLAIN_TYPES = {
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_parsing": "must be a number",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a table",
    "model_type": "must be a table",
    "missing": "is required",
}


def describe(exc: ValidationError) -> str:
    """One line for the first validation error, never echoing secret input."""
    errors = exc.errors(include_url=False)
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return _describe_one(errors[0]) + more


def _describe_one(err: Any) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "value_error":
        return f"config: {ctx.get('error', err['msg'])}"
    if kind == "extra_forbidden":
        return f"config: unknown key '{loc}'"  # TOML keys were checked (with path) earlier
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<"}.get(kind, "<=")
        limit = next(iter(ctx.values()), "?")
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        hint = ""
        if loc == "status_interval_s" and op == "<":
            hint = " (PostgreSQL's default wal_sender_timeout is 60 s)"
        return f"config: {loc} must be {op} {limit}{hint}"
    if kind == "literal_error":
        return f"config: {loc} must be {ctx.get('expected', 'one of the allowed values')}"
    if kind in _PLAIN_TYPES:
        return f"config: {loc} {_PLAIN_TYPES[kind]}"
    return f"config: {loc}: {err['msg']}"


def parse_standby_names(value: str) -> frozenset[str] | None:
    """``"a, b"`` -> ``{"a", "b"}``; ``"*"`` -> ``None`` (any standby). Empty names refused."""
    names = [n.strip() for n in value.split(",")]
    if names == ["*"]:
        return None
    if any(not n or n == "*" for n in names):
        raise ValueError(
            f"wait_for_standbys {value!r}: give comma-separated application_names, or *"
        )
    return frozenset(names)
