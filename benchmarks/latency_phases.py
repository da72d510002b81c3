"""Latency at moderate load, at-least-once vs exactly-once (issue 25): a part of
``python -m benchmarks compare``, alone with ``--only eos-latency``.

Each round runs :func:`benchmarks.compare_bench.latency_phase` once per delivery (the first
alternates by round) at ``TXNS_PER_S`` PostgreSQL transactions/s of ``TXN_ROWS`` outbox rows,
on a fresh table, slot and topic each, then :func:`benchmarks.latency_floor.floor_phase`
at the same load (no relay: what PostgreSQL alone takes to deliver a commit), and an end-to-end
phase (at-least-once with ``cdc-outbox consume`` running: commit -> applied). The targets are
:func:`benchmarks.latency_report.targets`.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks import (
    compare_bench,
    compare_report,
    latency_floor,
    latency_report,
    outside_latency,
)
from benchmarks.cpu import CpuMeter
from benchmarks.latency_report import TXN_ROWS, TXNS_PER_S
from benchmarks.relay_bench import services
from cdc_outbox_dev.readback import count_records


def eos_latency(
    args: argparse.Namespace, dsn: str, bootstrap: str, cpu: CpuMeter, stamp: int
) -> dict[str, Any]:
    """``--latency-rounds`` rounds of an at-least-once and an exactly-once latency phase and
    a floor phase."""
    rounds: list[dict[str, Any]] = []
    for number in range(args.latency_rounds):
        pair: dict[str, Any] = {}
        for mode in ("cdc", "cdc_eos") if number % 2 == 0 else ("cdc_eos", "cdc"):
            print(
                f"-- {mode}: {TXNS_PER_S} txns/s x {TXN_ROWS} rows, round {number + 1}", flush=True
            )
            prefix = f"bench.{stamp}.{mode}.lat{TXN_ROWS}.{number}"
            settings = compare_bench._settings(dsn, bootstrap, mode, prefix)
            compare_bench._create_topic(settings, f"{prefix}.order")
            phase = compare_bench.latency_phase(
                settings,
                TXNS_PER_S * TXN_ROWS,
                args.latency_seconds,
                cpu,
                args.latency_warmup_seconds,
                txn_sizes=(TXN_ROWS,),
            )
            phase["records_in_kafka"] = count_records(bootstrap, prefix) - 1
            pair[mode] = phase
        print(f"-- end to end (cdc + consume): {TXNS_PER_S} txns/s x {TXN_ROWS} rows", flush=True)
        prefix = f"bench.{stamp}.e2e.lat{TXN_ROWS}.{number}"
        settings = compare_bench._settings(dsn, bootstrap, "cdc", prefix)
        outside_latency.create_empty_topic(bootstrap, f"{prefix}.order")
        pair["e2e"] = compare_bench.latency_phase(
            settings,
            TXNS_PER_S * TXN_ROWS,
            args.latency_seconds,
            cpu,
            args.latency_warmup_seconds,
            txn_sizes=(TXN_ROWS,),
            e2e=f"bench-e2e-{stamp}-{number}",
        )
        print(f"-- floor (no relay): {TXNS_PER_S} txns/s x {TXN_ROWS} rows", flush=True)
        floor_settings = compare_bench._settings(
            dsn, bootstrap, "cdc", f"bench.{stamp}.floor.{number}"
        )
        pair["floor"] = latency_floor.floor_phase(
            floor_settings,
            TXNS_PER_S * TXN_ROWS,
            args.latency_seconds,
            args.latency_warmup_seconds,
        )
        rounds.append(pair)
    return {
        "rounds": rounds,
        "targets": latency_report.targets(rounds),
        "params": {
            "txns_per_s": TXNS_PER_S,
            "txn_rows": TXN_ROWS,
            "writers": 4,
            "warmup_s": args.latency_warmup_seconds,
            "seconds": args.latency_seconds,
            "rounds": args.latency_rounds,
        },
    }


def add_to(
    out: dict[str, Any], args: argparse.Namespace, services_: tuple[str, str, CpuMeter], stamp: int
) -> None:
    """``compare``'s hook: the section under ``out["eos_latency"]``."""
    dsn, bootstrap, cpu = services_
    out["eos_latency"] = eos_latency(args, dsn, bootstrap, cpu, stamp)


def run_only(args: argparse.Namespace) -> dict[str, Any]:
    """``compare --only eos-latency`` (this section) or ``--only eos`` (it and the throughput
    rounds of exactly-once vs at-least-once)."""
    with services(args.dsn, args.bootstrap_servers) as (dsn, bootstrap, cpu):
        stamp = int(time.time())
        out: dict[str, Any] = {"eos_latency": eos_latency(args, dsn, bootstrap, cpu, stamp)}
        if args.only == "eos":
            out["eos_rounds"] = compare_bench.eos_rounds(args, dsn, bootstrap, cpu, stamp)
            out["eos_rounds_median_events_per_s"] = compare_bench.eos_round_medians(
                out["eos_rounds"]
            )
        out["machine"] = compare_report.machine(dsn)
        return out
