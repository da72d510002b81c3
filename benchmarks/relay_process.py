"""The relay under test as its own process, measured from outside (issue 38 item 1).

:class:`RelayProcess` runs ``python -m cdc_outbox run`` (what a user runs), its settings in
``CDC_OUTBOX_*`` environment variables (:func:`settings_env`); the benchmark process only
writes, watches and stops it. :class:`VisibleCounter` is the outside view: a Kafka consumer
(``read_committed``: exactly-once events count once their transaction committed) on the
relay's topics, from their ends when it starts, noting when the first record arrived and
when the ``n``-th did. Throughput is ``n`` events over first-to-last record, as a consumer of
the topics sees it; start-up (process start to first record) is reported apart.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from benchmarks.cpu import CpuMeter, process_cpu
from cdc_outbox.config.settings import ENV_PREFIX, Settings

logger = logging.getLogger(__name__)


def settings_values(settings: Settings) -> dict[str, Any]:
    """What ``settings`` sets apart from the defaults, as ``Settings.model_validate`` takes
    it (the DSN in clear: the relay process needs it)."""
    values = settings.model_dump(mode="json", exclude_defaults=True)
    values["dsn"] = settings.dsn.get_secret_value()
    return values


def settings_env(values: Mapping[str, Any], prefix: str = ENV_PREFIX) -> dict[str, str]:
    """``CDC_OUTBOX_*`` variables that give the relay ``values`` (a settings dict as
    ``Settings.model_validate`` takes it): nested models as ``A__B``, a dict leaf (e.g.
    ``kafka.config``) or a list as JSON, booleans as ``true``/``false``."""
    env: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}".upper()
        if isinstance(value, Mapping) and key != "config":
            env.update(settings_env(value, f"{name}__"))
        elif isinstance(value, (Mapping, list, tuple)):
            env[name] = json.dumps(value)
        elif isinstance(value, bool):
            env[name] = "true" if value else "false"
        else:
            env[name] = str(value)
    return env


class RelayProcess:
    """``python -m cdc_outbox run`` (or another ``command``, e.g. ``consume``) with ``values``
    as its settings; output to ``log``.
    :meth:`stop` sends SIGTERM (the relay flushes, confirms and exits 0) and raises if it
    exited otherwise or died before."""

    def __init__(
        self,
        values: Mapping[str, Any],
        log: Path,
        profile: Path | None = None,
        command: tuple[str, ...] = ("run",),
    ) -> None:
        self.values = dict(values)
        self.log = log
        self.profile = profile  # a cProfile of the whole process, written at its exit
        self.command = command  # the cdc-outbox command and its options
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RelayProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        env.update(settings_env({"log_level": "WARNING", **self.values}))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
        self.log.parent.mkdir(parents=True, exist_ok=True)
        profiled = ["-m", "cProfile", "-o", str(self.profile)] if self.profile else []
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(
                [sys.executable, *profiled, "-m", "cdc_outbox", *self.command],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None, "start() first"
        return self._proc.pid

    def cpu_s(self) -> float:
        """CPU seconds the relay process used so far (0.0 before it started)."""
        return process_cpu(self._proc.pid) if self._proc is not None else 0.0

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 120.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"relay did not stop in {timeout}s (log: {self.log})") from None
        if proc.returncode != 0:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"relay exited {proc.returncode} (log {self.log}):\n{tail}")

    def __enter__(self) -> RelayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:  # the phase failed: end the relay, keep that error
            try:
                self.stop(30)
            except RuntimeError as err:
                logger.warning("%s", err)
        else:
            self.stop()


class VisibleCounter:
    """Counts records a ``read_committed`` consumer sees on the topics named ``topics``
    (existing ones: create them first), from their current ends; ``first_at`` and
    ``last_at`` (``time.perf_counter``) are when the first and the latest record arrived,
    ``first_count`` how many came with the first. With ``keep_ids``, ``seen`` maps each
    record's event id (its ``id`` header) to when it arrived (``time.time()``)."""

    def __init__(self, bootstrap: str, topics: list[str], *, keep_ids: bool = False) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-visible-{time.time_ns()}",
                "enable.auto.commit": "false",
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": "10",
            }
        )
        parts: list[TopicPartition] = []
        meta = self._consumer.list_topics(timeout=30).topics
        for topic in topics:
            for pid in meta[topic].partitions:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, pid), timeout=30
                )
                parts.append(TopicPartition(topic, pid, high))
        self._consumer.assign(parts)
        self.count = 0
        self.seen: dict[str, float] | None = {} if keep_ids else None
        self.first_at: float | None = None
        self.first_count = 0
        self.last_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="visible-counter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            # consume(n, timeout) waits for n records or the timeout: poll returns on the
            # first record, consume(n, 0) then takes what is already fetched.
            first = self._consumer.poll(0.05)
            if first is not None:
                got = [first, *self._consumer.consume(100_000, 0)]
                now = time.perf_counter()
                seen = sum(1 for m in got if m.error() is None)
                if self.seen is not None:
                    _note_ids(got, time.time(), self.seen)
                if self.first_at is None and seen:
                    self.first_at, self.first_count = now, seen
                self.last_at = now
                self.count += seen

    def wait_for(self, n: int, timeout: float, alive: Callable[[], bool] | None = None) -> None:
        """Until ``n`` records were seen; ``alive()`` False (the relay died) or the timeout
        raise ``RuntimeError``."""
        deadline = time.monotonic() + timeout
        while self.count < n:
            if time.monotonic() > deadline or (alive is not None and not alive()):
                raise RuntimeError(f"{self.count}/{n} records visible")
            time.sleep(0.005)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def _note_ids(records: list[Any], now: float, seen: dict[str, float]) -> None:
    for record in records:
        if record.error() is None:
            for key, value in record.headers() or ():
                if key == "id" and isinstance(value, bytes):
                    seen[value.decode()] = now
                    break


@dataclass(frozen=True)
class Drained:
    """One relay phase seen from outside: ``seconds`` from the first visible record to the
    ``events``-th, ``timed_events`` the records after the first batch the consumer got (the
    rate is ``timed_events / seconds``), ``start_s`` from the process start to the first
    visible record, cores used per process over the whole phase, the relay process's CPU."""

    seconds: float
    timed_events: int
    start_s: float
    cores: dict[str, float]
    relay_cpu_s: float

    @property
    def events_per_s(self) -> float:
        return self.timed_events / self.seconds


def phase_topics(settings: Settings, aggregate_types: tuple[str, ...] = ("order",)) -> list[str]:
    """The topics the relay writes the workload's events to (of every outbox table)."""
    templates = dict.fromkeys(o.topic_template for o in settings.outbox_settings())
    return [t.replace("{aggregate_type}", a) for t in templates for a in aggregate_types]


def drain(
    settings: Settings,
    events: int,
    cpu: CpuMeter,
    log: Path,
    *,
    profile: Path | None = None,
    timeout: float = 600.0,
) -> Drained:
    """Run the relay (its own process, ``settings``) until a consumer of its topics (created
    beforehand) has seen ``events`` records, then stop it (SIGTERM, exit 0 expected)."""
    counter = VisibleCounter(settings.kafka.bootstrap_servers, phase_topics(settings))
    relay = RelayProcess(settings_values(settings), log, profile)
    meter = cpu.with_probes({"relay_process": relay.cpu_s, "bench_process": _own_cpu})
    try:
        meter.start()
        t0 = time.perf_counter()
        with relay:
            counter.wait_for(events, timeout, relay.alive)
            end = time.perf_counter()
            cores = meter.cores_used(end - t0)
            relay_cpu = relay.cpu_s()
    finally:
        counter.close()
    assert counter.first_at is not None
    return Drained(
        seconds=counter.last_at - counter.first_at,
        timed_events=events - counter.first_count,
        start_s=counter.first_at - t0,
        cores=cores,
        relay_cpu_s=relay_cpu,
    )


def _own_cpu() -> float:
    return process_cpu(os.getpid())


class Running:
    """The relay (its own process) and a :class:`VisibleCounter` of its topics (from their
    ends when made), for phases that write while it runs: ``start``, ``wait_first``,
    ``wait_published``, ``stop`` (which re-raises how the relay failed). With ``profile`` the
    relay process runs under cProfile (written there at its exit)."""

    def __init__(
        self,
        settings: Settings,
        log: Path,
        *,
        keep_ids: bool = False,
        profile: Path | None = None,
    ) -> None:
        self.mode = settings.mode
        self.counter = VisibleCounter(
            settings.kafka.bootstrap_servers, phase_topics(settings), keep_ids=keep_ids
        )
        self.relay = RelayProcess(settings_values(settings), log, profile)

    def meter(self, cpu: CpuMeter) -> CpuMeter:
        """``cpu`` with ``relay_process`` the relay's process (and this one apart)."""
        return cpu.with_probes({"relay_process": self.relay.cpu_s, "bench_process": _own_cpu})

    def start(self) -> Running:
        self.relay.start()
        return self

    def wait_first(self, timeout: float) -> int:
        """Until the first records are visible; returns how many came first."""
        self.wait_published(1, timeout)
        return self.counter.first_count

    def wait_published(self, events: int, timeout: float) -> None:
        try:
            self.counter.wait_for(events, timeout, self.relay.alive)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{self.mode}: {exc}") from None

    def stop(self) -> None:
        try:
            self.relay.stop()
        finally:
            self.counter.close()


def noop_handler(conn: Any, event: Any) -> None:
    """The end-to-end phase's handler for ``cdc-outbox consume``: applies nothing (the
    consumer's own transaction, with its ``processed_events`` row, is what is timed)."""
