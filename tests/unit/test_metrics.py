"""Metrics of the relay: latency histogram, quantiles, the WAL clock and the exposition."""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.monitoring.lag import LagSample, WalClock
from cdc_outbox.monitoring.latency import LATENCY_BUCKETS, LatencyHistogram, quantile
from cdc_outbox.monitoring.metrics import METRIC_NAMES
from cdc_outbox.telemetry.relay_stats import RelayStats
from tests.support.metrics import SETTINGS, busy_stats, exported_names, full_sample, scrape


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
