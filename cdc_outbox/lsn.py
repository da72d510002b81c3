"""PostgreSQL log sequence numbers (pure, no I/O)."""

from __future__ import annotations

import re

_LSN_RE = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


class Lsn(int):
    """A WAL position: a 64-bit unsigned integer shown as ``HI/LO`` in hex.

    Ordering and arithmetic are those of ``int``; ``str()`` gives PostgreSQL's text form.
    """

    __slots__ = ()

    MAX = (1 << 64) - 1

    def __new__(cls, value: int = 0) -> Lsn:
        if not 0 <= value <= cls.MAX:
            raise ValueError(f"LSN out of range: {value}")
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """Parse ``'16/B374D848'``; raises ``ValueError`` on anything else."""
        m = _LSN_RE.match(text.strip())
        if m is None:
            raise ValueError(f"not an LSN: {text!r}")
        return cls((int(m.group(1), 16) << 32) | int(m.group(2), 16))

    def __str__(self) -> str:
        return f"{int(self) >> 32:X}/{int(self) & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"


ZERO = Lsn(0)
