"""Retry back-off, the one rule every retry loop uses (pure, no I/O).

:class:`BackoffPolicy` holds a loop's bounds: the delay after failed attempt ``attempt``
(1-based) is ``base_s`` doubled per further attempt, capped at ``max_s``
(:meth:`BackoffPolicy.delay`, :func:`doubling`). Call sites receive a policy, never literals:
the settings give theirs (``PollingSettings.backoff``, ``ConsumerSettings.retry_backoff``),
the loops without a setting use the named policies below, whose bounds live only here.
:class:`Backoff` is the same rule as a loop's state: each :meth:`~Backoff.failed` returns the
delay to wait now and doubles the next one; :meth:`~Backoff.reset` (after a success) starts
again at ``base_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RECONNECT", "STARTUP", "Backoff", "BackoffPolicy", "doubling"]

#: 2**60 times any positive delay is past every cap; larger exponents would overflow a float.
_MAX_EXPONENT = 60


def doubling(attempt: int, first: float, cap: float) -> float:
    """``min(cap, first * 2**(attempt - 1))``; attempts below 1 count as 1."""
    return float(min(cap, first * 2.0 ** min(max(attempt - 1, 0), _MAX_EXPONENT)))


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """The bounds of a retry loop: first delay ``base_s``, doubling up to ``max_s``."""

    base_s: float = 0.5
    max_s: float = 30.0

    def delay(self, attempt: int) -> float:
        """The delay after failed attempt ``attempt`` (1-based; below 1 counts as 1)."""
        return doubling(attempt, self.base_s, self.max_s)


#: Reconnecting loops (the relays, the service's restart of a failed relay).
RECONNECT = BackoffPolicy()
#: Waiting for PostgreSQL before a run (``startup.check_before_run``): short, it is probed.
STARTUP = BackoffPolicy(max_s=5.0)


class Backoff:
    """A retry loop's current delay under ``policy`` (see the module rule)."""

    __slots__ = ("_cap", "_delay", "_first")

    def __init__(self, policy: BackoffPolicy = RECONNECT) -> None:
        self._first = policy.base_s
        self._cap = policy.max_s
        self._delay = policy.base_s

    @property
    def delay(self) -> float:
        """The delay the next failure waits."""
        return self._delay

    def failed(self, cap: float | None = None) -> float:
        """A failure: the delay to wait now; the next one doubles, up to ``cap`` (default: the
        policy's ``max_s``)."""
        delay = self._delay
        self._delay = min(delay * 2, self._cap if cap is None else cap)
        return delay

    def reset(self) -> None:
        """A success: the next failure waits ``base_s`` again."""
        self._delay = self._first
