"""Instruction counts of a benchmark's ``--child WHAT --events N`` run under valgrind's
callgrind (repeatable whatever the host's load), and the command line of such a benchmark
(:func:`main`), shared by :mod:`benchmarks.encode_cost` and :mod:`benchmarks.relay_cost`."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import output


def instructions(name: str, what: str, n: int) -> int:
    """Instructions of ``python -m benchmarks name --child what --events n`` (start-up
    included; its ``--json`` goes to the untracked default, unused)."""
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-m",
            "benchmarks",
            name,
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


def marginal(name: str, what: str, n: int) -> int:
    """Instructions of ``5 * n`` more events: the run of ``6 * n`` less the run of ``n``, so
    start-up and set-up cancel out."""
    return instructions(name, what, 6 * n) - instructions(name, what, n)


def main(
    argv: list[str],
    *,
    name: str,
    description: str,
    children: Sequence[str],
    child: Callable[[str, int], None],
    measure: Callable[[int], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
) -> int:
    """``python -m benchmarks name [--events N] [--json PATH] [--write-results]``:
    ``measure(N)`` under callgrind, its ``report`` printed and the result saved
    (:func:`benchmarks.output.save`); run by :func:`instructions` as ``--child WHAT`` (``none``
    or one of ``children``), it is ``child(WHAT, N)``. Exit 2 for a bad ``--events`` or
    without valgrind."""
    parser = output.parser(name, description)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--child", choices=["none", *children], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.events < 1:
        print(f"{name}: --events must be at least 1", file=sys.stderr)
        return 2
    if args.child:
        child(args.child, args.events)
        return 0
    if shutil.which("valgrind") is None:
        print(f"{name}: valgrind not found (apt-get install valgrind)", file=sys.stderr)
        return 2
    result = measure(args.events)
    print(report(result))
    output.save(name, result, args)
    return 0
