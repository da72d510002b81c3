"""Several outbox tables (issue 36): outside the settings modules, nothing reads the
single-table keys of ``Settings`` (they are only the one-entry form of ``[[outboxes]]``); code
asks ``Settings.outbox_settings()``/``outbox(name)`` or an ``OutboxTable``. A read of
``settings.outbox_table`` would silently serve the first table only."""

from __future__ import annotations

import ast
from pathlib import Path

import cdc_outbox
from cdc_outbox.config.models import OUTBOX_KEYS

PACKAGE = Path(cdc_outbox.__file__).resolve().parent
FORBIDDEN = set(OUTBOX_KEYS) | {"outboxes"}


def _settings_like(node: ast.expr) -> bool:
    """``settings``, ``self.settings``, ``self._settings``, ``cfg.settings`` ..."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return name.lstrip("_").endswith("settings")


def single_table_reads(source: str) -> list[tuple[int, str]]:
    """(line, key) of every ``<settings>.<single-table key>`` in ``source``."""
    return [
        (node.lineno, node.attr)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN and _settings_like(node.value)
    ]


def test_the_finder_finds_a_read() -> None:
    assert single_table_reads("x = self.settings.outbox_table\ny = settings.columns") == [
        (1, "outbox_table"),
        (2, "columns"),
    ]
    assert single_table_reads("x = outbox.columns; y = settings.outbox()") == []


def test_no_module_reads_the_single_table_keys() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{line}: {key}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "config"  # the settings package may
        for line, key in single_table_reads(path.read_text())
    ]
    assert found == []
