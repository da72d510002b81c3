"""``cdc-outbox <cmd> --help``: every description reads unbroken (no line break mid-sentence).

Rich rewraps help text to the terminal but keeps the line breaks it is given, so a hard-wrapped
docstring shows as ``pending rows, dead`` / ``letters`` however wide the terminal is. With a
terminal far wider than any sentence, every description line must end a sentence.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from cdc_outbox.cli import app
from cdc_outbox.cli.help_text import unwrap

WIDTH = 2000  # wider than any paragraph
_ENDS = (".", ":", "!", "?")


def _paths(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _paths(sub, (*path, name))


PATHS = list(_paths(typer.main.get_command(app)))


def _help(path: tuple[str, ...]) -> str:
    env = {"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": str(WIDTH)}
    result = CliRunner().invoke(app, [*path, "--help"], env=env, terminal_width=WIDTH)
    assert result.exit_code == 0, result.output
    return result.output


def _description_lines(text: str) -> Iterator[str]:
    """The description lines: free text after ``Usage:`` and the Commands panel's rows."""
    panel = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.startswith("╭"):
            panel = line.strip("╭─╮ ").split(" ")[0]
        elif line.startswith("╰"):
            panel = ""
        elif panel == "Commands" and line.startswith("│"):
            yield line.strip("│ ")
        elif not panel and line.strip() and not line.lstrip().startswith("Usage:"):
            yield line.strip()


def test_every_command_is_checked() -> None:
    names = {" ".join(p) for p in PATHS}
    assert {"", "status", "consume", "sql", "schemas check", "config show"} <= names
    assert len(PATHS) >= 15


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "cdc-outbox")
def test_help_has_no_line_break_inside_a_sentence(path: tuple[str, ...]) -> None:
    lines = list(_description_lines(_help(path)))
    assert lines, "no description"
    broken = [line for line in lines if not line.endswith(_ENDS)]
    assert not broken, f"line breaks inside a sentence: {broken}"


def test_unwrap_joins_paragraph_lines_and_keeps_paragraphs_and_list_items() -> None:
    text = """First line
        goes on.

        Second paragraph:
        - item one
          continued
        - item two
        """
    assert unwrap(text) == (
        "First line goes on.\n\nSecond paragraph:\n- item one continued\n- item two"
    )
