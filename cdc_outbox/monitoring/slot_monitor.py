"""The slot monitor: samples the lag view every ``monitor_interval_s``.

Each sample borrows a connection from :mod:`cdc_outbox.store.db_pool` (not the stream's), so the
slot figures stay true while the stream is stuck (Kafka down, relay restarting); the sample's
reads run in one transaction with a statement timeout. Each sample adds the relay's figures
(mode, counters, throughput and latency over the interval) and, in CDC mode, the age of the
oldest unconfirmed WAL (:class:`WalClock`).
A failing sample never raises: it counts in ``errors``, sets ``up`` false, logs (at most once
a minute while failing) and is retried at the next tick (the pool drops dead connections).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc_outbox.config.monitoring import SlotMonitorSection
from cdc_outbox.lsn import Lsn
from cdc_outbox.monitoring.background import BackgroundLoop
from cdc_outbox.monitoring.lag import (
    LagSample,
    WalClock,
    lsn_value,
    one_line,
    outbox_columns,
    read_outboxes,
    read_polling,
    read_slot,
)
from cdc_outbox.monitoring.latency import LatencyHistogram, quantile
from cdc_outbox.store import db_pool
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.telemetry.relay_stats import RelayStats

logger = logging.getLogger(__name__)

#: Fields of a sample that the dashboard charts (``chart`` entries hold these plus ``t``).
CHART_FIELDS = (
    "slot_lag_bytes",
    "slot_retained_wal_bytes",
    "throughput_events_per_second",
    "latency_p50_seconds",
    "latency_p95_seconds",
    "oldest_unpublished_age_seconds",
    "mode",
)
_ERROR_LOG_INTERVAL_S = 60.0


@dataclass(slots=True)
class _Previous:
    stats: RelayStats
    unix: float
    published: int
    counts: list[int]
    total: float
    count: int


class SlotMonitor(BackgroundLoop):
    """Background sampler; ``latest`` and ``chart`` are safe to read from any thread."""

    thread_name = "slot-monitor"

    def __init__(
        self,
        section: SlotMonitorSection,
        tables: Sequence[OutboxTable],
        stats: Callable[[], RelayStats],
        histogram: LatencyHistogram,
        *,
        heartbeat_counts: Callable[[], tuple[int, int]] | None = None,
        chart_points: int | None = None,
    ) -> None:
        """``section``: :func:`cdc_outbox.config.monitoring.slot_monitor_section`; ``tables``:
        the configured outbox tables (``OutboxTable.all_of(settings)``)."""
        self.section = section
        self.tables = tuple(tables)
        self.interval_s = section.interval_s
        self.errors = 0
        self.up = False
        self._stats = stats
        self._histogram = histogram
        self._heartbeat_counts = heartbeat_counts
        points = chart_points or min(3600, max(120, int(3600 / self.interval_s)))
        self._chart: deque[dict[str, Any]] = deque(maxlen=points)
        self._latest: LagSample | None = None
        self._lock = threading.Lock()
        self._clock = WalClock()
        self._columns: dict[str, frozenset[str]] | None = None
        self._previous: _Previous | None = None
        self._attached: list[RelayStats] = []
        self._last_error_log = float("-inf")
        super().__init__()

    # -- reading ---------------------------------------------------------------------------

    @property
    def latest(self) -> LagSample | None:
        with self._lock:
            return self._latest

    def chart(self, since: float = 0.0) -> list[dict[str, Any]]:
        """Chart points (``t`` plus :data:`CHART_FIELDS`) sampled after ``since``."""
        with self._lock:
            return [p for p in self._chart if p["t"] > since]

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._attach(self._stats())
        super().start()

    def stop(self, timeout: float = 10.0) -> None:
        super().stop(timeout)
        for stats in self._attached:
            if self._histogram.observe in stats.latency_observers:
                stats.latency_observers.remove(self._histogram.observe)
        self._attached.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    # -- one sample ------------------------------------------------------------------------

    def sample_once(self) -> LagSample:
        """Take one sample now, publish it as ``latest`` and return it (never raises)."""
        now = time.time()
        stats = self._stats()
        self._attach(stats)
        sample = LagSample(sampled_at=now, slot_name=self.section.slot_name)
        self._relay_figures(sample, stats, now)
        try:
            self._database_figures(sample, now)
            if not self.up and self.errors:
                logger.info("slot monitor recovered")
                self._last_error_log = float("-inf")
            self.up = True
        except Exception as exc:
            self._failed(sample, exc)
        sample.monitor_errors_total = self.errors
        self.record(sample)
        return sample

    def record(self, sample: LagSample) -> None:
        """Publish ``sample`` as ``latest`` and add it to the chart."""
        point = {"t": sample.sampled_at, **{name: getattr(sample, name) for name in CHART_FIELDS}}
        with self._lock:
            self._latest = sample
            self._chart.append(point)

    def _database_figures(self, sample: LagSample, now: float) -> None:
        timeout = max(5.0, min(30.0, self.interval_s))
        with db_pool.pooled(
            self.section.database, timeout=timeout, statement_timeout_s=timeout
        ) as conn:
            if self._columns is None:
                self._columns = outbox_columns(conn, self.tables)
            read_slot(conn, self.section.slot_name, sample)
            if sample.mode == "polling":
                read_polling(conn, self.tables, sample, self._columns)
            read_outboxes(conn, self.tables, sample)
        wal = lsn_value(sample.wal_lsn)
        if wal is not None:
            self._clock.add(now, wal)
        if sample.mode != "polling":
            confirmed = lsn_value(sample.confirmed_flush_lsn)
            if confirmed is not None:
                sample.oldest_unpublished_age_seconds = self._clock.age(confirmed, now)

    def _failed(self, sample: LagSample, exc: Exception) -> None:
        self.errors += 1
        self.up = False
        sample.error = one_line(exc, self.section.database)
        self._columns = None  # looked up again: the table may have been recreated
        now = time.monotonic()
        if now - self._last_error_log >= _ERROR_LOG_INTERVAL_S:
            self._last_error_log = now
            if isinstance(exc, psycopg.Error):
                logger.warning("slot monitor sample failed (relay unaffected): %s", sample.error)
            else:
                logger.error(
                    "slot monitor sample failed (relay unaffected): %s", sample.error, exc_info=exc
                )

    def _relay_figures(self, sample: LagSample, stats: RelayStats, now: float) -> None:
        sample.mode = stats.mode
        sample.role = stats.role
        sample.phase = stats.phase or None
        sample.delivery = stats.delivery_guarantee
        sample.events_published_total = stats.events_published
        sample.events_dead_lettered_total = stats.events_dead_lettered
        sample.delivery_errors_total = stats.delivery_errors
        sample.in_flight_events = stats.in_flight
        sample.relay_confirmed_lsn = str(Lsn(stats.confirmed_lsn))
        sample.last_confirm_unix = stats.last_confirm_unix or None
        if self._heartbeat_counts is not None:
            sample.heartbeats_total, sample.heartbeat_errors_total = self._heartbeat_counts()
        counts, total, count = self._histogram.snapshot()
        prev = self._previous
        if prev is not None and prev.stats is stats and now > prev.unix:
            elapsed = now - prev.unix
            sample.throughput_events_per_second = (stats.events_published - prev.published) / (
                elapsed
            )
            observed = count - prev.count
            if observed > 0:
                delta = [a - b for a, b in zip(counts, prev.counts, strict=True)]
                bounds = self._histogram.bounds
                sample.latency_p50_seconds = quantile(bounds, delta, 0.5)
                sample.latency_p95_seconds = quantile(bounds, delta, 0.95)
                sample.latency_mean_seconds = (total - prev.total) / observed
        self._previous = _Previous(stats, now, stats.events_published, counts, total, count)

    def _attach(self, stats: RelayStats) -> None:
        """Make sure the latency histogram observes the current relay's transactions."""
        if self._histogram.observe not in stats.latency_observers:
            stats.latency_observers.append(self._histogram.observe)
            self._attached.append(stats)
