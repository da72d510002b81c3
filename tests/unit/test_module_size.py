"""Modules stay small enough to read in one sitting (house rule: at most 400 lines); a module
that grows past it is split by job."""

from __future__ import annotations

from pathlib import Path

import cdc_outbox

PACKAGE = Path(cdc_outbox.__file__).parent
MAX_LINES = 400

#: Modules (relative to the package) allowed over the limit: none.
NOT_YET_SPLIT: frozenset[str] = frozenset()


def oversized(root: Path = PACKAGE) -> dict[str, int]:
    """``module path: lines`` of every module under ``root`` longer than ``MAX_LINES``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            out[path.relative_to(root).as_posix()] = lines
    return out


def test_every_module_is_at_most_400_lines() -> None:
    found = {p: n for p, n in oversized().items() if p not in NOT_YET_SPLIT}
    assert not found, f"modules over {MAX_LINES} lines (split them by job): {found}"


def test_a_planted_long_module_is_found(tmp_path: Path) -> None:
    (tmp_path / "fits.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert oversized(tmp_path) == {"long.py": MAX_LINES + 1}
