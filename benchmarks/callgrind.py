"""Instruction counts of a benchmark module's ``--child WHAT --events N`` run under valgrind's
callgrind (repeatable whatever the host's load), shared by :mod:`benchmarks.encode_cost` and
:mod:`benchmarks.relay_cost`."""

from __future__ import annotations

import re
import subprocess
import sys


def instructions(module: str, what: str, n: int) -> int:
    """Instructions of ``python -m module --child what --events n`` (start-up included)."""
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-m",
            module,
            "--child",
            what,
            "--events",
            str(n),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output: {done.stderr[-300:]}")
    return int(found.group(1))


def marginal(module: str, what: str, n: int) -> int:
    """Instructions of ``5 * n`` more events: the run of ``6 * n`` less the run of ``n``, so
    start-up and set-up cancel out."""
    return instructions(module, what, 6 * n) - instructions(module, what, n)
