"""Catch-up progress (issue 27, small conventions): the total is counted once at the start,
rows done reach it, as the ``cdc_outbox_catch_up_backlog_rows`` and ``..._rows_done``
gauges and in the log."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from cdc_outbox.monitoring.latency import LatencyHistogram
from cdc_outbox.monitoring.metrics import RelayCollector
from cdc_outbox_dev import workload
from tests.support.relay import (
    init_for_catch_up,
    relay_settings,
    service_thread,
    wait_streamed_past_now,
)

ROWS = 2_500  # not a multiple of the catch-up's fetch size: the last partial block counts


def test_catch_up_reports_its_total_and_reaches_it(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = relay_settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    init_for_catch_up(settings)
    spec = workload.WorkloadSpec(events=ROWS, writers=1, aggregates=20, txn_sizes=(1, 10))
    workload.write_orders(pg_dsn, spec, columns=settings.column_names())
    caplog.set_level(logging.INFO, logger="cdc_outbox.cdc.catch_up")
    with service_thread(settings) as service:
        wait_streamed_past_now(pg_dsn, settings.slot_name, 300, lambda: f"{service.stats}")
        registry = CollectorRegistry()
        registry.register(RelayCollector(lambda: service.stats, LatencyHistogram()))
        total = registry.get_sample_value("cdc_outbox_catch_up_backlog_rows")
        done = registry.get_sample_value("cdc_outbox_catch_up_rows_done")
        assert service.stats.catch_ups == 1
    assert (total, done) == (ROWS, ROWS)
    assert f"catch-up: {ROWS} rows to publish" in caplog.text
    assert f"catch-up progress: {ROWS}/{ROWS} rows (100%)" in caplog.text
