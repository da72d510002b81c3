"""Liveness and readiness for ``/healthz`` and ``/readyz`` (Kubernetes probes, HEALTHCHECK).

Contract:
- Liveness: the main loop turned within ``health.loop_stale_s`` (``RelayStats.last_loop_unix``)
  and no error that cannot heal is ending the service (``RelayStats.fatal``: status
  ``failed``, the error line in ``error``, while it shuts down).
  For a role whose loop never called ``RelayStats.beat`` (code not instrumented yet) the
  endpoint beats for it when asked: liveness then means "the process serves HTTP". (Not the
  check thread: a check hanging on a frozen database must not make the process look dead.)
- Readiness: PostgreSQL answered ``SELECT 1`` (a connection borrowed from
  :mod:`cdc_outbox.store.db_pool`, so a pool that cannot lend one is not ready) and Kafka returned
  cluster metadata (:class:`~cdc_outbox.kafka.publisher.KafkaProbe`), both in the latest
  background check, which runs every ``health.check_interval_s`` with ``health.check_timeout_s``
  timeouts. A request only reads cached results, so probes are cheap; results older than a
  few intervals (a check hanging) count as not ready. A standby is ready too: the body names
  the role.
- Nothing here raises into the relay; errors are one line with secrets masked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc_outbox.config.monitoring import HealthSection
from cdc_outbox.kafka.probe import KafkaProbe
from cdc_outbox.monitoring.background import BackgroundLoop
from cdc_outbox.monitoring.lag import one_line
from cdc_outbox.store import db_pool
from cdc_outbox.telemetry.relay_stats import RelayStats

__all__ = ["CheckResult", "HealthChecks"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One dependency check: outcome, error line (secrets masked), when and how long."""

    ok: bool
    error: str | None
    checked_unix: float
    duration_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "error": self.error,
            "checked_unix": round(self.checked_unix, 3),
            "duration_s": round(self.duration_s, 3),
        }


class HealthChecks(BackgroundLoop):
    """Background readiness checks and the liveness rule; ``start``/``stop`` the thread."""

    thread_name = "health-checks"

    def __init__(self, section: HealthSection, stats: Callable[[], RelayStats]) -> None:
        """``section``: :func:`cdc_outbox.config.monitoring.health_section`."""
        self.section = section
        self._stats = stats
        health = section.health
        self.interval_s = health.check_interval_s
        self.timeout_s = health.check_timeout_s
        self.loop_stale_s = health.loop_stale_s
        self.results: dict[str, CheckResult] = {}
        self._kafka: KafkaProbe | None = None
        self._failing: set[str] = set()
        super().__init__()

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self, timeout: float = 10.0) -> None:
        super().stop(timeout)
        self._kafka = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_checks()
            except Exception:  # the thread must survive anything
                logger.exception("health checks failed unexpectedly")
            self._stop.wait(self.interval_s)

    # -- the checks --------------------------------------------------------------------------

    def run_checks(self) -> dict[str, CheckResult]:
        """Check PostgreSQL and Kafka now (bounded by the timeout each) and keep the results."""
        self._record("postgres", self._check_postgres)
        self._record("kafka", self._check_kafka)
        return dict(self.results)

    def _record(self, name: str, check: Callable[[], None]) -> None:
        started, t0 = time.time(), time.monotonic()
        error: str | None = None
        try:
            check()
        except Exception as exc:
            error = one_line(exc, self.section.database)
        self.results[name] = CheckResult(error is None, error, started, time.monotonic() - t0)
        if error is not None and name not in self._failing:
            self._failing.add(name)
            logger.warning("readiness: %s check failed: %s", name, error)
        elif error is None and name in self._failing:
            self._failing.discard(name)
            logger.info("readiness: %s reachable again", name)

    def _check_postgres(self) -> None:
        with db_pool.pooled(
            self.section.database, timeout=self.timeout_s, statement_timeout_s=self.timeout_s
        ) as conn:
            conn.execute("SELECT 1").fetchone()

    def _check_kafka(self) -> None:
        if self._kafka is None:
            self._kafka = KafkaProbe(dict(self.section.kafka_config))
        self._kafka.check(self.timeout_s)

    # -- what the endpoints answer -----------------------------------------------------------

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        """(alive, JSON body) for ``/healthz``."""
        stats = self._stats()
        if stats.role not in stats.beating_roles:
            stats.last_loop_unix = time.time()  # no loop of this role beats: we do
        last = stats.last_loop_unix
        age = time.time() - last if last else None
        alive = age is not None and age <= self.loop_stale_s and stats.fatal is None
        status = "ok" if alive else "stale" if stats.fatal is None else "failed"
        return alive, {
            "status": status,
            "error": stats.fatal,
            "role": stats.role,
            "mode": stats.mode,
            "last_loop_unix": round(last, 3) if last else None,
            "loop_age_s": None if age is None else round(age, 3),
            "loop_stale_s": self.loop_stale_s,
            "beat_by": "relay" if stats.role in stats.beating_roles else "monitor",
        }

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """(ready, JSON body) for ``/readyz`` from the cached results (see the contract)."""
        stats = self._stats()
        now = time.time()
        max_age = 3 * self.interval_s + 2 * self.timeout_s + 1.0
        checks: dict[str, Any] = {}
        ready = True
        for name in ("postgres", "kafka"):
            result = self.results.get(name)
            if result is None:
                checks[name] = {"ok": False, "error": "not checked yet"}
                ready = False
                continue
            entry = result.to_dict()
            if result.ok and now - result.checked_unix > max_age:
                entry.update(ok=False, error=f"last check {now - result.checked_unix:.0f}s ago")
            checks[name] = entry
            ready = ready and bool(entry["ok"])
        return ready, {
            "status": "ready" if ready else "not ready",
            "role": stats.role,
            "mode": stats.mode,
            "phase": stats.phase or None,
            "checks": checks,
        }
