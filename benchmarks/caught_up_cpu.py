"""The relay's CPU per event while caught up: ``python -m benchmarks caught-up-cpu``.

The relay (``python -m cdc_outbox run``, its own process, default settings, at-least-once) runs
on a fresh outbox table whose slot is STREAMING; writers (another process) offer ``--rate``
transactions/s of ``--txn-size`` rows (default 2,000 x 1: the single-row phase of ``debezium``)
for ``--warmup-seconds`` unmeasured, then for ``--seconds``. Per round: the relay process's
CPU (utime + stime of all its threads, ``/proc``) over the measured part, divided by its
events, and split by thread: the main thread (the relay's loop), librdkafka's threads
(``rdk:*``) and the others (the published-marker, leadership, metrics); the commit -> visible
latency of those events (:mod:`benchmarks.outside_latency`). CPU per event does not depend
on what else runs on the machine as wall-clock figures do; judge by it. ``--profile PATH``
runs the first round's relay under cProfile (its main thread only; slower).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import compare_bench, output, outside_latency, relay_process
from benchmarks.cpu import _TICK
from benchmarks.relay_bench import LOG_DIR, services
from cdc_outbox_dev import workload

NAME = "caught-up-cpu"


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of ``pid``'s threads so far, summed by kind: ``main``, ``librdkafka``
    (threads named ``rdk:*``), ``other``; and ``kernel``, the system time of them all."""
    out = {"main": 0.0, "librdkafka": 0.0, "other": 0.0, "kernel": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except OSError:  # the thread ended
            continue
        main = task.name == str(pid)
        kind = "main" if main else "librdkafka" if comm.startswith("rdk:") else "other"
        out[kind] += (int(fields[11]) + int(fields[12])) / _TICK
        out["kernel"] += int(fields[12]) / _TICK
    return out


def phase(args: argparse.Namespace, dsn: str, bootstrap: str, number: int) -> dict[str, Any]:
    """One round: a fresh table and slot, the relay process, the offered load (see the module)."""
    prefix = f"bench.{int(time.time())}.caughtup.{number}"
    settings = compare_bench._settings(dsn, bootstrap, "cdc", prefix)
    compare_bench._create_topic(settings, f"{prefix}.order")
    compare_bench._fresh(settings)
    profile = args.profile if number == 0 else None
    log = LOG_DIR / f"{NAME}-{number}.log"
    running = relay_process.Running(settings, log, keep_ids=True, profile=profile)
    columns = settings.column_names()
    sizes = (args.txn_size,)
    rate = args.rate * args.txn_size  # events/s
    running.start()
    try:
        warm = workload.WorkloadSpec(events=20, writers=1, txn_sizes=(1,))
        workload.write_orders(dsn, warm, table=compare_bench.TABLE, columns=columns)
        running.wait_published(warm.events, 120)
        written = warm.events
        if args.warmup_seconds > 0:
            spec = compare_bench._spec(rate, args.warmup_seconds, sizes)
            compare_bench._run_writers(dsn, spec, columns, running)
            written += spec.events
            running.wait_published(written, 300)
        since = time.time()
        spec = compare_bench._spec(rate, args.seconds, sizes)
        pid = running.relay.pid
        cpu0, threads0 = running.relay.cpu_s(), threads_cpu(pid)
        t0 = time.perf_counter()
        compare_bench._run_writers(dsn, spec, columns, running)
        offered_s = time.perf_counter() - t0
        running.wait_published(written + spec.events, 300)
        cpu = running.relay.cpu_s() - cpu0
        threads = {k: v - threads0[k] for k, v in threads_cpu(pid).items()}
    finally:
        running.stop()
    seen = running.counter.seen or {}
    latency = outside_latency.quantiles(outside_latency.commit_times(dsn, list(seen)), seen, since)
    events = spec.events
    return {
        "events": events,
        "offered_txns_per_s": round(events / args.txn_size / offered_s, 1),
        "relay_cpu_s": round(cpu, 3),
        "us_per_event": round(cpu / events * 1e6, 2),
        "us_per_event_by_thread": {k: round(v / events * 1e6, 2) for k, v in threads.items()},
        "latency_ms": {k: v for k, v in latency.items() if k != "events"},
        "load_average": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str]) -> int:
    parser = output.parser(NAME, __doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=2000.0, help="transactions/s offered")
    parser.add_argument("--txn-size", type=int, default=1, help="rows per transaction")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured part of a round")
    parser.add_argument("--warmup-seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3, help="the median is reported")
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: start a local server)")
    parser.add_argument("--bootstrap-servers", help="Kafka (default: start a local broker)")
    parser.add_argument("--profile", type=Path, help="cProfile of the first round's relay")
    args = parser.parse_args(argv)
    if min(args.rate, args.txn_size, args.seconds, args.rounds) <= 0:
        parser.error("--rate, --txn-size, --seconds and --rounds must be positive")
    with services(args.dsn, args.bootstrap_servers) as (dsn, bootstrap, _cpu):
        rounds = []
        for number in range(args.rounds):
            print(f"-- round {number + 1}: {args.rate:g} txns/s x {args.txn_size}", flush=True)
            rounds.append(phase(args, dsn, bootstrap, number))
            r = rounds[-1]
            print(f"   {r['us_per_event']} us/event {r['us_per_event_by_thread']}", flush=True)
    result = {
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "us_per_event": statistics.median(r["us_per_event"] for r in rounds),
        "p99_ms": statistics.median(r["latency_ms"]["p99"] for r in rounds),
        "rounds": rounds,
    }
    for r in rounds:
        lat = r["latency_ms"]
        print(
            f"{r['us_per_event']:>7.1f} us/event  main {r['us_per_event_by_thread']['main']:.1f}"
            f"  rdk {r['us_per_event_by_thread']['librdkafka']:.1f}"
            f"  other {r['us_per_event_by_thread']['other']:.1f}"
            f"  (kernel {r['us_per_event_by_thread']['kernel']:.1f})"
            f"  offered {r['offered_txns_per_s']:,.0f} txns/s  p50 {lat['p50']} p99 {lat['p99']} ms"
        )
    print(f"median: {result['us_per_event']} us/event, p99 {result['p99_ms']} ms")
    output.save(NAME, result, args)
    return 0
