"""``/healthz`` and ``/readyz`` against the real PostgreSQL and Kafka: readiness follows the
database going away and coming back, liveness follows the main loop's heartbeat."""

from __future__ import annotations

import json
import time
from typing import Any

from cdc_outbox.config.settings import Settings
from cdc_outbox.monitoring import start_monitoring
from cdc_outbox.telemetry.relay_stats import RelayStats
from cdc_outbox_dev.sandbox._proc import free_port
from cdc_outbox_dev.sandbox.kafka import LocalKafka
from cdc_outbox_dev.sandbox.postgres import LocalPostgres
from tests.support.helpers import wait_until
from tests.support.http import get
from tests.support.relay import init_outbox, relay_settings, service_thread


def probe(base: str, path: str) -> tuple[int, dict[str, Any]]:
    status, content_type, body = get(base + path)
    assert content_type == "application/json", content_type
    return status, json.loads(body)


def checked(response: tuple[int, dict[str, Any]]) -> tuple[int, dict[str, Any]] | None:
    """``response`` once both dependencies were checked at least once."""
    checks = response[1]["checks"].values()
    return response if all("checked_unix" in c for c in checks) else None


def test_readyz_follows_postgres_down_and_up(
    pg_server: LocalPostgres, pg_dsn: str, kafka_broker: LocalKafka
) -> None:
    settings = Settings.model_validate(
        {
            "dsn": pg_dsn,
            "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers},
            "metrics_port": free_port(),
        }
    )
    assert settings.health.check_interval_s == 2.0  # the defaults are what is tested
    stats = RelayStats()
    with start_monitoring(settings, lambda: stats) as monitoring:
        base = str(monitoring.url)
        _, body = wait_until(lambda: (r := probe(base, "/readyz"))[0] == 200 and r, timeout=15)
        assert body["status"] == "ready" and body["role"] == "standby"
        assert body["checks"]["postgres"]["ok"] and body["checks"]["kafka"]["ok"]
        stats.role = "leader"
        assert probe(base, "/readyz")[1]["role"] == "leader"

        pg_server.stop()
        stopped = time.monotonic()
        _, body = wait_until(
            lambda: (r := probe(base, "/readyz"))[0] == 503 and r,
            timeout=10,
            message="/readyz still 200 with PostgreSQL stopped",
        )
        assert time.monotonic() - stopped < 10
        assert body["status"] == "not ready" and body["role"] == "leader"
        assert body["checks"]["postgres"]["ok"] is False and body["checks"]["postgres"]["error"]
        assert body["checks"]["kafka"]["ok"] is True
        assert probe(base, "/healthz")[0] == 200  # not ready is not dead

        pg_server.start()
        wait_until(lambda: probe(base, "/readyz")[0] == 200, timeout=15, message="not ready again")


def test_readyz_needs_kafka(pg_dsn: str) -> None:
    settings = Settings.model_validate(
        {
            "dsn": pg_dsn,
            "kafka": {"bootstrap_servers": f"127.0.0.1:{free_port()}"},  # nothing listens
            "metrics_port": free_port(),
            "health": {"check_interval_s": 0.5, "check_timeout_s": 1.0},
        }
    )
    stats = RelayStats()
    with start_monitoring(settings, lambda: stats) as monitoring:
        base = str(monitoring.url)
        status, body = wait_until(lambda: checked(probe(base, "/readyz")), timeout=10)
        assert status == 503
        assert body["checks"]["postgres"]["ok"] is True
        assert "Kafka not reachable" in body["checks"]["kafka"]["error"]


def test_healthz_follows_the_loop_heartbeat(pg_dsn: str) -> None:
    settings = Settings.model_validate(
        {"dsn": pg_dsn, "metrics_port": free_port(), "health": {"loop_stale_s": 30}}
    )
    stats = RelayStats()
    with start_monitoring(settings, lambda: stats) as monitoring:
        base = str(monitoring.url)
        status, body = probe(base, "/healthz")
        assert status == 200 and body["status"] == "ok" and body["beat_by"] == "monitor"
        stats.beat()  # the standby loop beats from now on: the monitor no longer does
        status, body = probe(base, "/healthz")
        assert status == 200 and body["beat_by"] == "relay" and body["loop_age_s"] < 5
        stats.last_loop_unix -= 31  # the loop stopped turning 31 s ago
        mark = time.time()  # a health-check round begun after this passes: it must not refresh it
        wait_until(
            lambda: (r := monitoring.health.results.get("postgres")) and r.checked_unix > mark,
            timeout=10,
        )
        status, body = probe(base, "/healthz")
        assert status == 503 and body["status"] == "stale" and body["loop_age_s"] > 30
        stats.beat()
        assert probe(base, "/healthz")[0] == 200


def test_running_service_is_ready_as_leader(
    pg_dsn: str, kafka_broker: LocalKafka, kafka_topic_prefix: str
) -> None:
    settings = relay_settings(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, metrics_port=free_port()
    )
    init_outbox(settings)
    base = f"http://127.0.0.1:{settings.metrics_port}"
    with service_thread(settings):
        status, body = wait_until(
            lambda: (r := probe(base, "/readyz"))[0] == 200 and r[1]["role"] == "leader" and r,
            timeout=30,
        )
        assert body["mode"] == "cdc"
        status, body = probe(base, "/healthz")
        assert status == 200 and body["role"] == "leader"
