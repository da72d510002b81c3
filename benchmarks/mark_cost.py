"""The price of marking rows (issue 25): PostgreSQL CPU and WAL per event of CDC's
``cdc_mark_published`` modes (``update``, ``delete``, ``off``; at-least-once) and of the
table-less outbox (issue 38: events as logical messages, ``message_prefix``, nothing to mark),
beside polling, in the same run: part of ``python -m benchmarks compare``, or alone with
``--only mark-cost``.

Each mode relays the same workload from a fresh table: ``--mark-events`` events are written
first (a backlog; autovacuum is off for the table, which gets a ``VACUUM ANALYZE`` then), then
the relay (``python -m cdc_outbox run``, its own process) runs until every event is visible
to a consumer of its topic **and** its
row is done with (``update``/``delete``/polling: no row left ``PENDING``/``PROCESSING``,
checked by the partial index every 0.1 s once Kafka acknowledged everything; ``off``: nothing
to wait for). Over that window:

* PostgreSQL CPU: :func:`benchmarks.cpu.tree_cpu` of the postmaster (backends, walsender,
  checkpointer, WAL writer, autovacuum; backends that exit are counted by their parent);
* relay-process CPU (the relay's own process: its main and marker threads, librdkafka's);
* WAL: the ``pg_current_wal_lsn()`` delta (whole server);

each divided by the events. Afterwards a ``VACUUM`` of the table is measured the same way: the
deferred cost of the dead row versions that ``update``, ``delete`` and polling leave (which
autovacuum would pay, at a time of its choosing). With ``--mark-rounds`` above 1 the modes run
that many times, the order rotated, and each figure is the median.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.cpu import CpuMeter
from benchmarks.relay_bench import current_wal
from cdc_outbox.config.settings import Settings
from cdc_outbox_dev import workload

#: (label, relay mode, cdc_mark_published); CDC at-least-once.
MODES = (
    ("update", "cdc", "update"),
    ("delete", "cdc", "delete"),
    ("off", "cdc", "off"),
    # Issue 38: the table-less outbox (docs/outboxes.md): no row, nothing to mark.
    ("table-less", "cdc", "off"),
    ("polling", "polling", "update"),
)
#: The table-less phase's ``message_prefix`` (the writers' and the relay's).
MESSAGE_PREFIX = "bench.outbox"
#: Issue 25: CDC (default ``update``) / polling throughput.
TARGET_UPDATE_RATIO = 5.0
_METRICS = (
    "events_per_s",
    "pg_cpu_us_per_event",
    "relay_cpu_us_per_event",
    "wal_bytes_per_event",
    "writers_wal_bytes_per_event",
    "vacuum_pg_cpu_us_per_event",
    "vacuum_wal_bytes_per_event",
)


def _unpublished(dsn: str, table: str) -> bool:
    """Whether a row of ``table`` is still PENDING/PROCESSING (an index-only probe)."""
    query = sql.SQL(
        "SELECT EXISTS (SELECT 1 FROM {} WHERE status IN ('PENDING', 'PROCESSING'))"
    ).format(sql.Identifier(table))
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return bool(row and row[0])


def _vacuum(dsn: str, table: str, analyze: bool = False) -> None:
    stmt = "VACUUM (ANALYZE)" if analyze else "VACUUM"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(stmt + " {}").format(sql.Identifier(table)))


def _no_autovacuum(dsn: str, table: str) -> None:
    """No autovacuum of ``table``: its cost is measured by the explicit VACUUM afterwards,
    not left to land in a window by chance."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(sql.Identifier(table))
        )


def phase(
    settings: Settings,
    spec: workload.WorkloadSpec,
    cpu: CpuMeter,
    fresh: Callable[[Settings], None],
    running: Callable[[Settings], Any],
    timeout: float = 600,
) -> dict[str, Any]:
    """One mode over a backlog of ``spec.events`` (see the module docstring)."""
    dsn, table = settings.postgres_dsn(), settings.outbox_table
    fresh(settings)
    _no_autovacuum(dsn, table)
    wal_w = current_wal(dsn)
    workload.write_orders(dsn, spec, table=table, columns=settings.column_names())
    wal_w = current_wal(dsn) - wal_w
    _vacuum(dsn, table, analyze=True)
    wal0 = current_wal(dsn)
    relay = running(settings)
    cpu = relay.meter(cpu)  # relay_process: the relay's own process
    cpu.start()
    t0 = time.perf_counter()
    first = relay.start().wait_first(timeout)
    t1 = time.perf_counter()
    relay.wait_published(spec.events, timeout)
    t2 = time.perf_counter()
    marks = settings.mode == "polling" or settings.cdc_mark_published != "off"
    deadline = time.monotonic() + timeout
    while marks and _unpublished(dsn, table):
        if time.monotonic() > deadline:
            relay.stop()
            raise RuntimeError(f"{settings.cdc_mark_published}: rows left unmarked")
        time.sleep(0.1)
    used = cpu.seconds()
    wal1 = current_wal(dsn)
    relay.stop()
    cpu.start()
    _vacuum(dsn, table)
    vacuum = cpu.seconds()
    wal2 = current_wal(dsn)
    n = spec.events
    return {
        "events": n,
        "events_per_s": round((n - first) / (t2 - t1), 1),
        "marked_after_s": round(time.perf_counter() - t2, 3) if marks else 0.0,
        "seconds": round(time.perf_counter() - t0, 3),
        "pg_cpu_us_per_event": round(used.get("postgres", float("nan")) / n * 1e6, 2),
        "relay_cpu_us_per_event": round(used["relay_process"] / n * 1e6, 2),
        "wal_bytes_per_event": round((wal1 - wal0) / n, 1),
        "writers_wal_bytes_per_event": round(wal_w / n, 1),
        "vacuum_pg_cpu_us_per_event": round(vacuum.get("postgres", float("nan")) / n * 1e6, 2),
        "vacuum_wal_bytes_per_event": round((wal2 - wal1) / n, 1),
    }


def measure(
    args: argparse.Namespace,
    cpu: CpuMeter,
    settings_for: Callable[[str, str], Settings],
    create_topic: Callable[[Settings, str], None],
    fresh: Callable[[Settings], None],
    running: Callable[[Settings], Any],
) -> dict[str, Any]:
    """Every mode of :data:`MODES`, ``args.mark_rounds`` times (order rotated); medians.
    The compare benchmark's parts: ``settings_for(mode, topic_prefix)`` (a relay mode's
    settings), ``create_topic``, ``fresh`` (new table) and ``running`` (the relay process
    and a consumer of its topic: :class:`benchmarks.relay_process.Running`)."""
    spec = workload.WorkloadSpec(events=args.mark_events, writers=args.writers)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _m, _c in MODES}
    stamp = int(time.time())
    for number in range(args.mark_rounds):
        shift = number % len(MODES)
        for label, mode, marking in MODES[shift:] + MODES[:shift]:
            print(f"-- mark cost: {label}, round {number + 1}", flush=True)
            prefix = f"bench.{stamp}.mark.{label}.{number}"
            base = settings_for(mode, prefix)
            update: dict[str, Any] = {"cdc_mark_published": marking}
            written = spec
            if label == "table-less":
                update["message_prefix"] = MESSAGE_PREFIX
                written = dataclasses.replace(spec, message_prefix=MESSAGE_PREFIX)
            settings = base.model_copy(update=update)
            create_topic(settings, f"{prefix}.order")
            runs[label].append(phase(settings, written, cpu, fresh, running))
    modes = {
        label: {k: statistics.median(r[k] for r in rs) for k in _METRICS}
        for label, rs in runs.items()
    }
    polling = modes["polling"]["events_per_s"]
    for figures in modes.values():
        figures["vs_polling_throughput"] = round(figures["events_per_s"] / polling, 2)
    ratio = modes["update"]["vs_polling_throughput"]
    return {
        "events": args.mark_events,
        "rounds": args.mark_rounds,
        "modes": modes,
        "runs": runs,
        "target": {
            "update_vs_polling_min": TARGET_UPDATE_RATIO,
            "met": ratio >= TARGET_UPDATE_RATIO,
        },
    }


_COLUMNS = (
    ("PostgreSQL CPU, relay phase (us/event)", "pg_cpu_us_per_event", ".1f"),
    ("WAL, relay phase (bytes/event)", "wal_bytes_per_event", ",.0f"),
    ("WAL, writers (bytes/event; business row included)", "writers_wal_bytes_per_event", ",.0f"),
    ("relay process CPU (us/event)", "relay_cpu_us_per_event", ".1f"),
    ("throughput (events/s)", "events_per_s", ",.0f"),
    ("throughput / polling", "vs_polling_throughput", ".2f"),
    ("VACUUM afterwards: PostgreSQL CPU (us/event)", "vacuum_pg_cpu_us_per_event", ".1f"),
    ("VACUUM afterwards: WAL (bytes/event)", "vacuum_wal_bytes_per_event", ",.0f"),
)


def rows(result: dict[str, Any]) -> list[list[str]]:
    """Header and one row per figure: CDC update, delete, off, table-less, then polling."""
    modes = result["modes"]
    head = ["metric", *(f"CDC {m}" if m != "polling" else m for m in modes)]
    return [head] + [
        [label, *(format(modes[m][key], fmt) for m in modes)] for label, key, fmt in _COLUMNS
    ]


def print_table(result: dict[str, Any]) -> None:
    table = rows(result)
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))
    t = result["target"]
    print(f"mark cost: CDC update / polling >= {t['update_vs_polling_min']}x: {t['met']}")


def markdown(result: dict[str, Any]) -> list[str]:
    """The Markdown report's section."""
    table = rows(result)
    t = result["target"]
    return [
        "## The price of marking rows (cdc_mark_published, CDC at-least-once)",
        "",
        f"{result['events']:,} events (same workload and writers as above) relayed from a"
        " backlog per mode, on a fresh table (autovacuum off for it) after VACUUM ANALYZE;"
        " measured from the relay's start until every event is visible in Kafka and, except"
        " with `off`, no row is left PENDING/PROCESSING (benchmarks/mark_cost.py). PostgreSQL"
        " CPU is the postmaster's process tree; WAL the pg_current_wal_lsn delta (a checkpoint"
        " inside the window adds full-page images); the VACUUM rows are a VACUUM of the table"
        " right after (the dead row versions `update`, `delete` and polling leave)."
        + (f" Median of {result['rounds']} rounds." if result["rounds"] > 1 else ""),
        "",
        "| " + " | ".join(table[0]) + " |",
        "|---|" + "---:|" * (len(table[0]) - 1),
        *("| " + " | ".join(r) + " |" for r in table[1:]),
        "",
        f"- CDC `update` (the default) / polling throughput >= {t['update_vs_polling_min']}x:"
        f" {'met' if t['met'] else 'NOT met'}"
        f" ({result['modes']['update']['vs_polling_throughput']:.2f}x in this phase).",
        "- `off` writes nothing: its CPU is the walsender decoding the slot, which every CDC"
        " mode pays. `update` cannot be a HOT update (`status` is in the partial indexes'"
        " predicates): a new row version and primary-key entry per event, and a dead version"
        " for vacuum. `delete` writes a small WAL record per row; its index entries go at"
        " vacuum time.",
        "- What each mode gives up (`off`: rows stay PENDING, so status, init and a catch-up"
        " count them unpublished; `delete`: no published rows kept): docs/configuration.md,"
        ' "What `cdc_mark_published` costs".',
        "",
    ]
