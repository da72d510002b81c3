"""Metrics of the relay: latency histogram, quantiles, the WAL clock and the exposition."""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cdc_outbox.config.monitoring import heartbeat_section, slot_monitor_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.monitoring.heartbeat import Heartbeat
from cdc_outbox.monitoring.lag import LagSample, WalClock
from cdc_outbox.monitoring.latency import LATENCY_BUCKETS, LatencyHistogram, quantile
from cdc_outbox.monitoring.metrics import METRIC_NAMES, RelayCollector
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
    names = set()
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


def test_histogram_weights_by_events_and_clamps_negative_latency() -> None:
    h = LatencyHistogram(bounds=(0.1, 1.0))
    h.observe(0.05, 3)
    h.observe(0.1, 1)  # a bound is inclusive (le)
    h.observe(5.0, 2)
    h.observe(-0.2, 1)  # a server clock slightly ahead of ours
    counts, total, count = h.snapshot()
    assert counts == [5, 0, 2]
    assert count == 7
    assert total == pytest.approx(0.05 * 3 + 0.1 + 10.0)


def test_quantile_interpolates_within_buckets() -> None:
    bounds = (1.0, 2.0, 4.0)
    assert quantile(bounds, [0, 0, 0, 0], 0.5) is None
    assert quantile(bounds, [10, 0, 0, 0], 0.5) == pytest.approx(0.5)
    assert quantile(bounds, [0, 10, 0, 0], 0.5) == pytest.approx(1.5)
    assert quantile(bounds, [5, 0, 5, 0], 0.95) == pytest.approx(2.0 + 2.0 * 0.9)
    assert quantile(bounds, [0, 0, 0, 3], 0.5) == 4.0  # above every bound: the last bound


@given(st.lists(st.floats(min_value=0, max_value=1000), min_size=1, max_size=200))
def test_quantile_is_within_the_bucket_of_the_true_quantile(latencies: list[float]) -> None:
    h = LatencyHistogram()
    for x in latencies:
        h.observe(x, 1)
    median = quantile(h.bounds, h.snapshot()[0], 0.5)
    assert median is not None
    ordered = sorted(latencies)
    true = ordered[math.ceil(0.5 * len(ordered)) - 1]
    bounds = (0.0, *LATENCY_BUCKETS, math.inf)
    i = next(i for i in range(1, len(bounds)) if true <= bounds[i])
    assert bounds[i - 1] <= median <= min(bounds[i], LATENCY_BUCKETS[-1])


def test_wal_clock_interpolates_and_bounds() -> None:
    clock = WalClock()
    assert clock.age(100, now=10.0) is None
    clock.add(0.0, 1000)
    clock.add(10.0, 2000)
    clock.add(20.0, 4000)
    assert clock.age(4000, now=25.0) == 0.0  # caught up with the newest sample
    assert clock.age(5000, now=25.0) == 0.0
    assert clock.age(1500, now=25.0) == pytest.approx(20.0)  # written at t=5
    assert clock.age(3000, now=25.0) == pytest.approx(10.0)  # written at t=15
    assert clock.age(500, now=25.0) == pytest.approx(25.0)  # older than history: lower bound


def test_wal_clock_idle_runs_keep_first_and_last_sample() -> None:
    clock = WalClock()
    for t in range(100):
        clock.add(float(t), 1000)  # an hour of idle samples ...
    assert len(clock) == 2
    clock.add(100.0, 1100)  # ... then a write: the slot at 1000 is only one interval old
    assert clock.age(1000, now=100.0) == pytest.approx(1.0)
    assert clock.age(1050, now=100.0) == pytest.approx(0.5)


def test_wal_clock_starts_over_when_wal_goes_backwards() -> None:
    clock = WalClock()
    clock.add(0.0, 5000)
    clock.add(1.0, 6000)
    clock.add(2.0, 100)  # a different (restored) server
    assert len(clock) == 1
    assert clock.age(100, now=3.0) == 0.0


def test_every_metric_is_exported_with_its_value() -> None:
    text, values = scrape(busy_stats(), full_sample())
    exported = exported_names(text)
    assert not METRIC_NAMES - exported, sorted(METRIC_NAMES - exported)
    assert values["cdc_outbox_events_published_total{topic=a}"] == 2
    assert values["cdc_outbox_events_published_total{topic=b}"] == 1
    assert values["cdc_outbox_events_dead_lettered_total{topic=a}"] == 1
    assert values["cdc_outbox_ignored_messages_total{kind=message}"] == 2
    assert values["cdc_outbox_refused_messages_total{reason=non-transactional}"] == 3
    assert values["cdc_outbox_relay_mode{mode=polling}"] == 1
    assert values["cdc_outbox_relay_mode{mode=cdc}"] == 0
    assert values["cdc_outbox_confirmed_lsn_bytes"] == 0x1_0000_1000
    assert values["cdc_outbox_events_in_flight"] == 5
    assert values["cdc_outbox_commit_to_ack_latency_seconds_count"] == 4
    assert values["cdc_outbox_commit_to_ack_latency_seconds_bucket{le=0.025}"] == 3
    assert values["cdc_outbox_commit_to_ack_latency_seconds_bucket{le=+Inf}"] == 4
    assert values["cdc_outbox_slot_lag_bytes"] == 4096
    assert values["cdc_outbox_slot_retained_wal_bytes"] == 6144
    assert values["cdc_outbox_slot_confirmed_flush_lsn_bytes"] == 0x1_0000_1000
    assert values["cdc_outbox_server_wal_lsn_bytes"] == 0x1_0000_2000
    assert values["cdc_outbox_slot_wal_status{status=extended}"] == 1
    assert values["cdc_outbox_slot_wal_status{status=reserved}"] == 0
    assert values["cdc_outbox_slot_spill_bytes_total"] == 3
    assert values["cdc_outbox_slot_streams_total"] == 5
    assert values["cdc_outbox_polling_rows{status=pending}"] == 10
    assert values["cdc_outbox_polling_rows{status=failed}"] == 1
    assert values["cdc_outbox_polling_retry_attempts"] == 7
    assert values["cdc_outbox_oldest_unpublished_age_seconds"] == 12.5
    assert values["cdc_outbox_heartbeats_total"] == 4
    assert values["cdc_outbox_heartbeat_errors_total"] == 1
    assert values["cdc_outbox_monitor_up"] == 1


def test_unknown_figures_are_absent_not_zero() -> None:
    sample = LagSample(sampled_at=1.0, slot_name="s", slot_present=False)
    _, values = scrape(RelayStats(), sample)
    assert values["cdc_outbox_slot_present"] == 0
    for name in (
        "cdc_outbox_slot_lag_bytes",
        "cdc_outbox_slot_safe_wal_size_bytes",
        "cdc_outbox_oldest_unpublished_age_seconds",
        "cdc_outbox_last_confirm_timestamp_seconds",
    ):
        assert name not in values  # fmt: skip
    assert not any(k.startswith("cdc_outbox_polling_rows") for k in values)
    _, before_first_sample = scrape(RelayStats(), None)
    assert before_first_sample["cdc_outbox_monitor_up"] == 0
    assert "cdc_outbox_slot_lag_bytes" not in before_first_sample


def test_exposition_passes_promtool_lint_when_available() -> None:
    text, _ = scrape(busy_stats(), full_sample())
    assert "# TYPE cdc_outbox_slot_lag_bytes gauge" in text
    assert "# TYPE cdc_outbox_commit_to_ack_latency_seconds histogram" in text
    assert "# TYPE cdc_outbox_events_published_total counter" in text
    promtool = shutil.which("promtool")
    if promtool is not None:  # installed by scripts/bootstrap.sh (Debian package prometheus)
        lint = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_leadership_phase_alerts_and_broken_order_are_exported() -> None:
    stats = busy_stats()
    stats.alert_last_seen["not_authorized"] = 1.0  # long ago: no longer raised
    text, _ = scrape(stats, full_sample())
    assert 'cdc_outbox_role{role="leader"} 1.0' in text
    assert 'cdc_outbox_role{role="standby"} 0.0' in text
    assert 'cdc_outbox_phase{phase="STREAMING"} 1.0' in text
    assert 'cdc_outbox_phase{phase="POLLING"} 0.0' in text
    assert 'cdc_outbox_delivery_retries_total{alert="topic_missing"} 1.0' in text
    assert 'cdc_outbox_delivery_alert{alert="topic_missing"} 1.0' in text
    assert 'cdc_outbox_delivery_alert{alert="not_authorized"} 0.0' in text
    assert "cdc_outbox_order_broken_total 1.0" in text


def test_delivery_guarantee_and_kafka_transactions_are_exported() -> None:
    stats = busy_stats()
    stats.delivery_guarantee = "exactly_once"
    stats.eos_commits, stats.eos_aborts = 7, 2
    text, _ = scrape(stats, full_sample())
    assert 'cdc_outbox_delivery_guarantee{guarantee="exactly_once"} 1.0' in text
    assert 'cdc_outbox_delivery_guarantee{guarantee="at_least_once"} 0.0' in text
    assert 'cdc_outbox_kafka_transactions_total{outcome="committed"} 7.0' in text
    assert 'cdc_outbox_kafka_transactions_total{outcome="aborted"} 2.0' in text


def test_each_outbox_table_gets_its_own_labelled_gauges() -> None:
    _, values = scrape(busy_stats(), full_sample())
    assert values["cdc_outbox_outbox_unpublished_rows{outbox=public.outbox}"] == 12
    assert values["cdc_outbox_outbox_unpublished_rows{outbox=billing.events}"] == 4
    assert values["cdc_outbox_outbox_unpublished_rows{outbox=cdc.raw}"] == 3
    assert values["cdc_outbox_outbox_oldest_unpublished_age_seconds{outbox=public.outbox}"] == 12.5
    assert values["cdc_outbox_outbox_failed_rows{outbox=public.outbox}"] == 1
    assert values["cdc_outbox_outbox_parked_aggregates{outbox=billing.events}"] == 0
    # a table without status columns has no FAILED rows nor created_at: absent, not zero
    assert "cdc_outbox_outbox_failed_rows{outbox=cdc.raw}" not in values
    assert "cdc_outbox_outbox_oldest_unpublished_age_seconds{outbox=cdc.raw}" not in values


def test_auto_mode_says_when_it_will_not_fall_back_to_polling() -> None:
    _, values = scrape(busy_stats(), None)
    assert values["cdc_outbox_polling_fallback_disabled{reason=table_less_events}"] == 0
    assert values["cdc_outbox_polling_fallback_disabled{reason=statusless_outbox}"] == 0
    table_less = SETTINGS.model_copy(update={"message_prefix": "app"})
    _, values = scrape(busy_stats(), None, table_less)
    assert values["cdc_outbox_polling_fallback_disabled{reason=table_less_events}"] == 1
    assert values["cdc_outbox_polling_fallback_disabled{reason=statusless_outbox}"] == 0
    cdc = SETTINGS.model_copy(update={"mode": "cdc", "message_prefix": "app"})
    _, values = scrape(busy_stats(), None, cdc)  # never falls back anyway: no samples
    assert not any(k.startswith("cdc_outbox_polling_fallback_disabled") for k in values)
