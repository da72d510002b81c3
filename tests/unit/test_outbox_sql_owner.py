"""Statements on the outbox database's own tables belong to ``store/`` (issue 35: ``store/``
owns the outbox row): no module outside ``store/`` composes a ``sql.SQL`` statement that reads
or writes a table given as a placeholder (``FROM {``, ``JOIN {``, ``INSERT INTO {``,
``UPDATE {``, ``DELETE FROM {``): the outbox tables and the relay state table are only ever
named that way. The writer (``writer/``, the application's end of the outbox, which may not
import the relay) is the one exception. Statements on the server's catalog or replication
commands name their relations literally and are not flagged."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import cdc_outbox

PACKAGE = Path(cdc_outbox.__file__).parent

#: Top-level folders whose modules may build statements on outbox tables.
OWNERS = frozenset({"store", "writer"})

_ON_A_TABLE = re.compile(r"\b(?:FROM|JOIN|INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\{", re.I)


def _is_sql_call(node: ast.Call) -> bool:
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "SQL") or (
        isinstance(func, ast.Name) and func.id == "SQL"
    )


def _text(node: ast.expr) -> str:
    """The literal text of a ``sql.SQL`` argument (f-string parts and ``+`` joined)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) if isinstance(v, ast.Constant) else "{" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    return ""


def statements_outside_store(root: Path = PACKAGE) -> list[str]:
    """``path:line`` of every ``sql.SQL`` statement on a table placeholder outside the
    owners under ``root``."""
    out: list[tuple[str, int]] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] in OWNERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and _is_sql_call(node) and node.args):
                continue
            if _ON_A_TABLE.search(_text(node.args[0])):
                out.append((relative.as_posix(), node.lineno))
    return [f"{path}:{line}" for path, line in sorted(out)]


def test_no_statement_on_an_outbox_table_is_built_outside_store() -> None:
    found = statements_outside_store()
    assert not found, f"statements on outbox tables built outside store/ (ask store/): {found}"


def test_the_scan_finds_a_planted_statement(tmp_path: Path) -> None:
    for owner in ("store", "writer"):
        (tmp_path / owner).mkdir()
        (tmp_path / owner / "own.py").write_text('Q = sql.SQL("DELETE FROM {} WHERE id = %s")\n')
    (tmp_path / "mode").mkdir()
    (tmp_path / "mode" / "planted.py").write_text(
        "from psycopg import sql\n"
        "from psycopg.sql import SQL\n"
        'CATALOG = sql.SQL("SELECT 1 FROM pg_replication_slots WHERE slot_name = {}")\n'
        'A = sql.SQL("SELECT {} FROM {} ORDER BY {}")\n'
        'B = SQL("UPDATE {t} SET x = 1")\n'
        'C = sql.SQL("INSERT INTO {} (a) VALUES (%s)")\n'
        'D = sql.SQL("WITH b AS (SELECT 1)" " DELETE FROM {t} AS o USING b")\n'
        'E = sql.SQL("SELECT 1 FROM a LEFT JOIN {h} ON true")\n'
        'F = sql.SQL("SELECT count(*) from {}")\n'
        "prose = 'SELECT count(*) FROM {}'  # not a statement\n"
    )
    assert statements_outside_store(tmp_path) == [
        f"mode/planted.py:{n}" for n in (4, 5, 6, 7, 8, 9)
    ]
