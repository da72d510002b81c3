"""Test modules share helpers through tests/support/, never through each other (issue 35): a
module under tests/unit or tests/integration that imports from another ``tests.unit.*`` or
``tests.integration.*`` module couples two tests' private details and runs one test file's
module-level code for the other."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TEST_PACKAGES = ("unit", "integration")

#: (importer, imported module) pairs allowed anyway: none (the relay restart ``Harness`` is
#: tests/support/relay_harness.py).
EXEMPT: set[tuple[str, str]] = set()


def imported_modules(path: Path, root: Path) -> set[str]:
    """Dotted names of the modules ``path`` imports (any depth: also inside functions) that
    exist under ``root`` (a tests/ directory); a relative import is resolved against
    ``path``'s package, and ``from package import name`` counts when ``name`` is a module."""
    package = path.relative_to(root.parent).with_suffix("").parts[:-1]
    candidates: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            candidates.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            candidates.add(module)
            candidates.update(f"{module}.{alias.name}" for alias in node.names)
    return {
        name
        for name in candidates
        if root.parent.joinpath(*name.split(".")).with_suffix(".py").is_file()
    }


def cross_test_imports(root: Path) -> list[str]:
    """``"<file>: <module>"`` for each import of a test module by another one under ``root``
    (a tests/ directory), the exemptions left out."""
    prefixes = tuple(f"{root.name}.{package}." for package in TEST_PACKAGES)
    found = []
    for package in TEST_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            for module in sorted(imported_modules(path, root)):
                if module.startswith(prefixes) and (name, module) not in EXEMPT:
                    found.append(f"{name}: {module}")
    return found


def test_no_test_module_imports_another_test_module() -> None:
    assert cross_test_imports(TESTS) == []


PLANTED = (
    "from tests.integration.test_b import HELPER",
    "def test_x() -> None:\n    from .test_b import HELPER",
    "import tests.unit.test_c",
    "from tests.integration import test_b",
    "from . import test_b as b",
    "from ..unit.test_c import scrape",
)


def test_the_scan_finds_every_form_of_a_planted_import(tmp_path: Path) -> None:
    root = tmp_path / "tests"
    for package in (*TEST_PACKAGES, "support"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "support" / "helpers.py").write_text("def wait_until() -> None: ...\n")
    (root / "integration" / "test_b.py").write_text(
        "from tests.support.helpers import wait_until\n"
    )
    (root / "unit" / "test_c.py").write_text("scrape = None\n")
    for n, text in enumerate(PLANTED):
        (root / "integration" / f"test_a{n}.py").write_text(text + "\n")
    assert cross_test_imports(root) == [
        "integration/test_a0.py: tests.integration.test_b",
        "integration/test_a1.py: tests.integration.test_b",
        "integration/test_a2.py: tests.unit.test_c",
        "integration/test_a3.py: tests.integration.test_b",
        "integration/test_a4.py: tests.integration.test_b",
        "integration/test_a5.py: tests.unit.test_c",
    ]
