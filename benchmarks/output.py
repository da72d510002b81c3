"""Where a benchmark's result goes: one JSON file, the same format for every benchmark.

By default a run writes ``benchmarks/out/NAME.json`` (untracked) or its ``--json`` path;
only ``--write-results`` also writes the tracked ``benchmarks/results/NAME.json``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "out"
RESULTS_DIR = HERE / "results"


def write_json(path: Path, result: Mapping[str, Any]) -> None:
    """``result`` as indented JSON, ending in a newline, at ``path`` (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def parser(name: str, description: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``python -m benchmarks NAME`` with the options every benchmark has:
    ``--json PATH`` (default ``benchmarks/out/NAME.json``) and ``--write-results``."""
    out = argparse.ArgumentParser(prog=f"python -m benchmarks {name}", description=description)
    out.add_argument(
        "--json",
        type=Path,
        default=OUT_DIR / f"{name}.json",
        metavar="PATH",
        help=f"write the result here (default: benchmarks/out/{name}.json, untracked)",
    )
    out.add_argument(
        "--write-results",
        action="store_true",
        help=f"also write the tracked benchmarks/results/{name}.json (the latest figure)",
    )
    return out


def save(name: str, result: Mapping[str, Any], args: argparse.Namespace) -> list[Path]:
    """Write ``result`` to ``args.json`` and, with ``--write-results``, to
    ``benchmarks/results/NAME.json``; print and return the paths written."""
    paths = [args.json]
    if args.write_results:
        paths.append(RESULTS_DIR / f"{name}.json")
    for path in paths:
        write_json(path, result)
        print(f"wrote {path}")
    return paths
