"""Retry back-off, the one rule every retry loop uses (pure, no I/O).

:func:`doubling`: the delay after failed attempt ``attempt`` (1-based) is ``first`` doubled per
further attempt, capped at ``cap``. :class:`Backoff` is the same rule as a loop's state: each
:meth:`~Backoff.failed` returns the delay to wait now and doubles the next one; :meth:`~Backoff.
reset` (after a success) starts again at ``first``.
"""

from __future__ import annotations

__all__ = ["Backoff", "doubling"]

#: 2**60 times any positive delay is past every cap; larger exponents would overflow a float.
_MAX_EXPONENT = 60


def doubling(attempt: int, first: float, cap: float) -> float:
    """``min(cap, first * 2**(attempt - 1))``; attempts below 1 count as 1."""
    return float(min(cap, first * 2.0 ** min(max(attempt - 1, 0), _MAX_EXPONENT)))


class Backoff:
    """A retry loop's current delay (see the module rule)."""

    __slots__ = ("_cap", "_delay", "_first")

    def __init__(self, first: float, cap: float) -> None:
        self._first = first
        self._cap = cap
        self._delay = first

    @property
    def delay(self) -> float:
        """The delay the next failure waits."""
        return self._delay

    def failed(self, cap: float | None = None) -> float:
        """A failure: the delay to wait now; the next one doubles, up to ``cap`` (default: the
        loop's cap)."""
        delay = self._delay
        self._delay = min(delay * 2, self._cap if cap is None else cap)
        return delay

    def reset(self) -> None:
        """A success: the next failure waits ``first`` again."""
        self._delay = self._first
