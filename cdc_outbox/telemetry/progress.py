"""Progress of a long job (a catch-up's backlog): rows done of a total, rate, ETA.

Pure: no I/O, no clock of its own (callers pass ``monotonic`` seconds). :class:`Progress`
holds the total (counted once at the start), rows done and when the job started;
:meth:`Progress.due` says when the next log line is due (at most one per ``interval``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Seconds between two progress log lines, at least.
LOG_INTERVAL = 10.0


@dataclass
class Progress:
    """Rows ``done`` of ``total`` since ``started`` (monotonic seconds)."""

    total: int
    started: float
    done: int = 0
    last_logged: float | None = None

    def rate(self, now: float) -> float:
        """Rows per second so far (0.0 before any time has passed)."""
        elapsed = now - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def eta(self, now: float) -> float | None:
        """Seconds left at the rate so far; None while no rate is known; 0.0 when done."""
        left = max(self.total - self.done, 0)
        if left == 0:
            return 0.0
        rate = self.rate(now)
        return left / rate if rate > 0 else None

    def fraction(self) -> float:
        """Done as a fraction in [0, 1] (1.0 for an empty job; rows added after the count
        may make ``done`` exceed ``total``)."""
        return 1.0 if self.total <= 0 else min(self.done / self.total, 1.0)

    def due(self, now: float, interval: float = LOG_INTERVAL) -> bool:
        """Whether a log line is due now; records it as logged when it is."""
        if self.last_logged is not None and now - self.last_logged < interval:
            return False
        self.last_logged = now
        return True

    def line(self, now: float) -> str:
        """One human line: ``done/total (pct), rate rows/s, ETA``."""
        eta = self.eta(now)
        left = "unknown" if eta is None else f"{eta:.0f}s"
        return (
            f"{self.done}/{self.total} rows ({self.fraction():.0%}),"
            f" {self.rate(now):.0f} rows/s, ETA {left}"
        )
