"""Idempotent consumer throughput: events/s applied with a no-op handler, with and without
de-duplication (``processed_events``), from a backlog already in Kafka, against a bare
confluent-kafka poll loop over the same backlog that only decodes the records (JSON value,
``id`` header) and stores nothing, measured in the same run before and after the consumer
(``bare_eps`` is the faster of the two).

``python -m benchmarks consume --events 20000 --json benchmarks/results/consume.json`` writes
the JSON (top-level ``bare_eps``, ``dedupe_eps``, ``no_dedupe_eps``: events/s from the first
record) and the "Consumer throughput" section of benchmarks/RESULTS.md (kept when the compare
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
#: Issue 25's targets: de-duplicated >= 0.3x bare and >= 10,000 events/s; without >= 0.5x.
TARGETS = {"dedupe_ratio": 0.3, "dedupe_eps": 10_000, "no_dedupe_ratio": 0.5}


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


def _bare(bootstrap: str, topic: str, events: int) -> dict[str, Any]:
    """A plain poll loop: decode each record as the consumer does, nothing else."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"bench-bare-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "isolation.level": "read_committed",
    })  # fmt: skip
    consumer.subscribe([topic])
    started = time.monotonic()
    first = None
    seen = 0
    try:
        while seen < events:
            if time.monotonic() - started > 600:
                raise RuntimeError(f"bare loop timed out after {seen} records")
            for msg in consumer.consume(500, 0.5):
                if msg.error() is not None:
                    continue
                if first is None:
                    first = time.monotonic()
                headers = dict(msg.headers() or [])
                raw_id = headers["id"]
                uuid.UUID(raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id))
                json.loads(msg.value() or b"null")
                seen += 1
        done = time.monotonic()
    finally:
        consumer.close()
    return _figures("bare", events, started, first, done)


def _figures(
    kind: str, events: int, started: float, first: float | None, done: float
) -> dict[str, Any]:
    steady = done - (first or started)
    return {
        "kind": kind,
        "events": events,
        "seconds_total": round(done - started, 2),
        "events_per_s_total": round(events / (done - started)),
        "events_per_s_after_first": round(events / steady) if steady > 0 else None,
    }


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
    return _figures("dedupe" if dedupe else "no_dedupe", events, started, first, done)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with services(args.dsn, args.bootstrap_servers) as (dsn, bootstrap, _cpu):
        topic = f"bench-consume-{uuid.uuid4().hex[:8]}"
        _produce(bootstrap, topic, args.events)
        with psycopg.connect(dsn) as conn:
            server = conn.execute("SELECT version(), current_setting('synchronous_commit')")
            version, sync = server.fetchone() or ("?", "?")
        runs = [_bare(bootstrap, topic, args.events)]
        runs += [_measure(dsn, bootstrap, topic, args.events, d) for d in (True, False)]
        runs.append(_bare(bootstrap, topic, args.events))
    eps = {r["kind"]: r["events_per_s_after_first"] or 0 for r in runs[1:3]}
    bare = max(r["events_per_s_after_first"] or 0 for r in (runs[0], runs[3]))
    ratios = {
        "dedupe_ratio": round(eps["dedupe"] / bare, 3) if bare else None,
        "no_dedupe_ratio": round(eps["no_dedupe"] / bare, 3) if bare else None,
    }
    figures = {**ratios, "dedupe_eps": eps["dedupe"]}
    return {
        "bare_eps": bare,
        "dedupe_eps": eps["dedupe"],
        "no_dedupe_eps": eps["no_dedupe"],
        **ratios,
        "targets": {k: {"target": v, "met": (figures[k] or 0) >= v} for k, v in TARGETS.items()},
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
        print(f"{r['kind']:9}  {r['events_per_s_total']:>7,} events/s total,"
              f" {r['events_per_s_after_first'] or 0:>7,} after the first record")  # fmt: skip
    print(f"bare {result['bare_eps']:,}; de-dup {result['dedupe_ratio']}x,"
          f" no-dedupe {result['no_dedupe_ratio']}x; targets: {result['targets']}")  # fmt: skip


def write_section(result: dict[str, Any], path: Path, command: str) -> None:
    """Replace (or add) the consumer section at the end of ``path``."""
    text = path.read_text() if path.exists() else ""
    head = text.split(MARKER)[0].rstrip()
    m = result["machine"]
    label = {"bare": "bare poll loop (decode only)", "dedupe": "consumer, de-duplication on",
             "no_dedupe": "consumer, de-duplication off"}  # fmt: skip
    t = result["targets"]

    def met(key: str) -> str:
        return "met" if t[key]["met"] else "NOT met"

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
        "| run (in this order) | events | seconds | events/s (incl. group join) |"
        " events/s (from first record) |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {label[r['kind']]} | {r['events']:,} | {r['seconds_total']} |"
            f" {r['events_per_s_total']:,} | {r['events_per_s_after_first'] or 0:,} |"
            for r in result["runs"]
        ),
        "",
        f"bare_eps {result['bare_eps']:,} (the faster bare run); de-duplication"
        f" {result['dedupe_eps']:,} events/s = {result['dedupe_ratio']}x bare (target 0.3x:"
        f" {met('dedupe_ratio')}; target 10,000 events/s: {met('dedupe_eps')}); without"
        f" {result['no_dedupe_eps']:,} events/s = {result['no_dedupe_ratio']}x bare (target"
        f" 0.5x: {met('no_dedupe_ratio')}).",
        "",
        f"- Backlog of {result['params']['events']:,} JSON records (~230 bytes) on"
        f" {result['params']['partitions']} partitions, 1,000 keys, read by one consumer in"
        " this process. Each poll (<= 500 records) is one PostgreSQL transaction: BEGIN,"
        " one multi-row INSERT into processed_events (ON CONFLICT DO NOTHING RETURNING only"
        " after a duplicate), the handler for each new id, COMMIT; then the offsets are"
        " stored (one call per poll).",
        "- The bare loop is confluent-kafka's consume() in a loop, each record's JSON value"
        " and id header parsed; it writes nothing anywhere.",
        "",
    ]
    path.write_text((head + "\n\n" if head else "") + "\n".join(lines))
