"""Idempotent consumer throughput: events/s applied with a no-op handler, with and without
de-duplication (``processed_events``), from a backlog already in Kafka, against a bare
confluent-kafka poll loop over the same backlog that only decodes the records (JSON value,
``id`` header) and stores nothing.

Method (the same rule for the three): the backlog is read once unmeasured first (the first
reader of a fresh backlog is slower, whoever it is); then ``--rounds`` rounds, each reading
the whole backlog with a new group once per kind, the order rotated from round to round.
A run's rate counts the records after its first poll's, from the moment those were finished
(bare: decoded; consumer: committed, timestamped by the consumer's own metrics call), so
group join and the first fetch are left out alike. A round's ratios compare it to that
round's bare run; the figures are medians over the rounds.

``python -m benchmarks consume --events 20000`` writes the JSON (top-level ``bare_eps``,
``dedupe_eps``, ``no_dedupe_eps``: median events/s, and the median ratios;
:mod:`benchmarks.output`) and, with ``--results PATH``, the Markdown "Consumer throughput"
section (as in docs/performance.md) at the end of that file.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import threading
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import confluent_kafka
import psycopg
from confluent_kafka import Producer
from psycopg_pool import ConnectionPool

from benchmarks.cpu import thread_cpu
from benchmarks.relay_bench import services
from cdc_outbox.consumer import ConsumerSettings, Event, IdempotentConsumer
from cdc_outbox.consumer.metrics import ConsumerMetrics

MARKER = "<!-- consume-bench: written by `python -m benchmarks consume` -->"
PARTITIONS = 3
#: Issue 25's targets: de-duplicated >= 0.3x bare and >= 10,000 events/s; without >= 0.5x.
TARGETS = {"dedupe_ratio": 0.3, "dedupe_eps": 10_000, "no_dedupe_ratio": 0.5}
#: Records per poll, for the consumer and the bare loop alike: the consumer's default.
POLL_BATCH: int = ConsumerSettings.model_fields["poll_batch"].default


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


def _bare(bootstrap: str, topic: str, events: int, batch: int) -> dict[str, Any]:
    """A plain poll loop: decode each record as the consumer does, nothing else; polls of
    ``batch`` records, as the consumer's."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"bench-bare-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "isolation.level": "read_committed",
    })  # fmt: skip
    consumer.subscribe([topic])
    started = time.monotonic()
    cpu0 = thread_cpu(threading.get_native_id())
    first: tuple[float, int] | None = None
    seen = 0
    try:
        while seen < events:
            if time.monotonic() - started > 600:
                raise RuntimeError(f"bare loop timed out after {seen} records")
            for msg in consumer.consume(batch, 0.5):
                if msg.error() is not None:
                    continue
                headers = dict(msg.headers() or [])
                raw_id = headers["id"]
                uuid.UUID(raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id))
                json.loads(msg.value() or b"null")
                seen += 1
            if first is None and seen:
                first = time.monotonic(), seen  # the first poll's records are finished
        done = time.monotonic()
        cpu = thread_cpu(threading.get_native_id()) - cpu0
    finally:
        consumer.close()
    return _figures("bare", events, started, first, done, cpu)


def _figures(
    kind: str,
    events: int,
    started: float,
    first: tuple[float, int] | None,
    done: float,
    cpu_s: float,
) -> dict[str, Any]:
    """Rates: over the whole run (group join included) and over the records after the first
    poll's, timed from the moment those were finished (the same rule for every kind); and
    the CPU of the reading thread per record over the whole run (librdkafka's own threads
    not included, for either kind): its Python work, which moves little with the host's load."""
    at, count = first or (started, 0)
    steady = done - at
    return {
        "kind": kind,
        "events": events,
        "seconds_total": round(done - started, 2),
        "events_per_s_total": round(events / (done - started)),
        "steady_events": events - count,
        "steady_seconds": round(steady, 4),
        "events_per_s_after_first": round((events - count) / steady) if steady > 0 else None,
        "thread_cpu_us_per_event": round(cpu_s / events * 1e6, 2),
    }


class _Timed(ConsumerMetrics):
    """The consumer's metrics, timestamped where the consumer counts (its own thread, right
    after a batch's COMMIT): when the first batch was finished, and when the last was."""

    def __init__(self, name: str, events: int) -> None:
        super().__init__(name)
        self.events = events
        self.first: tuple[float, int] | None = None
        self.done: float | None = None
        self.finished = threading.Event()
        self.cpu_s = 0.0  # the consumer thread's CPU from its first count to the last

    def record(self, outcomes: Iterable[tuple[str, str]]) -> None:
        super().record(outcomes)
        processed = self.counts["processed"]
        if self.first is None and processed:
            self.first = time.monotonic(), processed
        if self.done is None and processed >= self.events:
            self.done = time.monotonic()
            self.cpu_s = thread_cpu(threading.get_native_id())  # the consumer's thread
            self.finished.set()


def _measure(
    dsn: str, bootstrap: str, topic: str, events: int, dedupe: bool, batch: int
) -> dict[str, Any]:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    settings = ConsumerSettings(
        consumer_name=name, group_id=f"bench-{uuid.uuid4().hex[:8]}", topics=(topic,),
        bootstrap_servers=bootstrap, dedupe=dedupe, poll_batch=batch,
    )  # fmt: skip
    metrics = _Timed(name, events)
    with ConnectionPool(dsn, min_size=1, max_size=2) as pool:
        consumer = IdempotentConsumer(settings, pool, _noop, metrics=metrics)
        thread = threading.Thread(target=consumer.run, daemon=True)
        started = time.monotonic()
        thread.start()
        assert thread.native_id is not None
        cpu0 = thread_cpu(thread.native_id)
        if not metrics.finished.wait(600) or metrics.done is None:
            consumer.request_stop()
            raise RuntimeError(f"timed out: {metrics.counts}")
        consumer.request_stop()
        thread.join(60)
    return _figures("dedupe" if dedupe else "no_dedupe", events, started, metrics.first,
                    metrics.done, metrics.cpu_s - cpu0)  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    with services(args.dsn, args.bootstrap_servers) as (dsn, bootstrap, _cpu):
        topic = f"bench-consume-{uuid.uuid4().hex[:8]}"
        _produce(bootstrap, topic, args.events)
        with psycopg.connect(dsn) as conn:
            server = conn.execute("SELECT version(), current_setting('synchronous_commit')")
            version, sync = server.fetchone() or ("?", "?")
        batch = args.poll_batch or POLL_BATCH
        _bare(bootstrap, topic, args.events, batch)  # warm-up, not measured
        kinds = ("bare", "dedupe", "no_dedupe")
        rounds: list[dict[str, dict[str, Any]]] = []
        for number in range(args.rounds):
            shift = number % len(kinds)
            pair: dict[str, dict[str, Any]] = {}
            for kind in kinds[shift:] + kinds[:shift]:
                if kind == "bare":
                    pair[kind] = _bare(bootstrap, topic, args.events, batch)
                else:
                    dedupe = kind == "dedupe"
                    pair[kind] = _measure(dsn, bootstrap, topic, args.events, dedupe, batch)
            rounds.append(pair)
    eps = {
        k: statistics.median(r[k]["events_per_s_after_first"] or 0 for r in rounds) for k in kinds
    }

    def ratio(r: dict[str, dict[str, Any]], kind: str) -> float:
        bare = r["bare"]["events_per_s_after_first"]
        return round((r[kind]["events_per_s_after_first"] or 0) / bare, 3) if bare else 0.0

    per_round = {f"{k}_ratio": [ratio(r, k) for r in rounds] for k in ("dedupe", "no_dedupe")}
    cpu = {k: statistics.median(r[k]["thread_cpu_us_per_event"] for r in rounds) for k in kinds}
    ratios = {k: round(statistics.median(v), 3) for k, v in per_round.items()}
    figures = {**ratios, "dedupe_eps": eps["dedupe"]}
    return {
        "bare_eps": round(eps["bare"]),
        "dedupe_eps": round(eps["dedupe"]),
        "no_dedupe_eps": round(eps["no_dedupe"]),
        **ratios,
        "ratios_per_round": per_round,
        "thread_cpu_us_per_event": cpu,
        "targets": {k: {"target": v, "met": (figures[k] or 0) >= v} for k, v in TARGETS.items()},
        "machine": {
            "cpu": f"{platform.processor() or platform.machine()}, "
            f"{__import__('os').cpu_count()} cores",
            "python": platform.python_version(),
            "postgresql": f"{version.split(' on ')[0]} (synchronous_commit={sync})",
            "confluent_kafka": str(confluent_kafka.__version__),
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        },
        "params": {
            "events": args.events,
            "partitions": PARTITIONS,
            "poll_batch": batch,
            "rounds": args.rounds,
        },
        "runs": [r[k] for r in rounds for k in r],
    }


def print_table(result: dict[str, Any]) -> None:
    for r in result["runs"]:
        print(f"{r['kind']:9}  {r['events_per_s_total']:>7,} events/s total,"
              f" {r['events_per_s_after_first'] or 0:>7,} after the first poll,"
              f" {r['thread_cpu_us_per_event']} us CPU/event")  # fmt: skip
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
        " events/s (after the first poll) | reading thread CPU (us/event) |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {label[r['kind']]} | {r['events']:,} | {r['seconds_total']} |"
            f" {r['events_per_s_total']:,} | {r['events_per_s_after_first'] or 0:,} |"
            f" {r.get('thread_cpu_us_per_event', '')} |"
            for r in result["runs"]
        ),
        "",
        f"Medians of {result['params']['rounds']} rounds: bare {result['bare_eps']:,};"
        f" de-duplication {result['dedupe_eps']:,} events/s, {result['dedupe_ratio']}x bare"
        f" (rounds: {_listed(result['ratios_per_round']['dedupe_ratio'])}; target 0.3x:"
        f" {met('dedupe_ratio')}; target 10,000 events/s: {met('dedupe_eps')}); without"
        f" {result['no_dedupe_eps']:,} events/s, {result['no_dedupe_ratio']}x bare (rounds:"
        f" {_listed(result['ratios_per_round']['no_dedupe_ratio'])}; target 0.5x:"
        f" {met('no_dedupe_ratio')}). Reading thread CPU per event (medians; librdkafka's"
        " threads not included): "
        + ", ".join(f"{k} {v} us" for k, v in result["thread_cpu_us_per_event"].items())
        + ".",
        "",
        f"- Backlog of {result['params']['events']:,} JSON records (~230 bytes) on"
        f" {result['params']['partitions']} partitions, 1,000 keys, read by one consumer in"
        f" this process. Each poll (<= {result['params']['poll_batch']} records) is one"
        " PostgreSQL transaction: BEGIN pipelined with one multi-row INSERT into"
        " processed_events (ON CONFLICT DO NOTHING RETURNING only after a duplicate), the"
        " handler for each new id, COMMIT; then the offsets are stored (one call per poll).",
        "- The bare loop is confluent-kafka's consume() in a loop (polls of the same size),"
        " each record's JSON value and id header parsed; it writes nothing anywhere.",
        "- The backlog is read once unmeasured first; then each round reads it once per kind"
        " (a new group each), the order rotated; a run's rate counts the records after its"
        " first poll, from the moment those were finished (bare: decoded; consumer:"
        " committed); each round's ratios use that round's bare run.",
        "",
    ]
    path.write_text((head + "\n\n" if head else "") + "\n".join(lines))


def _listed(values: list[float]) -> str:
    return " / ".join(f"{v}x" for v in values)
