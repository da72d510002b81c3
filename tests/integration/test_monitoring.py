"""Monitoring of a running relay against the real PostgreSQL and Kafka: the metrics endpoint
under load, polling figures, `cdc-outbox lag`, the heartbeat with least privilege, failures
(helpers in tests/support/monitoring.py)."""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cdc_outbox.config.monitoring import heartbeat_section, slot_monitor_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.monitoring import start_monitoring
from cdc_outbox.monitoring.heartbeat import Heartbeat
from cdc_outbox.monitoring.latency import LatencyHistogram
from cdc_outbox.monitoring.slot_monitor import SlotMonitor
from cdc_outbox.store import schema
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.telemetry.relay_stats import RelayStats
from cdc_outbox_dev.sandbox._proc import free_port
from tests.support.helpers import wait_until
from tests.support.http import get
from tests.support.monitoring import (
    api_lag,
    lag_json,
    load_thread,
    monitored_settings,
    run_cli_with,
    scrape,
)
from tests.support.relay import init_outbox, service_thread


def insert_event(dsn: str, payload: str | None = '{"n": 1}') -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
            " VALUES (%s, 'order', 'agg-x', 'OrderPlaced', %s)",
            (str(uuid.uuid4()), payload),
        )


# -- tests ---------------------------------------------------------------------------------


def test_endpoint_under_load_exports_every_metric_with_plausible_values(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    settings = monitored_settings(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, heartbeat_interval_s=0.5
    )
    init_outbox(settings)
    topic = f"{kafka_topic_prefix}.event.order"
    started = time.time()
    with service_thread(settings) as service, load_thread(pg_dsn, settings, rate=300):
        insert_event(pg_dsn, payload=None)  # a null payload is dead-lettered

        def ready() -> dict[str, float] | None:
            m = scrape(settings)
            keys = (
                f"cdc_outbox_events_published_total{{topic={topic}}}",
                f"cdc_outbox_events_dead_lettered_total{{topic={topic}}}",
                "cdc_outbox_ignored_messages_total{kind=message}",  # heartbeats in the stream
                "cdc_outbox_slot_decoded_transactions_total",
                "cdc_outbox_last_confirm_timestamp_seconds",
            )
            if all(m.get(k, 0) > 0 for k in keys) and m.get(keys[0], 0) >= 300:
                return m
            return None

        m = wait_until(ready, timeout=120, interval=0.5, message=lambda: str(service.stats))
        lag_doc = api_lag(settings)
        status, content_type, page = get(f"http://127.0.0.1:{settings.metrics_port}/dashboard")
    now = time.time()
    # relay figures
    assert (
        m["cdc_outbox_relay_mode{mode=cdc}"] == 1 and m["cdc_outbox_relay_mode{mode=polling}"] == 0
    )
    assert m["cdc_outbox_transactions_total"] > 0
    assert m["cdc_outbox_delivery_errors_total"] == 0
    assert m["cdc_outbox_relay_restarts_total"] == 0
    assert m[f"cdc_outbox_events_dead_lettered_total{{topic={topic}}}"] == 1
    assert m["cdc_outbox_events_in_flight"] >= 0
    count = m["cdc_outbox_commit_to_ack_latency_seconds_count"]
    assert count > 0 and m["cdc_outbox_commit_to_ack_latency_seconds_bucket{le=+Inf}"] == count
    assert 0 < m["cdc_outbox_commit_to_ack_latency_seconds_sum"] / count < 60
    assert started - 1 <= m["cdc_outbox_last_confirm_timestamp_seconds"] <= now + 1
    # the relay's own position (read at the scrape) is at or past the slot's (sampled before)
    assert m["cdc_outbox_confirmed_lsn_bytes"] >= m["cdc_outbox_slot_confirmed_flush_lsn_bytes"] > 0
    # slot figures (sampled by the monitor's own connection)
    assert m["cdc_outbox_monitor_up"] == 1 and m["cdc_outbox_monitor_errors_total"] == 0
    assert started - 1 <= m["cdc_outbox_monitor_last_sample_timestamp_seconds"] <= now + 1
    assert m["cdc_outbox_slot_present"] == 1 and m["cdc_outbox_slot_active"] == 1
    lag, retained = m["cdc_outbox_slot_lag_bytes"], m["cdc_outbox_slot_retained_wal_bytes"]
    assert 0 <= lag <= retained and lag < 64 * 2**20
    assert m["cdc_outbox_slot_confirmed_flush_lsn_bytes"] <= m["cdc_outbox_server_wal_lsn_bytes"]
    assert m["cdc_outbox_slot_restart_lsn_bytes"] <= m["cdc_outbox_slot_confirmed_flush_lsn_bytes"]
    states = {k: v for k, v in m.items() if k.startswith("cdc_outbox_slot_wal_status")}
    assert sum(states.values()) == 1
    assert states["cdc_outbox_slot_wal_status{status=reserved}"] == 1
    assert m["cdc_outbox_slot_safe_wal_size_bytes"] > 0  # the sandbox sets max_slot_wal_keep_size
    for name in ("spill_transactions", "spills", "spill_bytes", "stream_transactions", "streams",
                 "stream_bytes", "decoded_bytes"):  # fmt: skip
        assert m[f"cdc_outbox_slot_{name}_total"] >= 0
    assert m["cdc_outbox_slot_decoded_bytes_total"] > 0
    assert 0 <= m["cdc_outbox_oldest_unpublished_age_seconds"] < 60  # healthy: seconds at most
    assert not any(k.startswith("cdc_outbox_polling_") for k in m)  # polling figures: polling mode
    # heartbeat
    assert m["cdc_outbox_heartbeats_total"] > 0 and m["cdc_outbox_heartbeat_errors_total"] == 0
    assert m["cdc_outbox_heartbeat_last_success_timestamp_seconds"] >= started
    assert m["cdc_outbox_build_info{version=" + __import__("cdc_outbox").__version__ + "}"] == 1
    assert m["process_resident_memory_bytes"] > 0
    # the JSON the dashboard polls, and the dashboard page itself
    current = lag_doc["current"]
    assert current["mode"] == "cdc" and current["slot_active"] is True
    assert current["throughput_events_per_second"] > 0
    assert current["latency_p95_seconds"] is not None
    assert len(lag_doc["chart"]) >= 2 and lag_doc["refresh_seconds"] == 1.0
    assert status == 200 and content_type.startswith("text/html")
    assert b"/dashboard/dashboard.js" in page and b'data-metric="slot_lag_bytes"' in page


def test_http_routes_serve_packaged_assets_only(pg_dsn: str) -> None:
    settings = Settings.model_validate(
        {"dsn": pg_dsn, "metrics_port": free_port(), "monitor_interval_s": 1.0}
    )
    stats = RelayStats()
    with start_monitoring(settings, lambda: stats) as monitoring:
        assert monitoring.url == f"http://127.0.0.1:{settings.metrics_port}"
        base = monitoring.url
        status, ctype, body = get(base + "/dashboard/dashboard.js")
        assert status == 200 and ctype.startswith("text/javascript") and b"/api/lag" in body
        assert get(base + "/dashboard/dashboard.css")[0] == 200
        assert json.loads(get(base + "/healthz")[2])["status"] == "ok"
        for path in ("/dashboard/../config.py", "/dashboard/%2e%2e/config.py", "/nope"):
            assert get(base + path)[0] == 404, path
        doc = wait_until(lambda: api_lag(settings)["current"], timeout=30)
        assert doc["slot_present"] is False  # no slot in this database
        assert get(base + "/api/lag?since=NaN")[0] == 200


def test_polling_figures_and_lag_cli_read_the_outbox(pg_dsn: str) -> None:
    settings = Settings.model_validate(
        {"dsn": pg_dsn, "mode": "polling", "metrics_port": free_port(), "monitor_interval_s": 1.0}
    )
    init_outbox(settings)
    rows = [("PENDING", 0, 90), ("PENDING", 2, 10), ("PENDING", 0, 1), ("PROCESSING", 1, 30),
            ("FAILED", 10, 3000), ("FAILED", 10, 3000), ("PUBLISHED", 1, 5000)]  # fmt: skip
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for status, attempts, age_s in rows:
            conn.execute(
                "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload,"
                " status, attempts, created_at)"
                " VALUES (%s, 'order', 'a', 'T', '{}', %s, %s, now() - make_interval(secs => %s))",
                (str(uuid.uuid4()), status, attempts, age_s),
            )
    stats = RelayStats(mode="polling")
    with start_monitoring(settings, lambda: stats):
        m = wait_until(
            lambda: (v := scrape(settings)).get("cdc_outbox_polling_retrying_rows") and v
        )
        doc = lag_json(settings)  # reads the database itself (mode polling) and the endpoint
    assert m["cdc_outbox_polling_rows{status=pending}"] == 3
    assert m["cdc_outbox_polling_rows{status=processing}"] == 1
    assert m["cdc_outbox_polling_rows{status=failed}"] == 2
    assert m["cdc_outbox_polling_retrying_rows"] == 1
    assert m["cdc_outbox_polling_retry_attempts"] == 2
    assert 90 <= m["cdc_outbox_oldest_unpublished_age_seconds"] < 600  # the PENDING 90 s row
    assert m["cdc_outbox_relay_mode{mode=polling}"] == 1
    assert (doc["polling_pending"], doc["polling_processing"], doc["polling_failed"]) == (3, 1, 2)
    assert doc["polling_retrying_rows"] == 1 and doc["polling_retry_attempts"] == 2
    assert 90 <= doc["oldest_unpublished_age_seconds"] < 600
    assert doc["mode"] == "polling" and doc["relay"]["mode"] == "polling"
    assert doc["slot_present"] is True and doc["slot_active"] is False
    assert doc["slot_lag_bytes"] >= 0 and doc["slot_wal_status"] == "reserved"
    assert doc["relay_error"] is None
    # without the relay: the database figures alone, and a one-line reason
    alone = run_cli_with(settings, "lag", "--json", CDC_OUTBOX_METRICS_PORT=str(free_port()))
    assert alone.returncode == 0, alone.stderr
    alone_doc = json.loads(alone.stdout)
    assert alone_doc["relay"] is None and "not reachable" in alone_doc["relay_error"]
    assert alone_doc["polling_pending"] == 3
    table = run_cli_with(settings, "lag")
    assert table.returncode == 0, table.stderr
    assert "slot lag" in table.stdout and "oldest unpublished" in table.stdout
    watch = run_cli_with(
        settings, "lag", "--watch", "--json", "--interval", "0.2", "--iterations", "3"
    )
    assert watch.returncode == 0, watch.stderr
    lines = [json.loads(line) for line in watch.stdout.splitlines()]
    assert len(lines) == 3 and all(line["polling_pending"] == 3 for line in lines)
    live = run_cli_with(settings, "lag", "--watch", "--interval", "0.2", "--iterations", "2")
    assert live.returncode == 0, live.stderr
    assert "cdc-outbox lag" in live.stdout and "retained WAL" in live.stdout


def test_heartbeat_runs_with_least_privilege_and_a_failing_one_never_stops_the_stream(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    owner = monitored_settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    init_outbox(owner)
    role = f"relay_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for stmt in schema.role_ddl(owner, role):
            conn.execute(stmt)
    relay_dsn = make_conninfo(pg_dsn, user=role)
    settings = monitored_settings(
        relay_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, heartbeat_interval_s=0.3
    )
    try:
        with caplog.at_level(logging.INFO), service_thread(settings) as service:
            m = wait_until(
                lambda: (
                    (v := scrape(settings)).get("cdc_outbox_heartbeats_total", 0) >= 3
                    and v.get("cdc_outbox_ignored_messages_total{kind=message}", 0) >= 1
                    and v
                ),
                timeout=60,
                message=lambda: str(service.stats),
            )
            assert m["cdc_outbox_heartbeat_errors_total"] == 0
            assert m["cdc_outbox_monitor_up"] == 1  # the slot figures need no privilege either
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute(
                    "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text)"
                    " FROM PUBLIC"
                )
            wait_until(
                lambda: scrape(settings).get("cdc_outbox_heartbeat_errors_total", 0) >= 2,
                timeout=30,
            )
            published = service.stats.events_published
            insert_event(pg_dsn)
            wait_until(lambda: service.stats.events_published > published, timeout=60)
            assert scrape(settings)["cdc_outbox_slot_active"] == 1
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    failures = [r for r in caplog.records if "heartbeat failed (the stream goes on)" in r.message]
    assert failures and "permission denied" in failures[0].getMessage()
    assert len(failures) == 1  # logged at most once a minute while failing


def test_monitor_and_heartbeat_failures_are_counted_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = f"host=127.0.0.1 port={free_port()} dbname=x user=u password=hunter2 connect_timeout=2"
    settings = Settings.model_validate({"dsn": dead, "metrics_port": free_port()})
    stats = RelayStats()
    monitor = SlotMonitor(
        slot_monitor_section(settings),
        OutboxTable.all_of(settings),
        lambda: stats,
        LatencyHistogram(),
    )
    sample = monitor.sample_once()
    monitor.stop()
    assert sample.error and "hunter2" not in sample.error
    assert (monitor.up, monitor.errors, sample.slot_lag_bytes) == (False, 1, None)
    assert sample.mode == "cdc" and sample.events_published_total == 0
    heartbeat = Heartbeat(heartbeat_section(settings))
    assert heartbeat.beat() is False and heartbeat.errors == 1
    with socket.socket() as busy:  # the metrics port is taken: the relay runs without it
        busy.bind(("127.0.0.1", settings.metrics_port))
        busy.listen()
        with caplog.at_level(logging.ERROR), start_monitoring(settings, lambda: stats) as m:
            assert m.server is None
            wait_until(lambda: m.monitor.errors >= 1 and not m.monitor.up, timeout=30)
    assert any("metrics endpoint" in r.getMessage() for r in caplog.records)
    assert not any("hunter2" in r.getMessage() for r in caplog.records)
    assert stats.latency_observers == []  # the histogram is detached on exit
