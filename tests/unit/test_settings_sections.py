"""Settings below the code that uses them (issue 35): no class outside ``cdc_outbox/config/``
receives the whole ``Settings``, neither as an ``__init__`` parameter nor as an attribute;
each component takes only its section(s) (built by the functions of ``cdc_outbox/config/``).

The scan is syntactic (an AST walk over every module of the package outside ``config/``): a
parameter or attribute annotated ``Settings`` (also ``Settings | None``, quoted, dotted), an
``self.x = <a parameter annotated Settings>`` in a method, or a dataclass/class field
annotated ``Settings``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import cdc_outbox

PACKAGE = Path(cdc_outbox.__file__).parent

#: Classes still receiving the whole ``Settings`` (``module:Class``, module relative to the
#: package): none left; a class added here must say why.
NOT_YET_CONVERTED: frozenset[str] = frozenset()


def _mentions_settings(annotation: ast.expr | None) -> bool:
    """Whether ``annotation`` names ``Settings`` (a name, ``x.Settings``, a string, a union)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "Settings":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Settings":
            return True
    return False


def _class_violations(cls: ast.ClassDef) -> list[str]:
    found: list[str] = []
    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and _mentions_settings(item.annotation):
            found.append(f"attribute {ast.unparse(item.target)}")
        if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = item.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        typed = {a.arg for a in params if _mentions_settings(a.annotation)}
        if item.name == "__init__":
            found += [f"__init__ parameter {name}" for name in sorted(typed)]
        for node in ast.walk(item):
            if isinstance(node, ast.AnnAssign) and _mentions_settings(node.annotation):
                found.append(f"attribute {ast.unparse(node.target)}")
            elif (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Name)
                and node.value.id in typed
            ):
                found += [
                    f"attribute {ast.unparse(t)}"
                    for t in node.targets
                    if isinstance(t, ast.Attribute)
                ]
    return found


def violations(root: Path = PACKAGE) -> dict[str, list[str]]:
    """``module:Class`` -> how it receives the whole ``Settings``, for every class under
    ``root`` outside ``config/``."""
    out: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] == "config":
            continue
        module = ".".join(relative.with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and (found := _class_violations(node)):
                out[f"{module}:{node.name}"] = found
    return out


def test_no_class_outside_config_receives_the_whole_settings() -> None:
    found = violations()
    new = {name: how for name, how in found.items() if name not in NOT_YET_CONVERTED}
    assert not new, f"classes receiving the whole Settings (take its sections instead): {new}"


def test_the_exemption_list_names_only_classes_that_still_need_it() -> None:
    """A class converted is removed from ``NOT_YET_CONVERTED`` (it cannot slip back)."""
    stale = sorted(NOT_YET_CONVERTED - set(violations()))
    assert not stale, f"converted already, remove from NOT_YET_CONVERTED: {stale}"


def test_the_scan_finds_a_planted_violation(tmp_path: Path) -> None:
    """Each way of receiving the whole settings is found; sections and functions are not."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "x.py").write_text(
        "class Allowed:\n    def __init__(self, settings: Settings) -> None: ...\n"
    )
    (tmp_path / "mode").mkdir()
    (tmp_path / "mode" / "planted.py").write_text(
        "from cdc_outbox.config import settings as s\n"
        "class ByParameter:\n"
        "    def __init__(self, settings: Settings | None = None) -> None:\n"
        "        self.settings = settings\n"
        "class ByDottedString:\n"
        "    def __init__(self, *, cfg: 's.Settings') -> None: ...\n"
        "class ByField:\n"
        "    settings: Settings\n"
        "class ByAttribute:\n"
        "    def start(self) -> None:\n"
        "        self._s: Settings = load()\n"
        "class BySection:\n"
        "    def __init__(self, section: DeliverySection) -> None:\n"
        "        self.section = section\n"
        "def a_function(settings: Settings) -> None: ...\n"
    )
    assert violations(tmp_path) == {
        "mode.planted:ByParameter": ["__init__ parameter settings", "attribute self.settings"],
        "mode.planted:ByDottedString": ["__init__ parameter cfg"],
        "mode.planted:ByField": ["attribute settings"],
        "mode.planted:ByAttribute": ["attribute self._s"],
    }
