"""CDC vs polling in one run, same broker, same workload: ``python -m benchmarks compare``.

Each mode runs ``cdc-outbox run``'s :class:`~cdc_outbox.service.Service` with default settings
(``mode`` = cdc or polling; polling at its default ``poll_interval_s`` and ``batch_size``), on a
fresh outbox table filled by the same workload:

1. throughput: ``--events`` events are written first (a backlog), then the relay runs until
   all of them are visible in Kafka (acknowledged; exactly-once: committed); events/s counts
   from the first visible events, the ones after them (start-up and exactly-once's first
   commit interval are reported apart, as ``start_s``).
2. latency: with the relay running, writers (another process) offer ``--rate`` events/s, first
   for ``--latency-warmup-seconds`` unmeasured (the broker's JIT compiles the mode's code
   paths: a fresh broker's first seconds of transactions stall now and then), then for
   ``--latency-seconds``; each event's latency runs to its delivery report from the commit
   (CDC: the commit record's timestamp) or from ``created_at`` (polling: ``clock_timestamp()``
   at insert, shortly before the commit, which if anything favours polling by up to one
   transaction's duration).

Costs per event: outbox row writes (``n_tup_ins + n_tup_upd + n_tup_del`` of the outbox table)
and WAL bytes (``pg_current_wal_lsn`` delta, the whole server: business rows included, the
same for both modes), each split into the writers' part and the relay's part. The printed
table and the Markdown report (``--results PATH``) come from :mod:`benchmarks.compare_report`.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from benchmarks import compare_report, mark_cost
from benchmarks.costs import costs_per_event, outbox_writes, percentile
from benchmarks.cpu import CpuMeter
from benchmarks.relay_bench import current_wal, services, setup
from cdc_outbox.config import Settings
from cdc_outbox.kafka.delivery_failure import Headers
from cdc_outbox.kafka.publisher import KafkaPublisher
from cdc_outbox.outbox_mapping import ColumnNames
from cdc_outbox.service import Service
from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import count_records

SLOT, PUBLICATION, TABLE = "bench_compare", "bench_compare_pub", "bench_compare_outbox"
#: ``cdc_eos``: CDC with ``delivery = "exactly_once"`` (Kafka transactions, defaults).
MODES = ("cdc", "cdc_eos", "polling")
TARGET_THROUGHPUT_RATIO, TARGET_P99_RATIO = 3.0, 0.2
#: Exactly-once vs at-least-once: throughput at 100-row transactions, p99 + commit interval.
EOS_THROUGHPUT_RATIO, EOS_TXN_SIZE = 0.8, 100


def _settings(dsn: str, bootstrap: str, mode: str, topic_prefix: str) -> Settings:
    return Settings.model_validate(
        {
            "dsn": dsn,
            "mode": "cdc" if mode == "cdc_eos" else mode,
            "delivery": "exactly_once" if mode == "cdc_eos" else "at_least_once",
            "eos": {"checkpoint_topic": topic_prefix + ".checkpoints"},
            "slot_name": SLOT,
            "publication_name": PUBLICATION,
            "outbox_table": TABLE,
            "topic_template": topic_prefix + ".{aggregate_type}",
            "metrics_port": 0,
            "kafka": {"bootstrap_servers": bootstrap},
        }
    )


def _fresh(settings: Settings) -> None:
    """Fresh table (new statistics) and publication; a slot only for CDC."""
    setup(settings, [SLOT] if settings.mode == "cdc" else [], relay_slots=[])
    if settings.mode != "cdc":  # drop a CDC slot left by an earlier phase: it retains WAL
        with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (SLOT,),
            )


def _create_topic(settings: Settings, topic: str) -> None:
    """One warm-up record, so that no phase times topic creation."""
    warm = KafkaPublisher(settings.kafka_config())
    warm.produce(topic, b"warmup", b"{}", [], _Warmup())
    if warm.close(30):
        raise RuntimeError(f"could not create topic {topic}")


class _Warmup:
    def delivered(self, topic: str, headers: Headers) -> None:
        pass

    def failed(self, failure: object) -> None:
        raise RuntimeError(f"warm-up record failed: {failure}")


class _Running:
    """A Service on a thread; stopped (errors re-raised) by :meth:`stop`."""

    def __init__(self, settings: Settings) -> None:
        self.eos = settings.delivery == "exactly_once"
        self.service = Service(settings)
        self.stats = self.service.stats
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._target, name=f"relay-{settings.mode}", daemon=True
        )

    def _target(self) -> None:
        try:
            self.service.run()
        except BaseException as exc:
            self._errors.append(exc)

    def start(self) -> _Running:
        self._thread.start()
        return self

    def visible(self) -> int:
        """Events a consumer can read (exactly-once: committed in a Kafka transaction)."""
        return self.stats.eos_committed_events if self.eos else self.stats.events_published

    def wait_first(self, timeout: float) -> int:
        """Until the relay has made its first events visible (acknowledged; exactly-once:
        committed); returns how many are visible then."""
        deadline = time.monotonic() + timeout
        while (visible := self.visible()) == 0:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.stats.mode}: nothing published")
            time.sleep(0.001)
        return visible

    def wait_published(self, events: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.visible() < events:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"{self.stats.mode}: {self.stats.events_published}/{events} published"
                )
            time.sleep(0.005)

    def stop(self) -> None:
        self.service.request_stop()
        self._thread.join(120)
        if self._errors:
            raise self._errors[0]


def throughput_phase(
    settings: Settings, spec: workload.WorkloadSpec, cpu: CpuMeter, timeout: float
) -> dict[str, Any]:
    """Backlog of ``spec.events``, then the relay until all are acknowledged."""
    dsn = settings.postgres_dsn()
    _fresh(settings)
    wal0 = current_wal(dsn)
    workload.write_orders(dsn, spec, table=TABLE, columns=settings.column_names())
    wal1, writes1 = current_wal(dsn), outbox_writes(dsn, TABLE)
    running = _Running(settings)
    cpu.start()
    t0 = time.perf_counter()
    # Timed from the first visible events: start-up (election, phase, slot, producer) and
    # exactly-once's first commit interval are latency, not throughput.
    first = running.start().wait_first(timeout)
    t1 = time.perf_counter()
    running.wait_published(spec.events, timeout)
    elapsed = time.perf_counter() - t1
    cores = cpu.cores_used(time.perf_counter() - t0)
    running.stop()
    wal2, writes2 = current_wal(dsn), outbox_writes(dsn, TABLE)
    return {
        "events": spec.events,
        "start_s": round(t1 - t0, 3),
        "seconds": round(elapsed, 3),
        "timed_events": spec.events - first,
        "events_per_s": round((spec.events - first) / elapsed, 1),
        "writers": costs_per_event(spec.events, writes1, wal1 - wal0),
        "relay": costs_per_event(spec.events, writes2 - writes1, wal2 - wal1),
        "cores_used": cores,
    }


def _write(dsn: str, spec: workload.WorkloadSpec, columns: ColumnNames) -> None:
    workload.write_orders(dsn, spec, table=TABLE, columns=columns)


def latency_phase(
    settings: Settings,
    rate: float,
    seconds: float,
    cpu: CpuMeter,
    warmup_s: float = 0.0,
    txn_sizes: tuple[int, ...] = (1, 5, 10),
) -> dict[str, Any]:
    """Relay running; writers offer ``rate`` events/s (transactions of ``txn_sizes``) for
    ``warmup_s`` (not measured), then for ``seconds``; latency percentiles of the latter."""
    dsn = settings.postgres_dsn()
    _fresh(settings)
    samples: list[tuple[float, int]] = []
    running = _Running(settings)
    running.stats.latency_observers.append(lambda s, n: samples.append((s, n)))
    running.start()
    columns = settings.column_names()
    warm = workload.WorkloadSpec(events=20, writers=1, txn_sizes=(1,))
    workload.write_orders(dsn, warm, table=TABLE, columns=columns)
    running.wait_published(warm.events, 120)
    written = warm.events
    if warmup_s > 0:
        warmup = _spec(rate, warmup_s, txn_sizes)
        _run_writers(dsn, warmup, columns, running)
        written += warmup.events
        running.wait_published(written, 300)
    # Every event written so far has its sample (exactly-once observes at the Kafka commit,
    # a moment after the acknowledgement wait_published counts): none may leak into the
    # measured ones.
    deadline = time.monotonic() + 30
    while sum(n for _, n in list(samples)) < written and time.monotonic() < deadline:
        time.sleep(0.01)
    samples.clear()
    spec = _spec(rate, seconds, txn_sizes)
    events = spec.events
    wal0, writes0 = current_wal(dsn), outbox_writes(dsn, TABLE, settle_s=0.2)
    cpu.start()
    t0 = time.perf_counter()
    _run_writers(dsn, spec, columns, running)
    offered_s = time.perf_counter() - t0
    running.wait_published(written + events, 300)
    elapsed = time.perf_counter() - t0
    cores = cpu.cores_used(elapsed)
    running.stop()
    wal1, writes1 = current_wal(dsn), outbox_writes(dsn, TABLE)
    ms = [(s * 1000.0, n) for s, n in samples]
    return {
        "events": events,
        "offered_events_per_s": round(events / offered_s, 1),
        "latency_ms": {
            "p50": round(percentile(ms, 0.50), 1),
            "p95": round(percentile(ms, 0.95), 1),
            "p99": round(percentile(ms, 0.99), 1),
            "max": round(max(v for v, _ in ms), 1),
        },
        "latency_events": sum(n for _, n in samples),
        "writers_and_relay": costs_per_event(events, writes1 - writes0, wal1 - wal0),
        "cores_used": cores,
    }


def _spec(rate: float, seconds: float, txn_sizes: tuple[int, ...]) -> workload.WorkloadSpec:
    return workload.WorkloadSpec(
        events=int(rate * seconds), writers=4, txn_sizes=txn_sizes, rate=rate
    )


def _run_writers(
    dsn: str, spec: workload.WorkloadSpec, columns: ColumnNames, running: _Running | None
) -> None:
    """Write ``spec`` from another process: in this one the writers would compete with the
    relay for the GIL and inflate its latency. Stops the relay (if any) if they fail."""
    writer = multiprocessing.get_context("spawn").Process(
        target=_write, args=(dsn, spec, columns), name="writers"
    )
    try:
        writer.start()
        writer.join()
        if writer.exitcode != 0:
            raise RuntimeError(f"writer process failed (exit code {writer.exitcode})")
    except BaseException:
        if running is not None:
            running.stop()
        raise


def eos_rounds(
    args: argparse.Namespace, dsn: str, bootstrap: str, cpu: CpuMeter, stamp: int
) -> list[dict[str, Any]]:
    """At-least-once and exactly-once throughput at ``EOS_TXN_SIZE``-row transactions,
    ``--eos-rounds`` times, the two modes back to back in each round (the first alternates), so
    that each round's ratio compares runs made under the same machine load."""
    rounds: list[dict[str, Any]] = []
    for number in range(args.eos_rounds):
        pair: dict[str, Any] = {}
        for mode in ("cdc", "cdc_eos") if number % 2 == 0 else ("cdc_eos", "cdc"):
            print(f"-- {mode}: {EOS_TXN_SIZE}-row transactions, round {number + 1}", flush=True)
            prefix = f"bench.{stamp}.{mode}.txn{EOS_TXN_SIZE}.{number}"
            settings = _settings(dsn, bootstrap, mode, prefix)
            _create_topic(settings, f"{prefix}.order")
            spec = workload.WorkloadSpec(
                events=args.eos_events, writers=args.writers, txn_sizes=(EOS_TXN_SIZE,)
            )
            phase = throughput_phase(settings, spec, cpu, timeout=600)
            phase["records_in_kafka"] = count_records(bootstrap, prefix) - 1
            pair[mode] = phase
        rounds.append(pair)
    return rounds


def _mark_cost(args: argparse.Namespace, dsn: str, bootstrap: str, cpu: CpuMeter) -> Any:
    """benchmarks.mark_cost's phases, on this benchmark's settings, table and topics."""
    settings_for = functools.partial(_settings, dsn, bootstrap)
    return mark_cost.measure(args, cpu, settings_for, _create_topic, _fresh, _Running)


def eos_round_medians(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Median events/s of each delivery over :func:`eos_rounds`' rounds."""
    return {m: statistics.median(r[m]["events_per_s"] for r in rounds) for m in ("cdc", "cdc_eos")}


#: A section added to ``run``'s result: ``(out, args, (dsn, bootstrap, cpu), stamp)``.
Extra = Callable[[dict[str, Any], argparse.Namespace, tuple[str, str, CpuMeter], int], None]


def run(args: argparse.Namespace, extras: tuple[Extra, ...] = ()) -> dict[str, Any]:
    with services(args.dsn, args.bootstrap_servers) as (dsn, bootstrap, cpu):
        if args.only == "mark-cost":
            return {"mark_cost": _mark_cost(args, dsn, bootstrap, cpu)}
        stamp = int(time.time())
        spec = workload.WorkloadSpec(events=args.events, writers=args.writers)
        out: dict[str, Any] = {}
        for mode in MODES:
            results: dict[str, Any] = {}
            for phase in ("throughput", "latency"):
                print(f"-- {mode}: {phase} phase", flush=True)
                prefix = f"bench.{stamp}.{mode}.{phase}"
                settings = _settings(dsn, bootstrap, mode, prefix)
                _create_topic(settings, f"{prefix}.order")
                if phase == "throughput":
                    results[phase] = throughput_phase(settings, spec, cpu, timeout=600)
                else:
                    results[phase] = latency_phase(
                        settings, args.rate, args.latency_seconds, cpu, args.latency_warmup_seconds
                    )
                results[phase]["records_in_kafka"] = count_records(bootstrap, prefix) - 1
            results["settings"] = {
                "batch_size": settings.polling.batch_size,
                "poll_interval_s": settings.polling.poll_interval_s,
                "cdc_mark_published": settings.cdc_mark_published,
            }
            out[mode] = results
        out["mark_cost"] = _mark_cost(args, dsn, bootstrap, cpu)
        out["eos_rounds"] = eos_rounds(args, dsn, bootstrap, cpu, stamp)
        for mode, median in eos_round_medians(out["eos_rounds"]).items():
            out[mode][f"throughput_txn{EOS_TXN_SIZE}"] = {"events_per_s": median}
        for extra in extras:
            extra(out, args, (dsn, bootstrap, cpu), stamp)
        alo, eos = out["cdc"], out["cdc_eos"]
        interval_ms = float(settings.eos.commit_interval_ms)
        ratios = [
            r["cdc_eos"]["events_per_s"] / r["cdc"]["events_per_s"] for r in out["eos_rounds"]
        ]
        out["eos"] = {
            "throughput_ratio": round(statistics.median(ratios), 3),
            "throughput_ratio_rounds": [round(r, 3) for r in ratios],
            "throughput_ratio_min": EOS_THROUGHPUT_RATIO,
            "p99_ms": eos["latency"]["latency_ms"]["p99"],
            "p99_max_ms": round(alo["latency"]["latency_ms"]["p99"] + interval_ms, 1),
            "commit_interval_ms": interval_ms,
        }
        out["eos"]["throughput_met"] = out["eos"]["throughput_ratio"] >= EOS_THROUGHPUT_RATIO
        out["eos"]["p99_met"] = out["eos"]["p99_ms"] <= out["eos"]["p99_max_ms"]
        cdc, polling = out["cdc"], out["polling"]
        out["ratios"] = {
            "throughput": round(
                cdc["throughput"]["events_per_s"] / polling["throughput"]["events_per_s"], 2
            ),
            "p99_latency": round(
                cdc["latency"]["latency_ms"]["p99"] / polling["latency"]["latency_ms"]["p99"], 3
            ),
        }
        out["targets"] = {
            "throughput_ratio_min": TARGET_THROUGHPUT_RATIO,
            "p99_ratio_max": TARGET_P99_RATIO,
            "throughput_met": out["ratios"]["throughput"] >= TARGET_THROUGHPUT_RATIO,
            "p99_met": out["ratios"]["p99_latency"] <= TARGET_P99_RATIO,
        }
        out["params"] = {
            "events": args.events,
            "writers": args.writers,
            "txn_sizes_throughput": list(spec.txn_sizes),
            "rate": args.rate,
            "latency_seconds": args.latency_seconds,
            "latency_warmup_seconds": args.latency_warmup_seconds,
            "eos_events": args.eos_events,
            "eos_txn_size": EOS_TXN_SIZE,
            "eos_rounds": args.eos_rounds,
        }
        out["machine"] = compare_report.machine(dsn)
        return out
