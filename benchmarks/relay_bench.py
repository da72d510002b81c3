"""Raw slot drain vs the full relay, over the same WAL, in one run.

All slots are created at the same point before the data is written, so every phase decodes
exactly the same transactions: (a) receive-only drain of a slot (frames counted, nothing
decoded, nothing published); (b) the relay on another slot, ``python -m cdc_outbox run`` as
its own process (:mod:`benchmarks.relay_process`), until a consumer of its topics has seen
every event (read_committed: exactly-once counts committed ones), timed from the first record
the consumer saw (the start-up, i.e. process start, election, slot and producer set-up, is
``start_s``, as in ``compare``). ``--rounds`` rounds of
(a) and (b), each on slots of its own, the median ratio reported: :mod:`benchmarks.relay_rounds`.
With ``--value-format avro`` more slots, created at the same point, are relayed again with Avro
values (Confluent wire format, schema from a local Apicurio registry) and JSON, in
``--avro-rounds`` rounds: :mod:`benchmarks.avro_rounds`, ``avro_vs_json`` the median ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from benchmarks import avro_rounds, relay_process, relay_rounds
from benchmarks.cpu import CpuMeter, process_cpu, tree_cpu
from cdc_outbox.cdc.replication_stream import ReplicationStream
from cdc_outbox.config.settings import Settings
from cdc_outbox.kafka.publisher import KafkaPublisher
from cdc_outbox.pgwire.walproto import Keepalive
from cdc_outbox.store.schema import (
    outbox_ident,
    outbox_table_ddl,
    publication_ddl,
    relay_state_ddl,
    relay_state_ident,
)
from cdc_outbox_dev import workload
from cdc_outbox_dev.sandbox.kafka import LocalKafka
from cdc_outbox_dev.sandbox.postgres import DEFAULT_SETTINGS, LocalPostgres

PUBLICATION = "bench_pub"
#: Where each relay process's output goes (ignored by git, as benchmarks/out/).
LOG_DIR = Path("benchmarks/out/logs")


@contextlib.contextmanager
def registry(wanted: bool) -> Iterator[str]:
    """A throw-away local schema registry's URL ("" when not ``wanted``)."""
    if not wanted:
        yield ""
        return
    from cdc_outbox_dev.sandbox.registry import LocalRegistry

    with LocalRegistry() as reg:
        yield reg.url


@contextlib.contextmanager
def services(
    dsn: str | None, bootstrap: str | None, slots: int = 0
) -> Iterator[tuple[str, str, CpuMeter]]:
    """The given services, or local throw-away ones for what is not given (a local
    PostgreSQL with room for ``slots`` replication slots, at least the sandbox's default),
    and a CPU meter over this process and (when local) the broker and the PostgreSQL
    server."""
    probes: dict[str, Callable[[], float]] = {"relay_process": lambda: process_cpu(os.getpid())}
    with contextlib.ExitStack() as stack:
        if dsn is None:
            default = int(DEFAULT_SETTINGS["max_replication_slots"])
            # Every round's slots hold the WAL of the rounds before them (restores, markings).
            room = {
                "max_replication_slots": str(max(default, slots)),
                "max_slot_wal_keep_size": "-1",
                # commit timestamps: latency measured from outside (benchmarks.outside_latency)
                "track_commit_timestamp": "on",
            }
            pg = stack.enter_context(LocalPostgres(settings=room))
            dsn = pg.dsn
            probes["postgres"] = lambda: tree_cpu(pg.pid or 0)
        if bootstrap is None:
            kafka = stack.enter_context(LocalKafka())
            bootstrap = kafka.bootstrap_servers
            probes["kafka_broker"] = lambda: process_cpu(kafka.pid or 0)
        yield dsn, bootstrap, CpuMeter(probes)


class SlotsExhausted(Exception):
    """The server cannot hold the slots the run needs (the text says how many)."""


def setup(settings: Settings, slots: list[str], relay_slots: list[str]) -> None:
    """Fresh outbox tables (every configured one), publication and ``slots`` (created before
    any data is written; the relay's phase is STREAMING on ``relay_slots``), or
    :class:`SlotsExhausted` before anything changes but the run's own old slots."""
    dsn = settings.postgres_dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for slot in slots:
            drop_slot(conn, slot)
        row = conn.execute(
            "SELECT current_setting('max_replication_slots')::int - count(*)"
            " FROM pg_replication_slots"
        ).fetchone()
        free = 0 if row is None else int(row[0])
        if free < len(slots):
            raise SlotsExhausted(
                f"relay benchmark: needs {len(slots)} replication slots (2 per --rounds round"
                f" and 1, 2 per --avro-rounds round), the server has {free} free: lower --rounds or"
                " --avro-rounds or raise max_replication_slots"
            )
        for outbox in settings.outbox_settings():
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(outbox_ident(settings, outbox)))
        conn.execute(
            sql.SQL("DROP PUBLICATION IF EXISTS {}").format(
                sql.Identifier(settings.publication_name)
            )
        )
        for outbox in settings.outbox_settings():
            for stmt in outbox_table_ddl(settings, outbox):
                conn.execute(stmt)
        conn.execute(publication_ddl(settings))
        for slot in slots:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        # The slots exist before any row is written: nothing to catch up, the relay streams
        # every outbox table from the start (``streamed_tables``, as ``cdc-outbox init``
        # records it; unknown, the relay would catch up every table but the first from the
        # table first: cdc/new_tables.py).
        for stmt in relay_state_ddl(settings):
            conn.execute(stmt)
        streamed = json.dumps({o.name: "0/0" for o in settings.outbox_settings()})
        for slot in relay_slots:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (slot_name, phase, streamed_tables)"
                    " VALUES (%s, 'STREAMING', %s::jsonb) ON CONFLICT (slot_name)"
                    " DO UPDATE SET phase = 'STREAMING', streamed_tables = %s::jsonb"
                ).format(relay_state_ident(settings)),
                (slot, streamed, streamed),
            )


def drop_slot(conn: psycopg.Connection[Any], slot: str, timeout: float = 30.0) -> None:
    """Drop ``slot`` if it exists, once its walsender is gone: a relay process that exited a
    moment ago may leave it for a while (the server notices the closed connection)."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
        if row is None:
            return
        if not row[0] or time.monotonic() > deadline:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            return
        time.sleep(0.05)


def current_wal(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def raw_drain(
    settings: Settings, slot: str, events: int, cpu: CpuMeter
) -> tuple[float, int, dict[str, float]]:
    """Receive frames from ``slot`` until ``events`` Insert frames arrived.

    Returns (seconds, frames, cores used per process while streaming)."""
    stream = ReplicationStream(settings.postgres_dsn(), slot, settings.publication_name)
    cpu.start()
    t0 = time.perf_counter()
    stream.open(0)
    inserts = frames = 0
    last_status = time.monotonic()
    try:
        while inserts < events:
            frame = stream.read(1.0)
            if frame is None or isinstance(frame, Keepalive):
                continue
            frames += 1
            if frame.payload[0] == 73:  # 'I'
                inserts += 1
            if time.monotonic() - last_status > 5:
                stream.send_status(frame.wal_start, 0)
                last_status = time.monotonic()
        elapsed = time.perf_counter() - t0
        return elapsed, frames, cpu.cores_used(elapsed)
    finally:
        stream.close()


@dataclass(frozen=True)
class RelayRun:
    """One relay phase: ``seconds`` for ``events`` events at the rate a consumer of the
    relay's topics saw from its first visible record (read_committed: exactly-once counts
    from its first commit) to the last (start-up, i.e. process start, election, slot and
    producer set-up, is ``start_s``), cores used per process over the whole phase, and the
    relay process's CPU seconds (start-up included)."""

    seconds: float
    start_s: float
    cores: dict[str, float]
    thread_cpu_s: float


def relay_phase(settings: Settings, events: int, profile: Path | None, cpu: CpuMeter) -> RelayRun:
    """Run ``python -m cdc_outbox run`` (its own process, as a user runs it) until a consumer
    of its topics has seen ``events`` records (:func:`benchmarks.relay_process.drain`)."""
    log = LOG_DIR / f"relay-{settings.slot_name}-{time.time_ns()}.log"
    drained = relay_process.drain(settings, events, cpu, log, profile=profile)
    return RelayRun(
        events / drained.events_per_s, drained.start_s, drained.cores, drained.relay_cpu_s
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    avro = args.value_format == "avro"
    stamp = int(time.time())
    plan = avro_rounds.phases(args.avro_rounds, stamp) if avro else []
    pairs = relay_rounds.slots(args.rounds)
    relay_slots = [relay for _, relay in pairs] + [slot for _, _, slot, _ in plan]
    relay_slots.append(relay_rounds.WARMUP_SLOT)
    slots = [raw for raw, _ in pairs] + relay_slots
    with (
        services(args.dsn, args.bootstrap_servers, len(slots)) as (dsn, bootstrap, cpu),
        registry(avro) as registry_url,
    ):
        topic_prefix = f"bench.{stamp}"
        settings = Settings.model_validate(
            {
                "dsn": dsn,
                "slot_name": relay_slots[0],
                "publication_name": PUBLICATION,
                **_tables(args.outboxes, topic_prefix, args.cdc_mark_published),
                "mode": "cdc",
                "delivery": args.delivery,
                "eos": {"checkpoint_topic": topic_prefix + ".checkpoints"},
                "metrics_port": 0,
                "kafka": {
                    "bootstrap_servers": bootstrap,
                    "config": dict(kv.split("=", 1) for kv in args.kafka_config),
                },
            }
        )
        setup(settings, slots, relay_slots)
        # Create the topics up front so that no relay phase times topic creation (the counts
        # subtract the warm-up record).
        warm = KafkaPublisher(settings.kafka_config())
        prefixes = [relay_rounds.topic_prefix(n, stamp) for n in range(-1, args.rounds)]
        for prefix in prefixes:
            for topic in relay_process.phase_topics(relay_rounds.with_topics(settings, prefix)):
                warm.produce(topic, b"warmup", b"{}", [], _WarmupListener())
        for prefix in (prefix for _, _, _, prefix in plan):
            warm.produce(f"{prefix}.order", b"warmup", b"{}", [], _WarmupListener())
        warm.flush(30)
        t0 = time.perf_counter()
        written = write(settings, args.events, args.writers, args.txn_size)
        write_s = time.perf_counter() - t0
        wal_bytes = current_wal(dsn)
        measured = relay_rounds.run(
            settings,
            bootstrap,
            args.rounds,
            stamp,
            args.events,
            lambda slot: raw_drain(settings, slot, args.events, cpu),
            # Only the first round's relay is profiled (the profiler slows it down).
            lambda phase, n: relay_phase(phase, args.events, args.profile if n == 0 else None, cpu),
        )
        extra: dict[str, Any] = {}
        if avro:
            extra = avro_rounds.compare(
                settings,
                registry_url,
                bootstrap,
                plan,
                args.events,
                lambda phase: relay_phase(phase, args.events, None, cpu),
            )
        return {
            "value_format": args.value_format,
            "outboxes": args.outboxes,
            "events": args.events,
            "txn_size": args.txn_size,
            "delivery": args.delivery,
            "cdc_mark_published": args.cdc_mark_published,
            "writers": args.writers,
            "transactions": written.transactions,
            "write_eps": round(args.events / write_s, 1),
            # Medians over the rounds (``rounds``: every round's figures): raw_drain_s,
            # raw_drain_eps, relay_s, start_s, relay_eps, ratio (of the rounds' ratios) and
            # relay_thread_us_per_event, the CPU the relay process spent per event (issue 38:
            # all its threads, librdkafka's and the marker's included; the name is kept for
            # the JSON's history). cores_*_phase: average cores per process (the machine's total is
            # os.cpu_count()) in the round with the median ratio: what bounds the relay.
            **measured,
            "wal_position_bytes": wal_bytes,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "machine": _machine(),
            **extra,
        }


def _tables(outboxes: int, topic_prefix: str, mark: str = "update") -> dict[str, Any]:
    """The settings of the outbox table(s): ``bench_outbox`` (the single-table keys), or
    ``bench_outbox_1`` ... as ``[[outboxes]]``, each with topics of its own; ``mark``: their
    ``cdc_mark_published``."""
    if outboxes == 1:
        return {
            "outbox_table": "bench_outbox",
            "topic_template": topic_prefix + ".{aggregate_type}",
            "cdc_mark_published": mark,
        }
    return {
        "outboxes": [
            {
                "table": f"bench_outbox_{n + 1}",
                "topic_template": relay_rounds.topic_template(topic_prefix, n, outboxes),
                "cdc_mark_published": mark,
            }
            for n in range(outboxes)
        ]
    }


def write(settings: Settings, events: int, writers: int, txn_size: int) -> workload.WriteReport:
    """``events`` in ``txn_size``-row transactions, spread evenly over the outbox tables, all
    written at once (each table by ``writers`` / tables writers of its own, at least one)."""
    tables = settings.outbox_settings()
    columns = settings.column_names()
    dsn = settings.postgres_dsn()
    shares = [events // len(tables) + (n < events % len(tables)) for n in range(len(tables))]
    reports: list[workload.WriteReport] = []
    errors: list[BaseException] = []
    workload.prepare(dsn)  # the business table, once (not by three writers at the same time)

    def one(table: str, share: int) -> None:
        spec = workload.WorkloadSpec(
            events=share, writers=max(1, writers // len(tables)), txn_sizes=(txn_size,)
        )
        try:
            reports.append(workload.write_orders(dsn, spec, table=table, columns=columns))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [
        threading.Thread(target=one, args=(o.table, share))
        for o, share in zip(tables, shares, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    total = workload.WriteReport()
    for r in reports:
        total.committed += r.committed
        total.transactions += r.transactions
        total.rolled_back_ids += r.rolled_back_ids
    return total


class _WarmupListener:
    """Outcome of the warm-up record."""

    def delivered(self, topic: str, headers: object) -> None:
        pass

    def failed(self, failure: object) -> None:
        raise RuntimeError(f"warm-up record failed: {failure}")


def _machine() -> str:
    import os
    import platform

    py = platform.python_version()
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, Python {py}"
