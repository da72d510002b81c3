"""The figures of ``python -m benchmarks debezium`` and its table.

The measuring is :mod:`benchmarks.debezium_bench`; what is run, :mod:`benchmarks.debezium_setup`.
This module turns commit and append times into the drains' figures (:func:`cold_result`,
:func:`warm_result`) and latencies (:func:`latencies`), the run into ratios against the
targets (:func:`summarize`) and prints them (:func:`table`). Pure apart from
:func:`machine`.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.costs import percentile

DESCRIPTION = (
    "cdc-outbox vs Debezium (Kafka Connect + outbox EventRouter, defaults and tuned): cold and"
    " warm drain, commit->ack latency, CPU and peak RSS, same server, broker and table"
)
#: cdc-outbox vs Debezium tuned: warm drain >= 2x, p99 at 20x100 <= 0.5x, CPU <= 1/4.
TARGETS = {"warm_throughput_min": 2.0, "p99_20x100_max": 0.5, "cpu_max": 0.25}


def latencies(commits: dict[str, float], appends: list[tuple[str, int]]) -> dict[str, Any]:
    """Per event, append ms - commit ms (first record of each id; ids without a commit time
    are counted in ``unmatched``): p50, p99, max and how many events."""
    seen: set[str] = set()
    samples: list[tuple[float, int]] = []
    unmatched = 0
    for ident, ms in appends:
        if ident in seen:
            continue
        seen.add(ident)
        if ident not in commits:
            unmatched += 1
            continue
        samples.append((ms - commits[ident], 1))
    if not samples:
        raise ValueError("no record matched a committed event")
    return {
        "events": len(commits),
        "records": len(appends),
        "unmatched": unmatched,
        "latency_ms": latency_ms(samples),
    }


def latency_ms(samples: list[tuple[float, int]]) -> dict[str, float]:
    """p50, p99 and max of (ms, weight) samples, to 0.1 ms: every latency of the run (the
    systems' and the floor's) is summed up by this one rule."""
    return {
        "p50": round(percentile(samples, 0.50), 1),
        "p99": round(percentile(samples, 0.99), 1),
        "max": round(max(v for v, _ in samples), 1),
    }


def cold_result(
    started_s: float, events: int, appends_ms: list[int], cpu_s: float
) -> dict[str, Any]:
    """The cold drain's figures: ``events_per_s`` over the whole drain, from the process start
    (``started_s``, epoch seconds) to the last append; ``after_first_events_per_s`` from the
    first append on (a system that queues much before its first request reaches the broker
    looks faster by it: read it with ``start_s``)."""
    first, last = min(appends_ms) / 1000, max(appends_ms) / 1000
    return {
        "events": events,
        "records": len(appends_ms),
        "start_s": round(first - started_s, 3),
        "drain_s": round(last - first, 3),
        "total_s": round(last - started_s, 3),
        "events_per_s": round(events / max(last - started_s, 1e-3), 1),
        "after_first_events_per_s": round((events - 1) / max(last - first, 1e-3), 1),
        "cpu_s": round(cpu_s, 2),
    }


def warm_result(
    commits: dict[str, float], appends: list[tuple[str, int]], cpu_s: float, resumed_ms: float
) -> dict[str, Any]:
    """The warm drain's figures from commit and append times and the moment the reader was
    resumed (ms since the epoch): ``events_per_s`` from the resume to the last append."""
    first_commit, last_commit = min(commits.values()), max(commits.values())
    last_append = max(ms for _, ms in appends)
    seconds = (last_append - resumed_ms) / 1000
    return {
        "events": len(commits),
        "records": len(appends),
        "commit_span_s": round((last_commit - first_commit) / 1000, 3),
        "drain_s": round(seconds, 3),
        "events_per_s": round(len(commits) / max(seconds, 1e-3), 1),
        "cpu_s": round(cpu_s, 2),
    }


def median_tree(items: list[Any]) -> Any:
    """The median of each number of ``items`` (dicts of one shape), position by position;
    anything else (text, lists, booleans) is taken from the first."""
    first = items[0]
    if isinstance(first, dict):
        return {k: median_tree([item[k] for item in items]) for k in first}
    if isinstance(first, bool) or not isinstance(first, int | float):
        return first
    return statistics.median(items)


def _ratios(
    cold: dict[str, Any], running: dict[str, Any], floor: dict[str, Any] | None = None
) -> dict[str, Any]:
    """cdc-outbox / Debezium tuned in one round. CPU: the warm drain's and both latency
    phases' CPU seconds, added up (and each phase's alone). With the round's ``floor``
    (:mod:`benchmarks.debezium_floor`): its p99 at 20 x 100 and each system's p99 minus it,
    ms (``over_floor``)."""
    ours, tuned = running["cdc_outbox"], running["debezium_tuned"]
    phases = ("warm", "latency_20x100", "latency_2000x1")

    def cpu(side: dict[str, Any]) -> float:
        return float(sum(side[p]["cpu_s"] for p in phases))

    p99 = "latency_20x100", "latency_ms", "p99"
    extra: dict[str, Any] = {}
    if floor is not None:
        base = floor["latency_ms"]["p99"]
        extra["floor_p99_20x100"] = base
        extra["over_floor_p99_20x100"] = {
            name: round(side[p99[0]][p99[1]][p99[2]] - base, 1)
            for name, side in (("cdc_outbox", ours), ("debezium_tuned", tuned))
        }
    return extra | {
        "warm_throughput": round(ours["warm"]["events_per_s"] / tuned["warm"]["events_per_s"], 2),
        "cold_throughput": round(
            cold["cdc_outbox"]["events_per_s"] / cold["debezium_tuned"]["events_per_s"], 2
        ),
        "p99_20x100": round(ours[p99[0]][p99[1]][p99[2]] / tuned[p99[0]][p99[1]][p99[2]], 3),
        "cpu": round(cpu(ours) / cpu(tuned), 3),
        "cpu_by_phase": {
            p: round(ours[p]["cpu_s"] / tuned[p]["cpu_s"], 3) if tuned[p]["cpu_s"] else None
            for p in phases
        },
    }


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Ratios of cdc-outbox to Debezium tuned, each the median of the rounds' ratios (a
    round's systems run back to back, under about the same load), and whether the targets
    are met."""
    rounds = result.get("rounds", [result["running"]])
    floors = result.get("floors") or [None] * len(rounds)
    per_round = [_ratios(result["cold"], r, f) for r, f in zip(rounds, floors, strict=True)]
    out: dict[str, Any] = median_tree(per_round)
    out["rounds"] = per_round
    out["targets"] = TARGETS
    out["met"] = {
        "warm_throughput": out["warm_throughput"] >= TARGETS["warm_throughput_min"],
        "p99_20x100": out["p99_20x100"] <= TARGETS["p99_20x100_max"],
        "cpu": out["cpu"] <= TARGETS["cpu_max"],
    }
    return out


def rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    """The table: one row per figure, one column per system."""
    systems = list(result["running"])
    cold, run = result["cold"], result["running"]
    out: list[tuple[str, ...]] = [("figure", *systems)]
    out.append(("cold drain, events/s", *(f"{cold[s]['events_per_s']:,.0f}" for s in systems)))
    out.append(("cold: start to first record, s", *(f"{cold[s]['start_s']:.1f}" for s in systems)))
    out.append(
        (
            "cold: after the first record, events/s",
            *(f"{cold[s]['after_first_events_per_s']:,.0f}" for s in systems),
        )
    )
    out.append(("cold: CPU s (start + drain)", *(f"{cold[s]['cpu_s']:.1f}" for s in systems)))
    out.append(("cold: peak RSS, MiB", *(f"{cold[s]['peak_rss_mb']:,.0f}" for s in systems)))
    out.append(
        ("warm drain, events/s", *(f"{run[s]['warm']['events_per_s']:,.0f}" for s in systems))
    )
    out.append(("warm: CPU s", *(f"{run[s]['warm']['cpu_s']:.1f}" for s in systems)))
    for phase in ("latency_20x100", "latency_2000x1"):
        for q in ("p50", "p99"):
            out.append(
                (
                    f"{phase.removeprefix('latency_')} commit->ack {q}, ms",
                    *(f"{run[s][phase]['latency_ms'][q]:,.1f}" for s in systems),
                )
            )
        out.append(
            (
                f"{phase.removeprefix('latency_')} offered txns/s; cores used",
                *(
                    f"{run[s][phase]['offered_txns_per_s']:,.0f}; {run[s][phase]['cores_used']:.2f}"
                    for s in systems
                ),
            )
        )
    out.append(("running: peak RSS, MiB", *(f"{run[s]['peak_rss_mb']:,.0f}" for s in systems)))
    return out


def table(result: dict[str, Any]) -> str:
    """The printed table and the targets line."""
    body = rows(result)
    widths = [max(len(r[i]) for r in body) for i in range(len(body[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    s = result["summary"]
    lines.append(
        f"cdc-outbox / Debezium tuned: warm drain {s['warm_throughput']:.2f}x (target >= 2x:"
        f" {_met(s, 'warm_throughput')}), p99 at 20x100 {s['p99_20x100']:.3f}x (<= 0.5x:"
        f" {_met(s, 'p99_20x100')}), CPU {s['cpu']:.3f}x (<= 0.25x: {_met(s, 'cpu')});"
        f" cold drain {s['cold_throughput']:.2f}x; medians of {len(s['rounds'])} round(s)"
    )
    if "floor_p99_20x100" in s:
        over = s["over_floor_p99_20x100"]
        lines.append(
            f"floor (PostgreSQL alone) p99 at 20x100 {s['floor_p99_20x100']:.1f} ms; p99 minus"
            f" the floor: cdc-outbox {over['cdc_outbox']:.1f} ms, Debezium tuned"
            f" {over['debezium_tuned']:.1f} ms"
        )
    return "\n".join(lines)


def _met(summary: dict[str, Any], key: str) -> str:
    return "met" if summary["met"][key] else "NOT met"


def machine(dsn: str) -> dict[str, Any]:
    """Cores, memory, load, versions: the run's machine description."""
    import psycopg

    from cdc_outbox_dev.sandbox.kafka_connect import DEBEZIUM_VERSION, connect_java
    from cdc_outbox_dev.sandbox.kafka_jars import KAFKA_VERSION

    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    java = subprocess.run([connect_java(), "-version"], capture_output=True, text=True, check=False)
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "load_at_start": [round(x, 2) for x in os.getloadavg()],
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "java": (java.stderr.splitlines() or ["?"])[0],
        "postgresql": row[0] if row else "?",
        "kafka": f"{KAFKA_VERSION} (one KRaft node), Kafka Connect {KAFKA_VERSION} standalone",
        "debezium": DEBEZIUM_VERSION,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


ROW_START = "| `debezium` |"
X = "\N{MULTIPLICATION SIGN}"


def results_row(result: dict[str, Any], commit: str) -> str:
    """This benchmark's row of benchmarks/RESULTS.md for ``result``, measured at ``commit``."""
    s, run, m = result["summary"], result["running"], result["machine"]
    ours, tuned = run["cdc_outbox"], run["debezium_tuned"]
    rounds = len(s["rounds"])
    events = result.get("params", {}).get("events", ours["warm"]["events"])
    figure = (
        f"warm drain **{s['warm_throughput']:.2f}{X}** ({ours['warm']['events_per_s']:,.0f} vs"
        f" {tuned['warm']['events_per_s']:,.0f} events/s), p99 at 20 {X} 100"
        f" **{s['p99_20x100']:.3f}{X}** ({ours['latency_20x100']['latency_ms']['p99']:,.1f} vs"
        f" {tuned['latency_20x100']['latency_ms']['p99']:,.1f} ms), CPU **{s['cpu']:.3f}{X}**"
        f"; {_verdict(s['met'])};{_floor_text(s)} cold drain"
        f" {s['cold_throughput']:.2f}{X}; medians of {rounds} round(s), load average"
        f" {m['load_at_start'][0]:.1f} at start"
    )
    command = "python -m benchmarks debezium" + (f" --rounds {rounds}" if rounds > 1 else "")
    return (
        f"{ROW_START} cdc-outbox vs Debezium 3.6 (Kafka Connect standalone + outbox"
        " EventRouter, defaults and tuned), same server, broker, table and writes: cold and"
        f" warm {events:,}-event drains, commit→ack p50/p99 at 20 {X} 100 and 2,000 {X} 1"
        f" transactions/s, CPU and peak RSS | `{command}` | vs Debezium tuned: warm drain"
        f" ≥ 2{X}, p99 at"
        f" 20 {X} 100 ≤ 0.5{X}, CPU ≤ 0.25{X} | {figure} | {m['date']} | {commit} |"
    )


def _floor_text(summary: dict[str, Any]) -> str:
    """`` floor …;`` (PostgreSQL alone at 20 x 100 and each system's p99 over it) or ``""``."""
    if "floor_p99_20x100" not in summary:
        return ""
    over = summary["over_floor_p99_20x100"]
    return (
        f" floor (PostgreSQL alone, commit→Commit received) p99 at 20 {X} 100"
        f" {summary['floor_p99_20x100']:,.1f} ms, p99 over it {over['cdc_outbox']:,.1f} vs"
        f" {over['debezium_tuned']:,.1f} ms;"
    )


_LABELS = {"warm_throughput": "warm drain", "p99_20x100": "p99", "cpu": "CPU"}


def _verdict(met: dict[str, bool]) -> str:
    """``met: …, NOT met: …`` over the targets."""
    parts = [
        f"{word}: {', '.join(_LABELS[k] for k, v in met.items() if v is want)}"
        for word, want in (("met", True), ("NOT met", False))
        if want in met.values()
    ]
    return "; ".join(parts)


def write_results_row(path: Path, row: str) -> None:
    """Replace this benchmark's row of the RESULTS.md at ``path`` (it must have one)."""
    lines = path.read_text().split("\n")
    at = [i for i, line in enumerate(lines) if line.startswith(ROW_START)]
    if len(at) != 1:
        raise ValueError(f"{path}: expected one row starting {ROW_START}, found {len(at)}")
    lines[at[0]] = row
    path.write_text("\n".join(lines))
