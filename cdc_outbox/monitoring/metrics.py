"""Prometheus metrics of a running relay, read at scrape time (no cost on the hot path).

The relay thread's one write is the commit-to-acknowledgement
:class:`~cdc_outbox.monitoring.latency.LatencyHistogram` (appended to
``RelayStats.latency_observers``; single writer, a scrape may read it a moment stale, never
torn in a way that matters for monitoring). :class:`RelayCollector` turns ``RelayStats``, the
histogram, the slot monitor's latest sample and the heartbeat's counters into metric families.

Every family name is listed in :data:`METRIC_NAMES` (the alert-rule test checks against it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from cdc_outbox import __version__
from cdc_outbox.monitoring.latency import LatencyHistogram
from cdc_outbox.monitoring.metric_families import PREFIX, by_label, gauge, one_of
from cdc_outbox.monitoring.slot_metrics import heartbeat_families, monitor_families
from cdc_outbox.telemetry.relay_stats import RelayStats

if TYPE_CHECKING:
    from cdc_outbox.monitoring.heartbeat import Heartbeat
    from cdc_outbox.monitoring.slot_monitor import SlotMonitor

MODES = ("cdc", "polling")


class RelayCollector(Collector):
    """All ``cdc_outbox_*`` families; reads its sources at each scrape."""

    def __init__(
        self,
        stats: Callable[[], RelayStats],
        histogram: LatencyHistogram,
        monitor: SlotMonitor | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self._stats = stats
        self._histogram = histogram
        self._monitor = monitor
        self._heartbeat = heartbeat

    def collect(self) -> Iterable[Metric]:
        yield from self._relay_families(self._stats())
        yield self._latency_family()
        if self._monitor is not None:
            yield from monitor_families(self._monitor)
        if self._heartbeat is not None:
            yield from heartbeat_families(self._heartbeat)

    def _relay_families(self, stats: RelayStats) -> Iterable[Metric]:
        p = PREFIX
        info = GaugeMetricFamily(p + "build_info", "cdc-outbox version.", labels=["version"])
        info.add_metric([__version__], 1)
        yield info
        yield one_of(
            p + "relay_mode",
            "1 for the mode the relay runs in (cdc or polling).",
            "mode",
            sorted({*MODES, stats.mode}),
            stats.mode,
        )
        yield by_label(
            p + "events_published_total",
            "Events acknowledged by Kafka, by topic.",
            "topic",
            stats.published_by_topic.copy(),
        )
        yield by_label(
            p + "events_dead_lettered_total",
            "Events sent to the dead-letter topic, by the topic they were meant for.",
            "topic",
            stats.dead_lettered_by_topic.copy(),
        )
        yield by_label(
            p + "ignored_messages_total",
            "Replication messages ignored, by kind.",
            "kind",
            stats.ignored.copy(),
        )
        yield by_label(
            p + "refused_messages_total",
            "Table-less event messages refused (dead-lettered, never published), by reason.",
            "reason",
            stats.refused_messages.copy(),
        )
        yield CounterMetricFamily(
            p + "delivery_errors_total",
            "Failed Kafka deliveries (retried, dead-lettered or halting).",
            value=stats.delivery_errors,
        )
        yield CounterMetricFamily(
            p + "transactions_total", "Committed transactions received.", value=stats.transactions
        )
        yield CounterMetricFamily(
            p + "relay_restarts_total", "Stream restarts after a failure.", value=stats.restarts
        )
        yield gauge(
            "catch_up_backlog_rows",
            "Rows the last catch-up has to publish (counted once at its start).",
            stats.catch_up_rows_total,
        )
        yield gauge(
            "catch_up_rows_done",
            "Rows of the last catch-up submitted so far.",
            stats.catch_up_rows_done,
        )
        yield by_label(
            p + "slot_invalidations_total",
            "Invalidated replication slots found, by reason (wal_removed, rows_removed,"
            " wal_level_insufficient, idle_timeout, recovery_conflict, unknown).",
            "reason",
            stats.slot_invalidations.copy(),
        )
        yield GaugeMetricFamily(
            p + "events_in_flight",
            "Events sent to Kafka, not yet acknowledged.",
            value=stats.in_flight,
        )
        yield GaugeMetricFamily(
            p + "standby_held_transactions",
            "Transactions held until a standby listed in wait_for_standbys has flushed them.",
            value=stats.standby_held_transactions,
        )
        yield GaugeMetricFamily(
            p + "standby_wait_seconds",
            "How long the oldest transaction held for a listed standby has waited.",
            value=stats.standby_wait_s,
        )
        yield GaugeMetricFamily(
            p + "confirmed_lsn_bytes",
            "WAL position the relay last confirmed to the slot (as a byte position).",
            value=float(stats.confirmed_lsn),
        )
        confirm = GaugeMetricFamily(
            p + "last_confirm_timestamp_seconds",
            "Unix time of the last confirmation that moved the slot forward.",
        )
        if stats.last_confirm_unix > 0:
            confirm.add_metric([], stats.last_confirm_unix)
        yield confirm
        yield from _ha_families(stats)

    def _latency_family(self) -> Metric:
        counts, total, _ = self._histogram.snapshot()
        cumulative: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self._histogram.bounds, math.inf), counts, strict=True):
            running += n
            cumulative.append(("+Inf" if math.isinf(bound) else repr(bound), running))
        return HistogramMetricFamily(
            PREFIX + "commit_to_ack_latency_seconds",
            "Seconds from a transaction's commit to Kafka's acknowledgement of its last event,"
            " counted once per event.",
            buckets=cumulative,
            sum_value=total,
        )


#: Seconds an alert stays raised after the problem was last seen.
ALERT_HOLD_S = 60.0
ROLES = ("leader", "standby")
PHASES = ("POLLING", "CATCHING_UP", "STREAMING")


def _ha_families(stats: RelayStats) -> Iterable[Metric]:
    """Leader election, the durable phase, retried-delivery alerts and broken order."""
    yield one_of(
        PREFIX + "role",
        "1 for this instance's role (leader or standby).",
        "role",
        ROLES,
        stats.role,
    )
    yield one_of(
        PREFIX + "phase",
        "1 for the durable relay phase (POLLING, CATCHING_UP, STREAMING) the leader is in.",
        "phase",
        PHASES,
        stats.phase,
    )
    yield by_label(
        PREFIX + "delivery_retries_total",
        "Deliveries retried (never dead-lettered) by cause: topic_missing, not_authorized,"
        " producer_fatal, kafka_unavailable, ...",
        "alert",
        stats.retries_by_alert.copy(),
    )
    alert = GaugeMetricFamily(
        PREFIX + "delivery_alert",
        f"1 while a retried delivery problem was seen in the last {ALERT_HOLD_S:g} s.",
        labels=["alert"],
    )
    now = time.time()
    for name, seen in sorted(stats.alert_last_seen.copy().items()):
        alert.add_metric([name], 1.0 if now - seen <= ALERT_HOLD_S else 0.0)
    yield alert
    yield one_of(
        PREFIX + "delivery_guarantee",
        "1 for the delivery guarantee in effect (polling is at-least-once in every case).",
        "guarantee",
        ("at_least_once", "exactly_once"),
        stats.delivery_guarantee,
    )
    txns = CounterMetricFamily(
        PREFIX + "kafka_transactions_total",
        "Kafka transactions (exactly-once).",
        labels=["outcome"],
    )
    txns.add_metric(["committed"], stats.eos_commits)
    txns.add_metric(["aborted"], stats.eos_aborts)
    yield txns
    yield CounterMetricFamily(
        PREFIX + "untrusted_checkpoints_total",
        "Exactly-once checkpoints not all in the database's history (failover to a standby"
        " that was behind, restore): the transactions they held past it are published again.",
        value=stats.untrusted_checkpoints,
    )
    yield CounterMetricFamily(
        PREFIX + "order_broken_total",
        "Dead letters whose later events of the same aggregate were already sent (Kafka"
        " rejected a record after later ones of its key were produced).",
        value=stats.order_broken,
    )


#: Every family the relay exports (sample names add ``_bucket``/``_sum``/``_count``).
METRIC_NAMES = frozenset(
    PREFIX + n
    for n in (
        "build_info", "relay_mode", "events_published_total", "events_dead_lettered_total",
        "ignored_messages_total", "refused_messages_total", "delivery_errors_total",
        "transactions_total", "relay_restarts_total", "catch_up_backlog_rows", "catch_up_rows_done",
        "events_in_flight", "confirmed_lsn_bytes",
        "last_confirm_timestamp_seconds", "commit_to_ack_latency_seconds", "monitor_up",
        "monitor_errors_total", "monitor_last_sample_timestamp_seconds", "server_wal_lsn_bytes",
        "slot_present", "slot_active", "slot_confirmed_flush_lsn_bytes", "slot_restart_lsn_bytes",
        "slot_lag_bytes", "slot_retained_wal_bytes", "slot_wal_status", "slot_safe_wal_size_bytes",
        "slot_spill_transactions_total", "slot_spills_total", "slot_spill_bytes_total",
        "slot_stream_transactions_total", "slot_streams_total", "slot_stream_bytes_total",
        "slot_decoded_transactions_total", "slot_decoded_bytes_total",
        "oldest_unpublished_age_seconds", "polling_rows", "polling_retrying_rows",
        "polling_retry_attempts", "heartbeats_total", "heartbeat_errors_total",
        "heartbeat_last_success_timestamp_seconds", "role", "phase", "delivery_retries_total",
        "delivery_alert", "order_broken_total", "delivery_guarantee", "kafka_transactions_total",
        "untrusted_checkpoints_total", "slot_invalidations_total", "standby_held_transactions",
        "standby_wait_seconds", "polling_fallback_disabled", "outbox_unpublished_rows",
        "outbox_oldest_unpublished_age_seconds", "outbox_failed_rows", "outbox_parked_aggregates",
    )
)  # fmt: skip
