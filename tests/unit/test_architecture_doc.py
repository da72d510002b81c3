"""docs/architecture.md's layer diagram is the layers contract of pyproject.toml (the one
``lint-imports`` checks): same layers, same order, same siblings. The diagram cannot drift."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _contract() -> list[frozenset[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return [frozenset(part.strip() for part in layer.split("|")) for layer in layers]


def _diagram() -> list[frozenset[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1]
    block = section.split("```", 2)[1]
    layers = []
    for line in block.splitlines()[1:]:  # the first line is the fence's language (none)
        if not line.strip() or line.startswith(" "):  # an indented line continues a comment
            continue
        spec = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        layers.append(frozenset(part.strip() for part in spec.split("|")))
    return layers


def test_the_diagram_is_the_layers_contract() -> None:
    diagram, contract = _diagram(), _contract()
    assert [sorted(x) for x in diagram] == [sorted(x) for x in contract]


def test_every_top_level_unit_is_in_the_contract() -> None:
    units = {p.stem for p in (ROOT / "cdc_outbox").iterdir() if p.suffix == ".py"}
    units |= {p.name for p in (ROOT / "cdc_outbox").iterdir() if (p / "__init__.py").exists()}
    units.discard("__init__")
    placed = set().union(*_contract())
    assert units == placed, (sorted(units - placed), sorted(placed - units))
