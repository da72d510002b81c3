"""The benchmarks' one entry point, ``python -m benchmarks NAME`` (benchmarks/cli.py): every
benchmark is listed and answers ``--help`` without starting a server, an unknown NAME is one
line and exit 2, a run writes the tracked results only when asked, and benchmarks/results and
benchmarks/RESULTS.md hold one entry per benchmark."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import output
from benchmarks.cli import BENCHMARKS

ROOT = Path(__file__).resolve().parents[2]
#: Today's benchmarks: the former subcommands and the former ``python -m benchmarks.X`` scripts.
NAMES = {
    "relay",
    "compare",
    "consume",
    "relay-cost",
    "encode-cost",
    "latency-legs",
    "latency-floor",
    "producer-flush",
    "table-less-cost",
    "outboxes",
    "debezium",
    "caught-up-cpu",
}


def _benchmarks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "200"},  # argparse's help unwrapped
    )


def test_help_lists_every_benchmark() -> None:
    done = _benchmarks("--help")
    assert done.returncode == 0, done.stderr
    listed = {m.group(1) for m in re.finditer(r"^  (\S+)  ", done.stdout, re.MULTILINE)}
    assert listed == NAMES == set(BENCHMARKS)


def test_an_unknown_name_is_one_line_and_exit_2() -> None:
    done = _benchmarks("no-such-bench", "--events", "1")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "'no-such-bench'" in done.stderr, done.stderr


def test_no_name_is_the_usage_and_exit_2() -> None:
    done = _benchmarks()
    assert done.returncode == 2 and "relay" in done.stderr and done.stdout == ""


@pytest.mark.parametrize("name", sorted(NAMES))
def test_each_benchmark_answers_help(name: str) -> None:
    done = _benchmarks(name, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m benchmarks {name} ")
    assert "--json" in done.stdout and "--write-results" in done.stdout
    assert f"benchmarks/out/{name}.json" in done.stdout


def test_a_run_writes_the_tracked_results_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "RESULTS_DIR", tmp_path / "results")
    parser = output.parser("relay")
    args = parser.parse_args(["--json", str(tmp_path / "run.json")])
    assert output.save("relay", {"x": 1}, args) == [tmp_path / "run.json"]
    assert not (tmp_path / "results").exists()
    assert parser.parse_args([]).json == output.OUT_DIR / "relay.json"
    args = argparse.Namespace(json=tmp_path / "run2.json", write_results=True)
    output.save("relay", {"x": 2}, args)
    assert (tmp_path / "results" / "relay.json").read_text() == '{\n  "x": 2\n}\n'


def test_results_hold_one_json_per_benchmark() -> None:
    files = {p.name for p in (ROOT / "benchmarks" / "results").iterdir()}
    assert files <= {f"{name}.json" for name in NAMES}, sorted(files)


def test_results_md_has_one_row_per_benchmark() -> None:
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    # One row per benchmark ("| `NAME` |"), and rows for a part of one ("| `NAME` (`--opt`) |")
    # name a benchmark too.
    rows = re.findall(r"^\| `([a-z-]+)` \|", text, re.MULTILINE)
    assert sorted(rows) == sorted(NAMES)
    assert set(re.findall(r"^\| `([^`]+)`", text, re.MULTILINE)) == NAMES
