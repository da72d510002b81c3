"""Several outbox tables through one slot against one relay and one slot per table, same WAL.

``python -m benchmarks outboxes [--tables 4] [--events N] [--txn-size K]`` starts a local
PostgreSQL and Kafka (:mod:`cdc_outbox_dev.sandbox`), creates ``--tables`` outbox tables (default
layout, one schema each: ``bench_1.outbox`` ...) and, before any event is written, every slot of
both phases (``cdc-outbox init`` per configuration), so both phases decode exactly the same WAL:

- **one slot**: one relay (``python -m cdc_outbox run``, its own process) with every table in
  ``[[outboxes]]``, one publication, one slot;
- **one slot per table**: ``--tables`` relays, each with one table, its own publication and slot
  (today's way without ``[[outboxes]]``).

Then N events are written, K per transaction, each transaction into one table, round-robin. Each
phase starts its relay(s) on that backlog and ends when Kafka holds every event of the phase
(the high watermarks of its topics; each phase has topics of its own). Reported per phase: wall
time, PostgreSQL CPU (the whole server: postmaster tree, including the relays' sessions), the
walsenders' CPU alone (the decoding: every walsender decodes all of the WAL), the relays' CPU,
each per event, and the ratios one slot ÷ one slot per table. ``cdc_mark_published = "off"`` and
``mode = "cdc"``: nothing but the stream is measured.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from benchmarks import output
from benchmarks.cpu import process_cpu, tree_cpu
from cdc_outbox_dev.sandbox.kafka import LocalKafka
from cdc_outbox_dev.sandbox.postgres import DEFAULT_SETTINGS, LocalPostgres

_INSERT = (
    "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload)"
    " SELECT 'order', 'o-' || (g %% 100), 'OrderUpdated',"
    ' \'{{"order": "o-1", "customer": "c-42", "total_cents": 1999}}\'::jsonb'
    " FROM generate_series(1, %s) g"
)


def _toml(dsn: str, bootstrap: str, slot: str, tables: list[str], phase: str) -> str:
    lines = [
        f'dsn = "{dsn}"',
        f'slot_name = "{slot}"',
        f'publication_name = "{slot}_pub"',
        'mode = "cdc"',
        "metrics_port = 0",
        'log_level = "WARNING"',
        "[kafka]",
        f'bootstrap_servers = "{bootstrap}"',
    ]
    for table in tables:
        schema = table.split(".")[0]
        lines += [
            "[[outboxes]]",
            f'schema = "{schema}"',
            'table = "outbox"',
            f'topic_template = "{phase}.{schema}.{{aggregate_type}}"',
            'cdc_mark_published = "off"',
        ]
    return "\n".join(lines) + "\n"


def _cli(config: Path, *args: str, quiet: bool = False) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_OUTBOX_")}
    env["CDC_OUTBOX_CONFIG"] = str(config)
    out = subprocess.DEVNULL if quiet else None
    return subprocess.Popen([sys.executable, "-m", "cdc_outbox", *args], env=env, stdout=out)


def _init(config: Path) -> None:
    proc = _cli(config, "init", "--create-table", quiet=True)
    if proc.wait(timeout=120) != 0:
        raise SystemExit(f"outboxes benchmark: cdc-outbox init failed for {config}")


def _published(admin: AdminClient, consumer: Consumer, phase: str) -> int:
    """Records in Kafka on the phase's topics (sum of high watermarks; 0 while a topic being
    created has no leader yet)."""
    total = 0
    try:
        for name, topic in admin.list_topics(timeout=10).topics.items():
            if not name.startswith(f"{phase}."):
                continue
            for p in topic.partitions:
                _low, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
                total += high
    except KafkaException:
        return 0
    return total


def _walsender_cpu(dsn: str) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_replication").fetchall()]
    return sum(process_cpu(pid) for pid in pids)


def _phase(
    name: str, configs: list[Path], events: int, dsn: str, pg_pid: int, bootstrap: str
) -> dict[str, Any]:
    """Run one relay per config until Kafka holds ``events`` records of phase ``name``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{name}"})
    pg_before, began = tree_cpu(pg_pid), time.monotonic()
    relays = [_cli(c, "run") for c in configs]
    try:
        while (done := _published(admin, consumer, name)) < events:
            if any(r.poll() is not None for r in relays):
                raise SystemExit(f"outboxes benchmark: a relay of phase {name} exited")
            if time.monotonic() - began > 600:
                raise SystemExit(f"outboxes benchmark: phase {name}: {done} of {events} in 600 s")
            time.sleep(0.1)
        wall = time.monotonic() - began
        walsenders = _walsender_cpu(dsn)
        relay_cpu = sum(process_cpu(r.pid) for r in relays)
        pg_cpu = tree_cpu(pg_pid) - pg_before
    finally:
        for r in relays:
            r.terminate()
        for r in relays:
            r.wait(timeout=60)
        consumer.close()
    per = 1e6 / events
    return {
        "relays": len(configs),
        "events": events,
        "wall_s": round(wall, 2),
        "events_per_s": round(events / wall),
        "postgres_cpu_us_per_event": round(pg_cpu * per, 1),
        "walsender_cpu_us_per_event": round(walsenders * per, 1),
        "relay_cpu_us_per_event": round(relay_cpu * per, 1),
    }


@contextlib.contextmanager
def _servers(tables: int) -> Iterator[tuple[LocalPostgres, LocalKafka]]:
    slots = max(int(DEFAULT_SETTINGS["max_replication_slots"]), tables + 2)
    room = {"max_replication_slots": str(slots), "max_wal_senders": str(slots + 2)}
    with LocalPostgres(settings=room) as pg, LocalKafka() as kafka:
        yield pg, kafka


def main(argv: list[str]) -> int:
    """``python -m benchmarks outboxes`` (see the module docstring)."""
    parser = output.parser("outboxes", (__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--txn-size", type=int, default=100)
    args = parser.parse_args(argv)
    if args.tables < 2 or args.events < args.tables or args.txn_size < 1:
        print("outboxes: --tables >= 2, --events >= --tables, --txn-size >= 1", file=sys.stderr)
        return 2
    tables = [f"bench_{i + 1}.outbox" for i in range(args.tables)]
    txns = max(1, args.events // args.txn_size)
    events = txns * args.txn_size
    with _servers(args.tables) as (pg, kafka), tempfile.TemporaryDirectory() as tmp:
        dsn, bootstrap = pg.dsn, kafka.bootstrap_servers
        with psycopg.connect(dsn, autocommit=True) as conn:
            for t in tables:
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {t.split('.')[0]}")
        one = Path(tmp, "one.toml")
        one.write_text(_toml(dsn, bootstrap, "bench_one", tables, "one"))
        each = [Path(tmp, f"each_{i}.toml") for i in range(len(tables))]
        for i, (path, t) in enumerate(zip(each, tables, strict=True)):
            path.write_text(_toml(dsn, bootstrap, f"bench_each_{i + 1}", [t], "each"))
        for config in [one, *each]:  # every slot before any event: the same WAL for both
            _init(config)
        with psycopg.connect(dsn) as conn:
            for i in range(txns):
                conn.execute(_INSERT.format(table=tables[i % len(tables)]), (args.txn_size,))
                conn.commit()
        assert pg.pid is not None
        one_slot = _phase("one", [one], events, dsn, pg.pid, bootstrap)
        per_table = _phase("each", each, events, dsn, pg.pid, bootstrap)
    ratios = {
        key.replace("_us_per_event", "_one_vs_each"): round(one_slot[key] / per_table[key], 3)
        for key in one_slot
        if key.endswith("_us_per_event") and per_table[key]
    }
    result = {
        "benchmark": "outboxes",
        "tables": args.tables,
        "txn_size": args.txn_size,
        "one_slot": one_slot,
        "one_slot_per_table": per_table,
        "ratios": ratios,
        "load_avg": os.getloadavg(),
    }
    for label, phase in (("one slot", one_slot), ("one slot per table", per_table)):
        print(
            f"{label:<20} {phase['events_per_s']:>8} ev/s  PostgreSQL"
            f" {phase['postgres_cpu_us_per_event']:6.1f} us/ev (walsenders"
            f" {phase['walsender_cpu_us_per_event']:6.1f})  relays"
            f" {phase['relay_cpu_us_per_event']:6.1f} us/ev"
        )
    print("one slot / one slot per table:", ratios)
    output.save("outboxes", result, args)
    return 0
