"""CDC vs polling in one run, same broker, same workload: ``python -m benchmarks compare``.

Each mode runs ``cdc-outbox run``'s :class:`~cdc_outbox.service.relay_service.Service`
with default settings
(``mode`` = cdc or polling; polling at its default ``poll_interval_s`` and ``batch_size``), on a
fresh outbox table filled by the same workload:

1. throughput: ``--events`` events are written first (a backlog), then the relay runs, as
   its own process (``python -m cdc_outbox run``, :mod:`benchmarks.relay_process`), until a
   consumer of its topic (read_committed) has seen all of them; events/s counts from the
   first records that consumer saw, the ones after them (start-up and exactly-once's first
   commit interval are reported apart, as ``start_s``). CDC streams the backlog: its slot's
   phase is STREAMING, as ``cdc-outbox init`` leaves it.
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
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg

from benchmarks import compare_report, mark_cost, outside_latency, relay_process
from benchmarks.costs import costs_per_event, outbox_writes
from benchmarks.cpu import CpuMeter
from benchmarks.relay_bench import LOG_DIR, current_wal, drop_slot, services, setup
from cdc_outbox.config.settings import Settings
from cdc_outbox.kafka.delivery_failure import Headers
from cdc_outbox.kafka.publisher import KafkaPublisher
from cdc_outbox.mapping.rows import ColumnNames
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
    """Fresh table (new statistics) and publication; for CDC a slot whose phase is STREAMING,
    as ``cdc-outbox init`` leaves it: the backlog is streamed, not caught up from the table
    (before issue 38 the phase was missing, so every CDC phase began with a snapshot
    catch-up of whatever was written)."""
    cdc = [SLOT] if settings.mode == "cdc" else []
    setup(settings, cdc, relay_slots=cdc)
    if settings.mode != "cdc":  # drop a CDC slot left by an earlier phase: it retains WAL
        with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
            drop_slot(conn, SLOT)


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


def _Running(settings: Settings, keep_ids: bool = False) -> relay_process.Running:
    """The relay as its own process, with a consumer of its topic (not started)."""
    log = LOG_DIR / f"compare-{settings.topic_template.split('{')[0]}log"
    return relay_process.Running(settings, log, keep_ids=keep_ids)


def throughput_phase(
    settings: Settings, spec: workload.WorkloadSpec, cpu: CpuMeter, timeout: float
) -> dict[str, Any]:
    """Backlog of ``spec.events``, then the relay (``python -m cdc_outbox run``, its own
    process) until a consumer of its topic has seen all of them."""
    dsn = settings.postgres_dsn()
    _fresh(settings)
    wal0 = current_wal(dsn)
    workload.write_orders(dsn, spec, table=TABLE, columns=settings.column_names())
    wal1, writes1 = current_wal(dsn), outbox_writes(dsn, TABLE)
    # Timed from the first visible events: start-up (process, election, phase, slot,
    # producer) and exactly-once's first commit interval are latency, not throughput.
    log = LOG_DIR / f"compare-{settings.topic_template.split('{')[0]}log"
    drained = relay_process.drain(settings, spec.events, cpu, log, timeout=timeout)
    wal2, writes2 = current_wal(dsn), outbox_writes(dsn, TABLE)
    return {
        "events": spec.events,
        "start_s": round(drained.start_s, 3),
        "seconds": round(drained.seconds, 3),
        "timed_events": drained.timed_events,
        "events_per_s": round(drained.events_per_s, 1),
        "writers": costs_per_event(spec.events, writes1, wal1 - wal0),
        "relay": costs_per_event(spec.events, writes2 - writes1, wal2 - wal1),
        "cores_used": drained.cores,
        "load_average": round(os.getloadavg()[0], 2),
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
    e2e: str | None = None,
) -> dict[str, Any]:
    """Relay running (its own process); writers offer ``rate`` events/s (transactions of
    ``txn_sizes``) for ``warmup_s`` (not measured), then for ``seconds``; percentiles of the
    latter's commit -> visible latency (:mod:`benchmarks.outside_latency`). With ``e2e`` (a
    consumer name) ``cdc-outbox consume`` runs too, and ``e2e_latency_ms`` is commit ->
    applied by it."""
    dsn = settings.postgres_dsn()
    _fresh(settings)
    topics = relay_process.phase_topics(settings)
    running = _Running(settings, keep_ids=True)
    meter = running.meter(cpu)
    consumer = None
    if e2e:
        consumer = outside_latency.consumer(settings, topics, e2e, LOG_DIR / f"{e2e}.log")
        consumer.start()
    running.start()
    try:
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
        since = time.time()  # events committed from now on are measured
        spec = _spec(rate, seconds, txn_sizes)
        events = spec.events
        wal0, writes0 = current_wal(dsn), outbox_writes(dsn, TABLE, settle_s=0.2)
        meter.start()
        t0 = time.perf_counter()
        _run_writers(dsn, spec, columns, running)
        offered_s = time.perf_counter() - t0
        running.wait_published(written + events, 300)
        elapsed = time.perf_counter() - t0
        cores = meter.cores_used(elapsed)
        applied: dict[str, float] = {}
        if consumer is not None and e2e:
            deadline = time.monotonic() + 300
            while outside_latency.applied_count(dsn, e2e) < written + events:
                if time.monotonic() > deadline or not consumer.alive():
                    raise RuntimeError(f"{e2e}: not every event applied")
                time.sleep(0.05)
            applied = outside_latency.applied_times(dsn, e2e)
    finally:
        running.stop()
        if consumer is not None:
            consumer.stop()
    wal1, writes1 = current_wal(dsn), outbox_writes(dsn, TABLE)
    seen = running.counter.seen or {}
    committed = outside_latency.commit_times(dsn, list(seen))
    latency = outside_latency.quantiles(committed, seen, since)
    out = {
        "events": events,
        "offered_events_per_s": round(events / offered_s, 1),
        "latency_ms": {k: v for k, v in latency.items() if k != "events"},
        "latency_events": latency["events"],
        "writers_and_relay": costs_per_event(events, writes1 - writes0, wal1 - wal0),
        "cores_used": cores,
        "load_average": round(os.getloadavg()[0], 2),
    }
    if applied:
        out["e2e_latency_ms"] = outside_latency.quantiles(committed, applied, since)
    return out


def _spec(rate: float, seconds: float, txn_sizes: tuple[int, ...]) -> workload.WorkloadSpec:
    return workload.WorkloadSpec(
        events=int(rate * seconds), writers=4, txn_sizes=txn_sizes, rate=rate
    )


def _run_writers(
    dsn: str,
    spec: workload.WorkloadSpec,
    columns: ColumnNames,
    running: relay_process.Running | None,
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
        if args.only == "eos-throughput":
            rounds = eos_rounds(args, dsn, bootstrap, cpu, stamp)
            return {
                "eos_rounds": rounds,
                "eos_rounds_median_events_per_s": eos_round_medians(rounds),
                "machine": compare_report.machine(dsn),
            }
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
