"""Where a benchmark's result goes: one JSON file, the same format for every benchmark."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_json(path: Path, result: Mapping[str, Any]) -> None:
    """``result`` as indented JSON, ending in a newline, at ``path`` (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
