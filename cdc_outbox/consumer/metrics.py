"""Prometheus metrics of one idempotent consumer (its own registry; serve it with
:func:`serve`). Plain counters are kept too, for tests and benchmarks."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

__all__ = ["OUTCOMES", "PROCESSED", "ConsumerMetrics", "serve"]

#: What happened to a record: applied by the handler, skipped as a duplicate, dead-lettered.
OUTCOMES = ("processed", "duplicate", "dead_lettered")
#: The ``(outcome, reason)`` of a record its handler applied (the common case).
PROCESSED = ("processed", "")


class ConsumerMetrics:
    """``cdc_outbox_consumer_{processed,duplicates,retries,dead_lettered}_total`` and
    ``cdc_outbox_consumer_lag`` (records behind the high watermark, per partition)."""

    def __init__(self, consumer_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.name = consumer_name
        labels = ["consumer"]
        r = self.registry
        self._processed = Counter(
            "cdc_outbox_consumer_processed", "Events applied by the handler", labels, registry=r
        )
        self._duplicates = Counter(
            "cdc_outbox_consumer_duplicates", "Events skipped as already processed", labels,
            registry=r,
        )  # fmt: skip
        self._retries = Counter(
            "cdc_outbox_consumer_retries", "Handler attempts that failed and were retried",
            labels, registry=r,
        )  # fmt: skip
        self._dead = Counter(
            "cdc_outbox_consumer_dead_lettered", "Events sent to the consumer dead-letter topic",
            [*labels, "reason"], registry=r,
        )  # fmt: skip
        self._lag = Gauge(
            "cdc_outbox_consumer_lag", "Records between the consumer's position and the end",
            [*labels, "topic", "partition"], registry=r,
        )  # fmt: skip
        self.counts = {"processed": 0, "duplicate": 0, "dead_lettered": 0, "retried": 0}

    def outcome(self, outcome: str, reason: str = "") -> None:
        self.record([(outcome, reason)])

    def record(self, outcomes: Iterable[tuple[str, str]]) -> None:
        """Count ``(outcome, reason)`` pairs (one per finished record; one update per kind)."""
        if isinstance(outcomes, list) and outcomes.count(PROCESSED) == len(outcomes):
            if outcomes:  # the common case: all processed, counted without a Counter
                self.counts["processed"] += len(outcomes)
                self._processed.labels(self.name).inc(len(outcomes))
            return
        tally = collections.Counter(
            (o, "" if o != "dead_lettered" else "blocked" if r.startswith("blocked_by")
             else "failed")
            for o, r in outcomes
        )  # fmt: skip
        for (outcome, kind), n in tally.items():
            self.counts[outcome] += n
            if outcome == "processed":
                self._processed.labels(self.name).inc(n)
            elif outcome == "duplicate":
                self._duplicates.labels(self.name).inc(n)
            else:
                self._dead.labels(self.name, kind).inc(n)

    def retried(self) -> None:
        self.counts["retried"] += 1
        self._retries.labels(self.name).inc()

    def lag(self, values: dict[tuple[str, int], int]) -> None:
        for (topic, partition), lag in values.items():
            self._lag.labels(self.name, topic, str(partition)).set(lag)

    def forget(self, parts: list[tuple[str, int]]) -> None:
        """Drop the lag series of revoked partitions."""
        for topic, partition in parts:
            with contextlib.suppress(KeyError):
                self._lag.remove(self.name, topic, str(partition))


def serve(metrics: ConsumerMetrics, port: int, host: str = "127.0.0.1") -> None:
    """Serve ``/metrics`` of ``metrics`` on ``host:port`` (a daemon thread)."""
    start_http_server(port, addr=host, registry=metrics.registry)
