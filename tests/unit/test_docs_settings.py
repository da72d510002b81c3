"""docs/configuration.md documents every setting, and only settings that exist.

Keys are collected from the models (relay ``Settings`` with its nested tables as ``table.key``;
``ConsumerSettings``) and compared with the backticked names in the first column of the
reference tables of docs/configuration.md: ``| key |`` tables for the relay, ``| field |``
for the consumer. Single defaults given in backticks are compared with the models' defaults.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from cdc_outbox.config.settings import Settings
from cdc_outbox.consumer.settings import ConsumerSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
_MISSING = object()


def _setting_keys(model: type[BaseModel], prefix: str = "", nested: bool = True) -> set[str]:
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        ann = field.annotation
        if nested and isinstance(ann, type) and issubclass(ann, BaseModel):
            keys |= _setting_keys(ann, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def _rows(text: str, header: str) -> Iterator[list[str]]:
    """Cells of the body rows of every table whose first header cell is ``header``."""
    in_table = False
    for line in text.splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not in_table:
            in_table = cells[0] == header
            continue
        if set(cells[0]) <= set("-: "):
            continue
        yield cells


def _documented_keys(text: str, header: str = "key") -> set[str]:
    keys: set[str] = set()
    for cells in _rows(text, header):
        keys.update(re.findall(r"`([a-z_][a-z0-9_.]*)`", cells[0]))
    return keys


def _shown(value: object) -> str:
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{}" if not value else repr(value)
    if value == "" or value is None:
        return '""'
    return str(value)


def _wrong_defaults(text: str, header: str, defaults: object) -> list[str]:
    """Each key's first backticked default (one per key in its row) against the model's."""
    wrong: list[str] = []
    for cells in _rows(text, header):
        keys = re.findall(r"`([a-z_][a-z0-9_.]*)`", cells[0])
        values = re.findall(r"`([^`]*)`", cells[1])
        if len(keys) == 1:
            values = values[:1]  # e.g. "`update` (`off` for the `debezium` preset)"
        if not keys or len(keys) != len(values):
            continue
        for key, documented in zip(keys, values, strict=True):
            obj: object = defaults
            for part in key.split("."):
                obj = getattr(obj, part, _MISSING)
            if obj is _MISSING:
                continue  # an unknown key: reported by the "does not exist" tests
            if isinstance(obj, BaseModel):
                continue  # a whole table
            shown = _shown(obj)
            if isinstance(obj, float) and documented == str(int(obj)):
                continue
            if documented != shown:
                wrong.append(f"{key}: documented {documented!r}, default {shown!r}")
    return wrong


def _consumer_defaults() -> ConsumerSettings:
    return ConsumerSettings.model_construct(
        **{
            name: field.get_default(call_default_factory=True)
            for name, field in ConsumerSettings.model_fields.items()
            if not field.is_required()
        }
    )


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
    wrong = _wrong_defaults(DOC.read_text(), "key", Settings.model_construct())
    assert not wrong, "; ".join(wrong)


def test_consumer_settings_documented_exactly() -> None:
    fields = _setting_keys(ConsumerSettings, nested=False)
    documented = _documented_keys(DOC.read_text(), "field")
    assert fields == documented, (
        f"missing: {sorted(fields - documented)}; unknown: {sorted(documented - fields)}"
    )


def test_consumer_defaults_match() -> None:
    wrong = _wrong_defaults(DOC.read_text(), "field", _consumer_defaults())
    assert not wrong, "; ".join(wrong)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("| `max_in_flight` | `50000`", "| `max_in_flight` | `5000`"),
        ("| `mode` | `auto` |", "| `modus` | `auto` |"),
        ("| `health.loop_stale_s` |", "| health.loop_stale_s |"),
        ("| `poll_batch` | `500` |", "| `poll_batch` | `50` |"),
    ],
)
def test_checks_can_fail(before: str, after: str) -> None:
    """A wrong default, an unknown key and an undocumented key are each caught."""
    text = DOC.read_text()
    assert text.count(before) == 1
    text = text.replace(before, after)
    problems = (
        sorted(_setting_keys(Settings) ^ _documented_keys(text))
        + _wrong_defaults(text, "key", Settings.model_construct())
        + sorted(_setting_keys(ConsumerSettings, nested=False) ^ _documented_keys(text, "field"))
        + _wrong_defaults(text, "field", _consumer_defaults())
    )
    assert problems
