"""Monitoring of a running relay: slot monitor, metrics endpoint, dashboard, heartbeat,
liveness and readiness checks.

:func:`start_monitoring` starts them in background threads and stops them on exit. Nothing
here can stop the relay: a monitor, heartbeat or HTTP failure is logged and counted, and the
relay streams on (an endpoint that cannot bind is logged as an error; the relay still runs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

from cdc_outbox.config.monitoring import health_section, heartbeat_section, slot_monitor_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.monitoring.health import HealthChecks
from cdc_outbox.monitoring.heartbeat import Heartbeat
from cdc_outbox.monitoring.http_server import MonitoringServer
from cdc_outbox.monitoring.latency import LatencyHistogram
from cdc_outbox.monitoring.metrics import RelayCollector
from cdc_outbox.monitoring.slot_monitor import SlotMonitor
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.telemetry.relay_stats import RelayStats

__all__ = ["Monitoring", "start_monitoring"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Monitoring:
    """What :func:`start_monitoring` started (``server`` is None if it could not bind)."""

    registry: CollectorRegistry
    histogram: LatencyHistogram
    monitor: SlotMonitor
    heartbeat: Heartbeat | None
    server: MonitoringServer | None
    health: HealthChecks

    @property
    def url(self) -> str | None:
        return None if self.server is None else self.server.url


@contextmanager
def start_monitoring(settings: Settings, stats: Callable[[], RelayStats]) -> Iterator[Monitoring]:
    """Run the slot monitor, the health checks, the HTTP endpoint (``metrics_host:metrics_port``)
    and, when ``heartbeat_interval_s`` > 0, the heartbeat, until the ``with`` block exits.

    ``stats`` returns the running relay's :class:`RelayStats` (called at every sample and
    scrape, so a replaced relay is followed).
    """
    histogram = LatencyHistogram()
    heartbeat = (
        Heartbeat(heartbeat_section(settings)) if settings.heartbeat_interval_s > 0 else None
    )
    monitor = SlotMonitor(
        slot_monitor_section(settings),
        OutboxTable.all_of(settings),
        stats,
        histogram,
        heartbeat_counts=heartbeat.counts if heartbeat else None,
    )
    registry = CollectorRegistry()
    registry.register(RelayCollector(stats, histogram, monitor, heartbeat))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    health = HealthChecks(health_section(settings), stats)
    server: MonitoringServer | None = None
    try:
        server = MonitoringServer(
            settings.metrics_host, settings.metrics_port, registry, monitor, health
        )
    except OSError as exc:
        logger.error(
            "metrics endpoint %s:%s unavailable (%s); the relay runs without it",
            settings.metrics_host,
            settings.metrics_port,
            exc.strerror or exc,
        )
    monitor.start()
    health.start()
    if heartbeat is not None:
        heartbeat.start()
    if server is not None:
        server.start()
    try:
        yield Monitoring(registry, histogram, monitor, heartbeat, server, health)
    finally:
        if server is not None:
            server.close()
        if heartbeat is not None:
            heartbeat.stop()
        health.stop()
        monitor.stop()
