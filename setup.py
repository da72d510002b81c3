"""Build hook (the metadata is in pyproject.toml): compiles the relay's per-event decode,
``cdc_outbox/pgwire/insert_row.py``, with mypyc. Without a C compiler, or with
``CDC_OUTBOX_PURE_PYTHON=1``, the package is built as plain Python instead: same behaviour,
a slower relay (the build says so in one warning)."""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

COMPILED_MODULES = ["cdc_outbox/pgwire/insert_row.py"]


def _warn(what: str, exc: BaseException) -> None:
    print(
        f"warning: cdc-outbox: {what} ({type(exc).__name__}: {exc});"
        " building pure Python (same behaviour, a slower relay)",
        file=sys.stderr,
    )


class OptionalBuildExt(build_ext):
    """``build_ext`` that falls back to the pure-Python module when compiling fails."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, no Python headers, ...
            _warn("the mypyc extension could not be built", exc)

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            _warn(f"{ext.name} could not be compiled", exc)


def ext_modules() -> list[Any]:
    if os.environ.get("CDC_OUTBOX_PURE_PYTHON") == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        _warn("mypyc is not available", exc)
        return []
    try:
        return list(mypycify(COMPILED_MODULES, opt_level="3"))
    except (Exception, SystemExit) as exc:
        _warn("mypyc could not translate the module", exc)
        return []


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
