"""docs/configuration.md documents every setting, and only settings that exist.

Keys are collected from the Settings model (nested tables as ``table.key``) and compared with
the backticked keys in the first column of the reference tables of docs/configuration.md.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from cdc_outbox.config import Settings

_MISSING = object()
DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _setting_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys |= _setting_keys(ann, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def _documented_keys(text: str) -> set[str]:
    """Backticked names in the first cell of table rows whose header is ``| key |``."""
    keys: set[str] = set()
    in_table = False
    for line in text.splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not in_table:
            in_table = cells[0] == "key"
            continue
        keys.update(re.findall(r"`([a-z_][a-z0-9_.]*)`", cells[0]))
    return keys


def test_collector_sees_nested_tables() -> None:
    keys = _setting_keys(Settings)
    assert {"dsn", "polling.batch_size", "eos.max_events", "columns.preset"} <= keys
    assert "polling" not in keys


def test_every_setting_is_documented() -> None:
    missing = sorted(_setting_keys(Settings) - _documented_keys(DOC.read_text()))
    assert not missing, f"settings missing from docs/configuration.md key tables: {missing}"


def test_no_documented_setting_that_does_not_exist() -> None:
    extra = sorted(_documented_keys(DOC.read_text()) - _setting_keys(Settings))
    assert not extra, f"docs/configuration.md documents unknown settings: {extra}"


def test_documented_defaults_match() -> None:
    """Each key's first backticked default (one per key in its row) is the real default."""
    defaults = Settings.model_construct()
    wrong: list[str] = []
    in_table = False
    for line in DOC.read_text().splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not in_table:
            in_table = cells[0] == "key"
            continue
        keys = re.findall(r"`([a-z_][a-z0-9_.]*)`", cells[0])
        values = re.findall(r"`([^`]*)`", cells[1])
        if len(keys) == 1:
            values = values[:1]  # e.g. "`update` (`off` for the `debezium` preset)"
        if len(keys) != len(values) or not keys:
            continue
        for key, documented in zip(keys, values, strict=True):
            obj: object = defaults
            for part in key.split("."):
                obj = getattr(obj, part, _MISSING)
            if obj is _MISSING:
                continue  # an unknown key: test_no_documented_setting_that_does_not_exist
            actual = obj.get_secret_value() if hasattr(obj, "get_secret_value") else obj
            if isinstance(actual, bool):
                shown = "true" if actual else "false"
            elif isinstance(actual, dict):
                shown = "{}" if not actual else repr(actual)
            elif actual == "" or actual is None:
                shown = '""'
            else:
                shown = str(actual)
            if isinstance(actual, float) and documented == str(int(actual)):
                continue
            if documented != shown:
                wrong.append(f"{key}: documented {documented!r}, default {shown!r}")
    assert not wrong, "; ".join(wrong)
