"""A monitored relay under load, seen from outside: settings with a metrics endpoint, a load
of orders at a fixed rate, the endpoint's figures and ``cdc-outbox lag``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from cdc_outbox.config.settings import Settings
from cdc_outbox_dev import workload
from cdc_outbox_dev.sandbox._proc import free_port
from tests.support.http import get
from tests.support.relay import relay_settings


def monitored_settings(dsn: str, bootstrap: str, prefix: str, **overrides: Any) -> Settings:
    """:func:`relay_settings` with a metrics endpoint on a free port, sampled every second."""
    values: dict[str, Any] = {
        "mode": "cdc",
        "metrics_port": free_port(),
        "monitor_interval_s": 1.0,
    }
    values.update(overrides)
    return relay_settings(dsn, bootstrap, prefix, **values)


@contextmanager
def load_thread(dsn: str, settings: Settings, rate: float) -> Iterator[workload.WriteReport]:
    """Orders written at ``rate`` events/s (2 writers) until the block exits."""
    stop = threading.Event()
    spec = workload.WorkloadSpec(
        events=10_000_000, writers=2, aggregates=50, txn_sizes=(1, 5, 20), rate=rate
    )
    reports: list[workload.WriteReport] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            reports.append(
                workload.write_orders(dsn, spec, columns=settings.column_names(), stop=stop)
            )
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name="load", daemon=True)
    thread.start()
    report = workload.WriteReport()
    try:
        yield report
    finally:
        stop.set()
        thread.join(60)
    if errors:
        raise errors[0]
    if reports:
        report.committed = reports[0].committed


def scrape(settings: Settings) -> dict[str, float]:
    """``{name{label=value,...}: value}`` from the relay's /metrics."""
    status, _, body = get(f"http://127.0.0.1:{settings.metrics_port}/metrics")
    assert status == 200
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            values[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return values


def api_lag(settings: Settings) -> dict[str, Any]:
    """The endpoint's ``/api/lag`` document."""
    status, _, body = get(f"http://127.0.0.1:{settings.metrics_port}/api/lag")
    assert status == 200
    doc: dict[str, Any] = json.loads(body)
    return doc


def run_cli_with(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m cdc_outbox <args>`` configured like ``settings`` (via CDC_OUTBOX_*)."""
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_OUTBOX_")}
    environ.update(
        CDC_OUTBOX_DSN=settings.postgres_dsn(),
        CDC_OUTBOX_SLOT_NAME=settings.slot_name,
        CDC_OUTBOX_MODE=settings.mode,
        CDC_OUTBOX_METRICS_PORT=str(settings.metrics_port),
    )
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "cdc_outbox", *args],
        env=environ, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def lag_json(settings: Settings) -> dict[str, Any]:
    """``cdc-outbox lag --json`` configured like ``settings``, parsed."""
    result = run_cli_with(settings, "lag", "--json")
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def metric(settings: Settings, name: str) -> float:
    """One sample of the relay's /metrics (``name{label=value,...}``); 0 while it is absent or
    the endpoint does not answer yet."""
    try:
        return scrape(settings).get(name, 0.0)
    except OSError:
        return 0.0
