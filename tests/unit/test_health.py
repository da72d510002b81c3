"""The liveness and readiness rules (cdc_outbox.monitoring.health) and RelayStats.beat, without
servers: results are set by hand, no background thread runs."""

from __future__ import annotations

import threading
import time

from cdc_outbox.config.monitoring import health_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.monitoring.health import CheckResult, HealthChecks
from cdc_outbox.telemetry.relay_stats import RelayStats

SETTINGS = Settings.model_validate({"dsn": "host=127.0.0.1 dbname=x", "metrics_port": 0})


def test_beat_records_time_and_role() -> None:
    stats = RelayStats()
    assert stats.last_loop_unix == 0.0 and not stats.beating_roles
    stats.beat()
    assert time.time() - stats.last_loop_unix < 1 and stats.beating_roles == {"standby"}
    stats.role = "leader"
    stats.beat()
    assert stats.beating_roles == {"standby", "leader"}


def test_beating_event_beats_on_every_check_and_wait() -> None:
    stats, stop = RelayStats(), threading.Event()
    view = stats.beating(stop)
    assert view.is_set() is False and stats.beating_roles == {"standby"}
    stats.last_loop_unix = 0.0
    assert view.wait(0.01) is False and stats.last_loop_unix > 0
    view.set()
    assert stop.is_set() and view.is_set() and view.wait(0)
    view.clear()
    assert not stop.is_set()


def test_liveness_monitor_beats_only_for_roles_without_their_own_beat() -> None:
    stats = RelayStats(role="leader")
    health = HealthChecks(health_section(SETTINGS), lambda: stats)
    alive, body = health.liveness()  # nothing of the leader beats: serving is alive
    assert alive and body["beat_by"] == "monitor" and body["role"] == "leader"
    stats.beat()
    stats.last_loop_unix -= SETTINGS.health.loop_stale_s + 1
    alive, body = health.liveness()  # the leader loop beats itself: no cover-up
    assert not alive and body["status"] == "stale" and body["beat_by"] == "relay"
    assert body["loop_age_s"] > SETTINGS.health.loop_stale_s
    stats.role = "standby"  # a role that does not beat (yet) is covered again
    assert health.liveness()[0]


def test_readiness_needs_fresh_successful_checks_of_both() -> None:
    stats = RelayStats(role="standby", mode="polling", phase="POLLING")
    health = HealthChecks(health_section(SETTINGS), lambda: stats)
    ready, body = health.readiness()
    assert not ready and body["checks"]["postgres"]["error"] == "not checked yet"
    now = time.time()
    health.results["postgres"] = CheckResult(True, None, now, 0.01)
    health.results["kafka"] = CheckResult(False, "Kafka not reachable: x", now, 2.0)
    ready, body = health.readiness()
    assert not ready and body["checks"]["kafka"]["error"] == "Kafka not reachable: x"
    health.results["kafka"] = CheckResult(True, None, now, 0.02)
    ready, body = health.readiness()
    assert ready and body == {
        "status": "ready",
        "role": "standby",
        "mode": "polling",
        "phase": "POLLING",
        "checks": {name: health.results[name].to_dict() for name in ("postgres", "kafka")},
    }
    health.results["postgres"] = CheckResult(True, None, now - 60, 0.01)  # the check hangs
    ready, body = health.readiness()
    assert not ready and "ago" in body["checks"]["postgres"]["error"]


def test_postgres_check_error_masks_the_password() -> None:
    settings = Settings.model_validate(
        {"dsn": "host=127.0.0.1 port=1 dbname=x password=s3cret-pw", "metrics_port": 0}
    )
    health = HealthChecks(health_section(settings), RelayStats)
    health._record("postgres", lambda: (_ for _ in ()).throw(OSError("auth s3cret-pw failed")))
    result = health.results["postgres"]
    assert not result.ok and result.error == "auth *** failed"


def test_liveness_fails_while_a_fatal_error_ends_the_service() -> None:
    stats = RelayStats(role="leader")
    stats.beat()
    health = HealthChecks(health_section(SETTINGS), lambda: stats)
    assert health.liveness()[0]
    stats.fatal = "schema: table public.nosuch does not exist (fix: ...)"
    alive, body = health.liveness()
    assert not alive
    assert body["status"] == "failed" and body["error"] == stats.fatal
