"""Help text as typer/rich should get it: one line per paragraph.

Rich rewraps help to the terminal but keeps every line break it is given, so a docstring
hard-wrapped for the source would show broken mid-sentence. :func:`unwrap_help` gives every
command of an app (sub-apps included) its docstring with the lines of each paragraph joined;
blank lines between paragraphs and list items (``- ``/``* ``) keep their breaks.
"""

from __future__ import annotations

import inspect

import typer

__all__ = ["unwrap", "unwrap_help"]

_ITEM = ("- ", "* ")


def unwrap(text: str) -> str:
    """``text`` (dedented) with each paragraph's lines joined by single spaces."""
    paragraphs = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        lines: list[str] = []
        for raw in paragraph.splitlines():
            line = raw.strip()
            if lines and line and not line.startswith(_ITEM):
                lines[-1] = f"{lines[-1]} {line}"
            elif line:
                lines.append(line)
        paragraphs.append("\n".join(lines))
    return "\n\n".join(p for p in paragraphs if p)


def unwrap_help(app: typer.Typer) -> None:
    """Set every command's ``help`` (and each sub-app's) to its unwrapped text, in place.

    Call after every command is registered; explicit ``help=`` strings are unwrapped too.
    """
    for command in app.registered_commands:
        text = command.help if command.help is not None else inspect.getdoc(command.callback)
        if text:
            command.help = unwrap(text)
    if isinstance(app.info.help, str):
        app.info.help = unwrap(app.info.help)
    for group in app.registered_groups:
        if isinstance(group.help, str):
            group.help = unwrap(group.help)
        if isinstance(group.typer_instance, typer.Typer):
            unwrap_help(group.typer_instance)
