"""The streaming relay's progress line: at most every 30 s, events published (and the rate
since the last line), the confirmed position and the events in flight."""

from __future__ import annotations

import logging
import time

from cdc_outbox.cdc.ack_tracker import AckTracker
from cdc_outbox.lsn import Lsn
from cdc_outbox.telemetry.relay_stats import RelayStats

__all__ = ["ProgressLog"]

logger = logging.getLogger("cdc_outbox.cdc.relay")

_INTERVAL_S = 30.0


class ProgressLog:
    """Logs the progress line of one streaming session (see the module doc)."""

    __slots__ = ("_count", "_last", "_stats")

    def __init__(self, stats: RelayStats) -> None:
        self._stats = stats
        self._last, self._count = time.monotonic(), stats.events_published

    def maybe(self, tracker: AckTracker) -> None:
        now = time.monotonic()
        if now - self._last < _INTERVAL_S:
            return
        published = self._stats.events_published
        rate = (published - self._count) / (now - self._last)
        lsn = str(Lsn(tracker.confirmed))
        logger.info(
            "published %d events (%.0f/s), confirmed %s, in flight %d",
            published,
            rate,
            lsn,
            tracker.in_flight,
            extra={"mode": "cdc", "lsn": lsn},
        )
        self._last, self._count = now, published
