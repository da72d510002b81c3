"""Idempotent consumer throughput: events/s applied with a no-op handler, with and without
de-duplication (``processed_events``), from a backlog already in Kafka.

``python -m benchmarks consume --events 50000 --json benchmarks/results/consume.json`` writes the
JSON and the "Consumer throughput" section of benchmarks/RESULTS.md (kept when the compare
benchmark rewrites the rest of the file).
"""

from __future__ import annotations

import argparse
import json
import platform
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import confluent_kafka
import psycopg
from confluent_kafka import Producer
from psycopg_pool import ConnectionPool

from benchmarks.relay_bench import services
from cdc_outbox.consumer import ConsumerSettings, Event, IdempotentConsumer

MARKER = "<!-- consume-bench: written by `python -m benchmarks consume` -->"
PARTITIONS = 3


def _noop(conn: psycopg.Connection[Any], event: Event) -> None:
    return None


def _produce(bootstrap: str, topic: str, events: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        f.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(events):
        headers: list[tuple[str, str | bytes | None]] = [
            ("id", str(uuid.uuid4()).encode()), ("event_type", b"Bench"),
            ("aggregate_type", b"bench"),
        ]  # fmt: skip
        value = json.dumps({"i": i, "pad": "x" * 200}).encode()
        while True:
            try:
                producer.produce(topic, value, f"agg-{i % 1000}".encode(), headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


def _measure(dsn: str, bootstrap: str, topic: str, events: int, dedupe: bool) -> dict[str, Any]:
    settings = ConsumerSettings(
        consumer_name=f"bench-{uuid.uuid4().hex[:8]}", group_id=f"bench-{uuid.uuid4().hex[:8]}",
        topics=(topic,), bootstrap_servers=bootstrap, dedupe=dedupe,
    )  # fmt: skip
    with ConnectionPool(dsn, min_size=1, max_size=2) as pool:
        consumer = IdempotentConsumer(settings, pool, _noop)
        thread = threading.Thread(target=consumer.run, daemon=True)
        started = time.monotonic()
        thread.start()
        first = None
        while consumer.metrics.counts["processed"] < events:
            if first is None and consumer.metrics.counts["processed"] > 0:
                first = time.monotonic()
            if time.monotonic() - started > 600:
                raise RuntimeError(f"timed out: {consumer.metrics.counts}")
            time.sleep(0.01)
        done = time.monotonic()
        consumer.request_stop()
        thread.join(60)
    steady = done - (first or started)
    return {
        "dedupe": dedupe,
        "events": events,
        "seconds_total": round(done - started, 2),
        "events_per_s_total": round(events / (done - started)),
        "events_per_s_after_first": round(events / steady) if steady > 0 else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with services(args.dsn, args.bootstrap_servers) as (dsn, bootstrap, _cpu):
        topic = f"bench-consume-{uuid.uuid4().hex[:8]}"
        _produce(bootstrap, topic, args.events)
        with psycopg.connect(dsn) as conn:
            server = conn.execute("SELECT version(), current_setting('synchronous_commit')")
            version, sync = server.fetchone() or ("?", "?")
        runs = [_measure(dsn, bootstrap, topic, args.events, d) for d in (True, False)]
    return {
        "machine": {
            "cpu": f"{platform.processor() or platform.machine()}, "
            f"{__import__('os').cpu_count()} cores",
            "python": platform.python_version(),
            "postgresql": f"{version.split(' on ')[0]} (synchronous_commit={sync})",
            "confluent_kafka": str(confluent_kafka.__version__),
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        },
        "params": {"events": args.events, "partitions": PARTITIONS, "poll_batch": 500},
        "runs": runs,
    }


def print_table(result: dict[str, Any]) -> None:
    for r in result["runs"]:
        print(f"dedupe={r['dedupe']!s:5}  {r['events_per_s_total']:>7,} events/s total,"
              f" {r['events_per_s_after_first'] or 0:>7,} after the first record")  # fmt: skip


def write_section(result: dict[str, Any], path: Path, command: str) -> None:
    """Replace (or add) the consumer section at the end of ``path``."""
    text = path.read_text() if path.exists() else ""
    head = text.split(MARKER)[0].rstrip()
    with_d, without = result["runs"]
    m = result["machine"]
    lines = [
        MARKER,
        "",
        "## Consumer throughput (cdc-outbox consume, no-op handler)",
        "",
        f"    {command}",
        "",
        f"Machine as above unless noted: {m['cpu']}; {m['postgresql']};"
        f" confluent_kafka {m['confluent_kafka']}; {m['date']}.",
        "",
        "| de-duplication | events | seconds | events/s (incl. group join) |"
        " events/s (from first record) |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {'on (processed_events)' if r['dedupe'] else 'off'} | {r['events']:,} |"
            f" {r['seconds_total']} | {r['events_per_s_total']:,} |"
            f" {r['events_per_s_after_first'] or 0:,} |"
            for r in (with_d, without)
        ),
        "",
        f"- Backlog of {result['params']['events']:,} JSON records (~230 bytes) on"
        f" {result['params']['partitions']} partitions, 1,000 keys, read by one consumer in"
        " this process; each poll (<= 500 records) is one PostgreSQL transaction with a"
        " savepoint per record, committed before the offsets are stored.",
        "- With de-duplication every record also inserts its (consumer_name, event_id) row;"
        " the cost is that INSERT plus the index on processed_events.",
        "",
    ]
    path.write_text((head + "\n\n" if head else "") + "\n".join(lines))
