"""What becomes of a claimed row: the outcome names, the retry backoff, and the parameters
with which :mod:`cdc_outbox.polling.sql`'s ``mark_outcomes`` writes rows given back. Pure."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol

from cdc_outbox.backoff import doubling
from cdc_outbox.config_models import PollingSettings

__all__ = ["BACK", "DEAD", "OK", "RETRY", "GivenBack", "backoff_delay", "outcome_params"]

#: Row outcomes: acknowledged, dead-lettered (already FAILED), retried, given back unsent.
OK, DEAD, RETRY, BACK = "ok", "dead", "retry", "back"


class GivenBack(Protocol):
    """A claimed row that was not published (see ``PollingRelay``'s rows)."""

    id: Any
    outcome: str | None
    error: str | None


def backoff_delay(failures: int, base: float, cap: float, rand: float) -> float:
    """Seconds before attempt ``failures + 1``: ``min(cap, base * 2**(failures-1))`` scaled by
    a jitter factor in [0.5, 1.0] (``rand`` in [0, 1))."""
    return doubling(failures, base, cap) * (0.5 + 0.5 * rand)


def outcome_params(
    rows: Sequence[GivenBack], polling: PollingSettings, worker_id: str, rng: random.Random
) -> dict[str, Any]:
    """Parameters of ``mark_outcomes``: backoff and error per row given back."""
    delays: list[float | None] = []
    for r in rows:
        delay = None
        if r.outcome == RETRY:
            delay = backoff_delay(1, polling.backoff_base_s, polling.backoff_max_s, rng.random())
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
