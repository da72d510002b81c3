"""Commit-to-acknowledgement latency: a histogram the relay thread writes, and its quantiles
(pure, no I/O). Read by the metrics collector and the slot monitor."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

__all__ = ["LATENCY_BUCKETS", "LatencyHistogram", "quantile"]

#: Upper bounds (seconds) of the commit-to-acknowledgement latency buckets.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip


class LatencyHistogram:
    """Cumulative-on-read histogram of commit-to-ack latency, weighted by events.

    ``observe(seconds, events)`` matches ``RelayStats.latency_observers``: a transaction whose
    last event was acknowledged ``seconds`` after its commit adds ``events`` observations.
    """

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last slot: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float, events: int) -> None:
        seconds = max(seconds, 0.0)  # clocks of the server and this host may differ a little
        self.counts[bisect.bisect_left(self.bounds, seconds)] += events
        self.sum += seconds * events
        self.count += events

    def snapshot(self) -> tuple[list[int], float, int]:
        """(per-bucket counts, sum, count), copied."""
        return list(self.counts), self.sum, self.count


def quantile(bounds: Sequence[float], counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile of per-bucket ``counts`` (linear within a bucket, as PromQL's
    ``histogram_quantile``); ``None`` without observations. Above the last bound: that bound."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i >= len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i > 0 else 0.0
            return lower + (bounds[i] - lower) * ((rank - seen) / n)
        seen += n
    return bounds[-1]
