"""One preflight result (:class:`Check`), shared by the preflight and failover checks."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Check"]


@dataclass(frozen=True, slots=True)
class Check:
    """One preflight result; ``fix`` says what to do when ``ok`` is false or ``warning`` is
    set (passed, but worth changing: ``init`` logs it as a WARNING)."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    warning: bool = False
