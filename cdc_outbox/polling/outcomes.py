"""What becomes of a claimed row: the outcome names, the retry backoff, and the parameters
with which :mod:`cdc_outbox.store.polling_sql`'s ``mark_outcomes`` writes rows given back. Pure.

A retried row waits :func:`backoff_delay` of its failures in a row: :class:`RetryCounts`
counts them per row id, in the worker's memory (a retry does not use one of the row's
``attempts``, which count expired leases). A row published or dead-lettered is forgotten;
one given back unsent keeps its count. A row another worker claims next (or after a restart)
starts again at ``backoff_base_s``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from cdc_outbox.config.backoff import BackoffPolicy
from cdc_outbox.config.models import PollingSettings

__all__ = [
    "BACK",
    "DEAD",
    "OK",
    "RETRY",
    "GivenBack",
    "RetryCounts",
    "backoff_delay",
    "outcome_params",
]

#: Row outcomes: acknowledged, dead-lettered (already FAILED), retried, given back unsent.
OK, DEAD, RETRY, BACK = "ok", "dead", "retry", "back"


class GivenBack(Protocol):
    """A claimed row that was not published (see ``PollingRelay``'s rows)."""

    id: Any
    outcome: str | None
    error: str | None


def backoff_delay(failures: int, policy: BackoffPolicy, rand: float) -> float:
    """Seconds before attempt ``failures + 1``: ``policy.delay(failures)`` scaled by a jitter
    factor in [0.5, 1.0] (``rand`` in [0, 1))."""
    return policy.delay(failures) * (0.5 + 0.5 * rand)


class RetryCounts:
    """Per row id, the retried failures in a row this worker wrote (at most ``limit`` rows
    remembered, the oldest forgotten first)."""

    __slots__ = ("_counts", "_limit")

    def __init__(self, limit: int = 100_000) -> None:
        self._counts: dict[Any, int] = {}
        self._limit = limit

    def failures(self, rows: Sequence[GivenBack]) -> dict[Any, int]:
        """The failures in a row of each retried row in ``rows``, this one included."""
        return {r.id: self._counts.get(r.id, 0) + 1 for r in rows if r.outcome == RETRY}

    def settle(self, rows: Sequence[GivenBack]) -> None:
        """``rows``' outcomes are written: count the retried, forget the published and
        dead-lettered."""
        counts = self._counts
        for r in rows:
            if r.outcome == RETRY:
                counts[r.id] = counts.pop(r.id, 0) + 1  # re-inserted: now the newest
            elif r.outcome in (OK, DEAD):
                counts.pop(r.id, None)
        while len(counts) > self._limit:
            del counts[next(iter(counts))]


def outcome_params(
    rows: Sequence[GivenBack],
    polling: PollingSettings,
    worker_id: str,
    rng: random.Random,
    failures: Mapping[Any, int] | None = None,
) -> dict[str, Any]:
    """Parameters of ``mark_outcomes``: backoff and error per row given back; a retried row
    waits the delay of its ``failures`` in a row (default 1)."""
    delays: list[float | None] = []
    for r in rows:
        delay = None
        if r.outcome == RETRY:
            n = failures.get(r.id, 1) if failures is not None else 1
            delay = backoff_delay(n, polling.backoff, rng.random())
        delays.append(delay)
    return {
        "ids": [r.id for r in rows],
        "bumps": [0] * len(rows),
        "delays": delays,
        "errors": [r.error for r in rows],
        "finals": [False] * len(rows),
        "max": polling.max_attempts,
        "me": worker_id,
    }
