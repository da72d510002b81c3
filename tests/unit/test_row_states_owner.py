"""The outbox row's states belong to ``store/`` (issue 35: ``store/outbox_table.py`` owns the
outbox row): no code outside ``store/`` spells a row state, neither as a value
(``status == "FAILED"``) nor quoted in SQL (``status = 'FAILED'``); it asks
:class:`~cdc_outbox.store.outbox_table.OutboxTable`. Prose (docstrings, log text) may name
the states."""

from __future__ import annotations

import ast
from pathlib import Path

import cdc_outbox
from cdc_outbox.store.outbox_table import STATUSES

PACKAGE = Path(cdc_outbox.__file__).parent

#: Modules (relative to the package) still spelling a state, converted by their owners.
NOT_YET_CONVERTED: frozenset[str] = frozenset()


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def spelled_states(root: Path = PACKAGE) -> list[str]:
    """``path:line: literal`` of every row state spelled outside ``store/`` under ``root``."""
    quoted = [f"'{state}'" for state in STATUSES]
    out = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] == "store":
            continue
        tree = ast.parse(path.read_text(), str(path))
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if id(node) in docstrings:
                continue
            if node.value in STATUSES or any(q in node.value for q in quoted):
                out.append(f"{relative.as_posix()}:{node.lineno}: {node.value!r}")
    return out


def test_no_row_state_is_spelled_outside_store() -> None:
    found = [f for f in spelled_states() if f.split(":")[0] not in NOT_YET_CONVERTED]
    assert not found, f"row states spelled outside store/ (ask OutboxTable): {found}"


def test_the_scan_finds_a_planted_state(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "own.py").write_text('FAILED = "FAILED"\n')
    (tmp_path / "mode").mkdir()
    (tmp_path / "mode" / "planted.py").write_text(
        '"""Rows go PENDING -> PUBLISHED."""\n'
        "def f(status: str) -> bool:\n"
        '    """Whether it is FAILED."""\n'
        '    print("marked FAILED")\n'
        '    return status == "FAILED" or bool("WHERE status = \'PENDING\'")\n'
    )
    assert spelled_states(tmp_path) == [
        "mode/planted.py:5: 'FAILED'",
        "mode/planted.py:5: \"WHERE status = 'PENDING'\"",
    ]
