"""Report of ``python -m benchmarks compare``: machine description, table, Markdown report."""

from __future__ import annotations

import os
import platform
import statistics
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import latency_report, mark_cost
from cdc_outbox_dev.sandbox.kafka_jars import KAFKA_VERSION


def machine(dsn: str) -> dict[str, str]:
    """What the numbers were measured on."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kb = 0
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        sync = conn.execute("SHOW synchronous_commit").fetchone()
    return {
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "memory": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "postgresql": f"{row[0] if row else '?'} (synchronous_commit={sync[0] if sync else '?'})",
        "kafka": f"{KAFKA_VERSION} (single KRaft node, local)",
        "confluent_kafka": metadata.version("confluent-kafka"),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        # The 2-core machine is shared: its load (uptime's figures) at the end of the run.
        "load_average_1_5_15_min": " ".join(f"{v:.2f}" for v in os.getloadavg()),
    }


def print_eos_rounds(result: dict[str, Any]) -> None:
    """``compare --only eos-throughput``: each round's events/s and ratio, the medians."""
    ratios = []
    for n, r in enumerate(result["eos_rounds"]):
        alo, eos = r["cdc"], r["cdc_eos"]
        ratios.append(alo["events_per_s"] / eos["events_per_s"])
        print(
            f"round {n + 1}: at-least-once {alo['events_per_s']:,.0f} events/s"
            f" (load {alo.get('load_average', '?')}), exactly-once {eos['events_per_s']:,.0f}"
            f" (load {eos.get('load_average', '?')}), ALO/EOS {ratios[-1]:.2f}"
        )
    medians = result["eos_rounds_median_events_per_s"]
    print(
        f"medians: at-least-once {medians['cdc']:,.0f}, exactly-once {medians['cdc_eos']:,.0f}"
        f" events/s; ALO/EOS {statistics.median(ratios):.2f} (median of the rounds' ratios)"
    )


_COST_ROWS = (
    ("outbox row writes/event, relay", "throughput", "relay", "row_writes_per_event", ".2f"),
    ("outbox row writes/event, writers", "throughput", "writers", "row_writes_per_event", ".2f"),
    ("WAL bytes/event, relay", "throughput", "relay", "wal_bytes_per_event", ",.0f"),
    ("WAL bytes/event, writers", "throughput", "writers", "wal_bytes_per_event", ",.0f"),
    (
        "WAL bytes/event, writers + relay at the fixed rate",
        "latency",
        "writers_and_relay",
        "wal_bytes_per_event",
        ",.0f",
    ),
)


def _rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    cdc, pol = result["cdc"], result["polling"]
    c, p = cdc["throughput"]["events_per_s"], pol["throughput"]["events_per_s"]
    rows = [("throughput, backlog drain (events/s)", f"{c:,.0f}", f"{p:,.0f}", f"{c / p:.2f}x")]
    for q in ("p50", "p95", "p99"):
        c, p = cdc["latency"]["latency_ms"][q], pol["latency"]["latency_ms"][q]
        rows.append((f"commit->ack latency {q} (ms)", f"{c:,.1f}", f"{p:,.1f}", f"{c / p:.3f}x"))
    c, p = cdc["latency"]["offered_events_per_s"], pol["latency"]["offered_events_per_s"]
    rows.append(("latency phase: offered rate reached (events/s)", f"{c:,.0f}", f"{p:,.0f}", ""))
    for label, phase, part, key, fmt in _COST_ROWS:
        c, p = cdc[phase][part][key], pol[phase][part][key]
        rows.append((label, format(c, fmt), format(p, fmt), ""))
    for phase in ("throughput", "latency"):
        label = f"cores used, {phase} phase (relay / postgres / kafka)"
        c, p = (" / ".join(f"{v:.2f}" for v in m[phase]["cores_used"].values()) for m in (cdc, pol))
        rows.append((label, c, p, ""))
    return rows


def _eos_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    alo, eos = result["cdc"], result["cdc_eos"]
    rows = []
    for key, label in (
        ("throughput_txn100", "throughput, 100-row transactions (events/s)"),
        ("throughput", "throughput, mixed transactions (events/s)"),
    ):
        a, e = alo[key]["events_per_s"], eos[key]["events_per_s"]
        rows.append((label, f"{a:,.0f}", f"{e:,.0f}", f"{e / a:.2f}x"))
    for q in ("p50", "p95", "p99"):
        a, e = alo["latency"]["latency_ms"][q], eos["latency"]["latency_ms"][q]
        rows.append(
            (f"commit->visible latency {q} (ms)", f"{a:,.1f}", f"{e:,.1f}", f"{e - a:+,.1f}")
        )
    for phase in ("throughput", "latency"):
        label = f"cores used, {phase} phase (relay / postgres / kafka)"
        a, e = (" / ".join(f"{v:.2f}" for v in m[phase]["cores_used"].values()) for m in (alo, eos))
        rows.append((label, a, e, ""))
    return rows


def _print_rows(rows: list[tuple[str, str, str, str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))


def print_table(result: dict[str, Any]) -> None:
    _print_rows([("metric", "CDC", "polling", "CDC/polling"), *_rows(result)])
    t = result["targets"]
    print(
        f"targets: throughput >= {t['throughput_ratio_min']}x: {t['throughput_met']};"
        f" p99 <= {t['p99_ratio_max']}x: {t['p99_met']}"
    )
    _print_rows([("metric", "at-least-once", "exactly-once", "EOS vs ALO"), *_eos_rows(result)])
    e = result["eos"]
    print(
        f"exactly-once targets: throughput >= {e['throughput_ratio_min']}x: {e['throughput_met']};"
        f" p99 <= {e['p99_max_ms']} ms: {e['p99_met']}"
    )
    if "mark_cost" in result:
        mark_cost.print_table(result["mark_cost"])
    if "eos_latency" in result:
        latency_report.print_section(result["eos_latency"])


#: A report file from this line on holds other sections (written by hand, or the consumer's):
#: kept.
KEEP_MARKER = "<!-- sections below are kept when `compare` regenerates this file -->"


def write_results(result: dict[str, Any], path: Path, command: str) -> None:
    """The Markdown report at ``path`` (``compare --results PATH``): machine, command, the
    table, targets and method (anything from :data:`KEEP_MARKER` on in the file is kept)."""
    m, p, t = result["machine"], result["params"], result["targets"]
    e = result["eos"]
    lines = [
        "# CDC vs polling: benchmark results",
        "",
        "Generated by `benchmarks/compare_bench.py`; re-run to replace this file:",
        "",
        f"    {command}",
        "",
        "## Machine",
        "",
        *(f"- {k}: {v}" for k, v in m.items()),
        "",
        "## Results",
        "",
        "| metric | CDC | polling | CDC/polling |",
        "|---|---:|---:|---:|",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in _rows(result)),
        "",
        f"- Throughput target (CDC >= {t['throughput_ratio_min']}x polling):"
        f" {'met' if t['throughput_met'] else 'NOT met'}"
        f" ({result['ratios']['throughput']:.2f}x).",
        f"- p99 latency target (CDC <= {t['p99_ratio_max']}x polling):"
        f" {'met' if t['p99_met'] else 'NOT met'} ({result['ratios']['p99_latency']:.3f}x).",
        "",
        "## Exactly-once vs at-least-once (CDC)",
        "",
        'The same CDC relay with `delivery = "exactly_once"` (Kafka transactions, default'
        f" commit interval {result['eos']['commit_interval_ms']:.0f} ms), in the same run."
        " Latency runs from the writer's PostgreSQL commit to the record received by a"
        " read_committed consumer of the topic (exactly-once: after the Kafka commit).",
        "",
        "| metric | at-least-once | exactly-once | EOS vs ALO |",
        "|---|---:|---:|---:|",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in _eos_rows(result)),
        "",
        f"- Throughput target (exactly-once >= {e['throughput_ratio_min']}x at-least-once at"
        f" 100-row transactions): {'met' if e['throughput_met'] else 'NOT met'}"
        f" ({e['throughput_ratio']:.2f}x, the median of {len(e['throughput_ratio_rounds'])}"
        " rounds: "
        + ", ".join(
            f"{r['cdc_eos']['events_per_s']:,.0f} vs {r['cdc']['events_per_s']:,.0f} = {ratio:.2f}x"
            for r, ratio in zip(result["eos_rounds"], e["throughput_ratio_rounds"], strict=True)
        )
        + ").",
        f"- p99 target (<= at-least-once p99 + commit interval = {e['p99_max_ms']} ms):"
        f" {'met' if e['p99_met'] else 'NOT met'} ({e['p99_ms']} ms).",
        "",
        *(mark_cost.markdown(result["mark_cost"]) if "mark_cost" in result else []),
        *(latency_report.markdown(result["eos_latency"]) if "eos_latency" in result else []),
        "## Method",
        "",
        f"- Same broker and server, default settings for both modes (polling: batch_size"
        f" {result['polling']['settings']['batch_size']}, poll_interval_s"
        f" {result['polling']['settings']['poll_interval_s']}; CDC housekeeping"
        f" cdc_mark_published = {result['cdc']['settings']['cdc_mark_published']}).",
        f"- Throughput: {p['events']:,} events from {p['writers']} writers (transactions of"
        f" {', '.join(map(str, p['txn_sizes_throughput']))} events, 200 aggregates) written"
        " first, then the relay (`python -m cdc_outbox run`, its own process; CDC streams:"
        " the slot's phase is STREAMING as `cdc-outbox init` leaves it) runs until a"
        " read_committed consumer of its topic has seen all of them: events/s of the events"
        " after the first ones it saw, timed from then (start-up, i.e. process start, leader"
        " election, slot and producer set-up, and exactly-once's first commit interval are"
        " reported separately as start_s in the JSON).",
        f"- Latency: {p['rate']:,.0f} events/s offered (4 writers, transactions of 1, 5, 10"
        f" events) with the relay running, {p.get('latency_warmup_seconds', 0):.0f} s unmeasured"
        " (a fresh broker's JIT compiles the mode's code paths meanwhile), then"
        f" {p['latency_seconds']:.0f} s measured; per event, from the writer's commit (the"
        " commit timestamp of its business row, track_commit_timestamp = on) to the record"
        " received by a read_committed consumer of the topic, the same for both modes"
        " (benchmarks/outside_latency.py).",
        f"- Exactly-once vs at-least-once throughput: {p['eos_events']:,} events in"
        f" {p['eos_txn_size']}-row transactions per run, {p['eos_rounds']} rounds of one run per"
        " mode back to back (the first mode alternates); the table shows the median events/s"
        " per mode, the target the median of the rounds' ratios.",
        "- Row writes: n_tup_ins + n_tup_upd + n_tup_del of the outbox table per event (the"
        " writers' insert is 1; CDC's housekeeping UPDATE and polling's claim and publish"
        " UPDATEs count for the relay). WAL: pg_current_wal_lsn delta per event, whole server"
        " (the business row insert is in the writers' part for both modes).",
        "- Everything shares one machine: tail latencies move with CPU contention from other"
        " processes; compare runs made on a quiet machine.",
        "",
    ]
    old = path.read_text() if path.exists() else ""
    lines.append(old[old.index(KEEP_MARKER) :] if KEEP_MARKER in old else KEEP_MARKER + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
