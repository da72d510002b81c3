"""The polling relay's claimed rows and worker identity (see :mod:`cdc_outbox.polling.relay`)."""

from __future__ import annotations

import os
import secrets
import socket
import time
from typing import Any, Protocol

from cdc_outbox.polling.outcomes import DEAD, OK, RETRY
from cdc_outbox.telemetry.relay_stats import RelayStats

__all__ = ["Settles", "_Row", "batch_shares", "default_worker_id"]


class Settles(Protocol):
    """What a row needs of its table's worker: its stats and count of unsettled rows."""

    stats: RelayStats
    _outstanding: int


def default_worker_id() -> str:
    """``host:pid:random`` (unique per worker instance; stored in ``locked_by``)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class _Row:
    """One claimed row, and the :class:`~cdc_outbox.delivery.outcomes.EventHandle` of its event."""

    def __init__(self, relay: Settles, values: tuple[Any, ...]) -> None:
        self.extra = values[11:]  # the header_sources() columns, as text
        (
            self.rank,
            self.id,
            self.id_text,
            self.agg_type,
            self.aggregate_id,
            self.event_type,
            self.payload,
            self.headers,
            self.tracing,
            self.attempts,
            self.created_unix,
        ) = values[:11]
        self.relay = relay
        self.outcome: str | None = None
        self.error: str | None = None

    def published(self, topic: str) -> None:
        self._settle(OK)
        if self.relay.stats.latency_observers:
            self.relay.stats.observe_latency(time.time() - self.created_unix, 1)

    def dead_lettered(self) -> None:
        self._settle(DEAD)

    def retry(self, reason: str) -> None:
        self.error = reason
        self._settle(RETRY)

    def _settle(self, outcome: str) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.relay._outstanding -= 1


def batch_shares(batch_size: int, tables: int) -> list[int]:
    """Each table's share of ``batch_size`` per pass (at least 1; the remainder to the first)."""
    return [max(batch_size // tables + (1 if i < batch_size % tables else 0), 1)
            for i in range(tables)]  # fmt: skip
