"""The relay's metrics exposition built in memory, shared by the metrics and alert-rule tests:
a registry with every source (:func:`scrape`), figures that are all known (:func:`busy_stats`,
:func:`full_sample`) and the names PromQL sees (:func:`every_exported_name`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cdc_outbox.config.monitoring import heartbeat_section, slot_monitor_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.monitoring.heartbeat import Heartbeat
from cdc_outbox.monitoring.lag import LagSample
from cdc_outbox.monitoring.latency import LatencyHistogram
from cdc_outbox.monitoring.metrics import RelayCollector
from cdc_outbox.monitoring.slot_monitor import SlotMonitor
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.telemetry.relay_stats import RelayStats

SETTINGS = Settings.model_validate(
    {"dsn": "host=127.0.0.1 port=1 dbname=x", "heartbeat_interval_s": 5}
)


def full_sample() -> LagSample:
    """A sample with every figure known (as a polling relay with a slot would have)."""
    return LagSample(
        sampled_at=1_700_000_000.0, slot_name="cdc_outbox", wal_lsn="1/2000", slot_present=True,
        slot_active=True, confirmed_flush_lsn="1/1000", restart_lsn="1/800", slot_lag_bytes=4096,
        slot_retained_wal_bytes=6144, slot_wal_status="extended", slot_safe_wal_size_bytes=10**9,
        slot_spill_txns=1, slot_spill_count=2, slot_spill_bytes=3, slot_stream_txns=4,
        slot_stream_count=5, slot_stream_bytes=6, slot_total_txns=7, slot_total_bytes=8,
        oldest_unpublished_age_seconds=12.5, polling_pending=10, polling_processing=2,
        polling_failed=1, polling_retrying_rows=3, polling_retry_attempts=7, mode="polling",
        outboxes=[
            {"outbox": "public.outbox", "exists": True, "unpublished_rows": 12,
             "oldest_unpublished_age_seconds": 12.5, "pending_rows": 10, "failed_rows": 1,
             "parked_aggregates": 1},
            {"outbox": "billing.events", "exists": True, "unpublished_rows": 4,
             "oldest_unpublished_age_seconds": 0.0, "pending_rows": 4, "failed_rows": 0,
             "parked_aggregates": 0},
            {"outbox": "cdc.raw", "exists": True, "unpublished_rows": 3,
             "oldest_unpublished_age_seconds": None, "pending_rows": None, "failed_rows": None,
             "parked_aggregates": None},
        ],
    )  # fmt: skip


def scrape(
    stats: RelayStats, sample: LagSample | None, settings: Settings = SETTINGS
) -> tuple[str, dict[str, float]]:
    """Exposition text and {sample name + labels: value} of a registry with every source."""
    histogram = LatencyHistogram()
    stats.latency_observers.append(histogram.observe)
    monitor = SlotMonitor(
        slot_monitor_section(settings), OutboxTable.all_of(settings), lambda: stats, histogram
    )
    if sample is not None:
        monitor.record(sample)
        monitor.up = True
    heartbeat = Heartbeat(heartbeat_section(SETTINGS))
    heartbeat.sent, heartbeat.errors, heartbeat.last_success_unix = 4, 1, 1_700_000_000.0
    registry = CollectorRegistry()
    registry.register(RelayCollector(lambda: stats, histogram, monitor, heartbeat))
    stats.observe_latency(0.02, 3)
    stats.observe_latency(1.5, 1)
    text = generate_latest(registry).decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            values[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return text, values


def exported_names(text: str) -> set[str]:
    """Metric names as PromQL sees them (a histogram also by its family name)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(s.name for s in family.samples)
        if family.type == "histogram":
            names.add(family.name)
    return names


def every_exported_name() -> set[str]:
    """Every name the relay exports when all its figures are known."""
    return exported_names(scrape(busy_stats(), full_sample())[0])


def busy_stats() -> RelayStats:
    stats = RelayStats(mode="polling")
    for topic in ("a", "a", "b"):
        stats.count_published(topic)
    stats.count_dead_lettered("a")
    stats.ignored["message"] = 2
    stats.refused_messages["non-transactional"] = 3
    stats.delivery_errors, stats.transactions, stats.restarts = 1, 3, 1
    stats.confirmed_lsn, stats.last_confirm_unix, stats.in_flight = 0x1_0000_1000, 1.7e9, 5
    stats.count_retry("topic_missing")
    stats.role, stats.phase, stats.order_broken = "leader", "STREAMING", 1
    stats.slot_invalidations["wal_removed"] = 1
    return stats
