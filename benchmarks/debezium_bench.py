"""cdc-outbox vs Debezium (Kafka Connect + outbox EventRouter), same server, broker, table.

Each system is a process of its own: cdc-outbox is ``python -m cdc_outbox --config FILE run``
(:func:`debezium_setup.relay_toml`), Debezium a standalone Kafka Connect worker
(:class:`~cdc_outbox_dev.sandbox.kafka_connect.LocalConnect`), once with Debezium's defaults and
once tuned (:data:`debezium_setup.VARIANTS`). They read one outbox table (the ``debezium``
layout) from slots of their own and write topics of their own, created beforehand with
``message.timestamp.type=LogAppendTime``: a record's timestamp is the moment the broker
appended it, i.e. acknowledged it (one replica). With ``track_commit_timestamp`` each event's
commit time is ``pg_xact_commit_timestamp(xmin)``: every figure below is read from the two
servers' clocks (one machine), none from inside the systems measured.

- cold: ``--events`` committed (one server-side burst of ``--txn-size``-row transactions,
  :func:`debezium_setup.burst_sql`) with every system's slot already there; then each
  system starts and drains them. ``events_per_s``: from process start to the last append
  (:func:`debezium_report.cold_result`).
- warm: the system runs, has relayed ``--warmup-events`` and is idle; it is paused
  (``SIGSTOP``) while the same burst commits, then resumed. ``events_per_s``: events / (last
  append - resume).
- latency: paced writers (:mod:`cdc_outbox_dev.workload`) at 20 transactions/s x 100 rows and
  at 2,000 single-row transactions/s, ``--latency-warmup-seconds`` unmeasured, then
  ``--latency-seconds``; per event, append - commit.
- floor: once per round, after the systems, PostgreSQL alone at 20 x 100 (the same writers and
  table; a raw drain reads the slot): commit -> Commit received (:mod:`benchmarks.debezium_floor`).
  No system can publish a transaction earlier; a system's p99 minus this is what it adds.
- cost: user + sys CPU seconds of the system's process tree (``/proc``) over each phase, and
  its peak RSS (``VmHWM``, summed over the tree).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from psycopg import sql

from benchmarks import debezium_floor, debezium_report, debezium_setup, output
from benchmarks.cpu import tree_cpu
from benchmarks.debezium_readers import (
    PUBLICATION,
    ROOT,
    SYSTEMS,
    TABLE,
    Context,
    Reader,
    peak_rss_mb,
    start,
)
from cdc_outbox.store.schema import (
    outbox_table_ddl,
    publication_ddl,
)
from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import read_topics
from cdc_outbox_dev.sandbox import _proc
from cdc_outbox_dev.sandbox.kafka import LocalKafka
from cdc_outbox_dev.sandbox.postgres import LocalPostgres

#: aggregate types (topic suffixes) of the phases; none is a prefix of another
COLD, IDLE, WARM = "cold", "idle", "burst"
LATENCIES = {"latency_20x100": (20.0, 100), "latency_2000x1": (2000.0, 1)}
#: a latency phase's aggregate type, + "w" (its warm-up) or "m" (measured)
_LAT = [name.replace("latency_", "lat") for name in LATENCIES]


class Topics:
    """The benchmark's topics (``LogAppendTime``) and their record counts."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._admin = AdminClient({"bootstrap.servers": bootstrap})
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "dbz-counter"})

    def create(self, names: list[str]) -> None:
        config = {"message.timestamp.type": "LogAppendTime"}
        futures = self._admin.create_topics([NewTopic(n, 3, 1, config=config) for n in names])
        for future in futures.values():
            future.result(30)
        for name in names:
            self._until_led(name)
            self.count(name)

    def _until_led(self, topic: str, timeout: float = 60.0) -> None:
        """Until the broker's metadata gives each of ``topic``'s partitions a leader."""
        deadline = time.monotonic() + timeout
        while True:
            meta = self._admin.list_topics(topic, timeout=10).topics.get(topic)
            parts = meta.partitions if meta is not None and meta.error is None else {}
            if len(parts) == 3 and all(p.leader >= 0 and p.error is None for p in parts.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"no leaders for {topic} in {timeout:g} s: {meta}")
            time.sleep(0.1)

    def count(self, topic: str, timeout: float = 60.0) -> int:
        """Records in ``topic`` (high minus low watermark over its 3 partitions)."""
        total = 0
        for partition in range(3):
            deadline = time.monotonic() + timeout
            while True:
                try:
                    low, high = self._consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=10
                    )
                except Exception as exc:  # a leader moving, its metadata not in yet
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"no watermarks for {topic}[{partition}]: {exc}"
                        ) from exc
                    time.sleep(0.1)
                    continue
                total += high - low
                break
        return int(total)

    def wait(self, topic: str, events: int, reader: Reader, timeout: float) -> None:
        """Until ``topic`` holds ``events`` records; raises if ``reader`` exits first."""
        deadline = time.monotonic() + timeout
        while (n := self.count(topic)) < events:
            if not _proc.pid_alive(reader.pid):
                raise RuntimeError(
                    f"{topic}: the reader exited with {n}/{events} records; its log ends:\n"
                    + _proc.tail(reader.log)
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: {n}/{events} records after {timeout:.0f} s")
            time.sleep(0.05)

    def appends(self, topic: str) -> list[tuple[str, int]]:
        """``(id header, append ms)`` of every record of ``topic``."""
        out = []
        for rec in read_topics(self.bootstrap, topic, timeout=120):
            ident = next((v.decode() for k, v in rec.headers if k == "id"), "")
            out.append((ident, rec.timestamp_ms))
        return out

    def close(self) -> None:
        self._consumer.close()
        del self._admin  # its connections end now, not after the broker stopped


def commit_ms(dsn: str, aggregate_type: str) -> dict[str, float]:
    """Each event's commit time (ms since the epoch) by event id."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT id::text, extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000"
                " FROM {} WHERE aggregatetype = %s"
            ).format(sql.Identifier(TABLE)),
            (aggregate_type,),
        ).fetchall()
    return {ident: float(ms) for ident, ms in rows}


def burst(dsn: str, aggregate_type: str, events: int, txn_size: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute(debezium_setup.burst_sql(TABLE, aggregate_type, events, txn_size))


def create_slot(dsn: str, slot: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        drop_slot(conn, slot)
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


@contextlib.contextmanager
def emptied_with_slot(dsn: str, slot: str) -> Iterator[None]:
    """The outbox table emptied, then ``slot`` made (it reads from there on); the slot is
    dropped on the way out."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(TABLE)))
    create_slot(dsn, slot)
    try:
        yield
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            drop_slot(conn, slot)


def drop_slot(conn: psycopg.Connection[Any], slot: str) -> None:
    """Drop ``slot`` once no walsender holds it (a stopped reader's may take a moment)."""

    def held() -> bool:
        row = conn.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
        return bool(row and row[0])

    _proc.wait_for(lambda: not held(), 60, f"slot {slot} to be released", interval=0.1)
    conn.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    )


def prepare(ctx: Context) -> None:
    """Fresh outbox table (debezium layout) and publication; the business table."""
    settings = ctx.settings("cdc_outbox", "unused")
    with psycopg.connect(ctx.dsn, autocommit=True) as conn:
        row = conn.execute("SHOW track_commit_timestamp").fetchone()
        if row is None or row[0] != "on":
            raise RuntimeError("the server needs track_commit_timestamp = on")
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(TABLE)))
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(PUBLICATION)))
        for stmt in outbox_table_ddl(settings):
            conn.execute(stmt)
        conn.execute(publication_ddl(settings))
    workload.prepare(ctx.dsn)


def cold(ctx: Context, topics: Topics, args: argparse.Namespace) -> dict[str, Any]:
    """Every system drains the same committed backlog, started after it."""
    slots = {s: f"dbz_cold_{s}" for s in SYSTEMS}
    for slot in slots.values():
        create_slot(ctx.dsn, slot)
    burst(ctx.dsn, COLD, args.events, args.txn_size)
    out: dict[str, Any] = {}
    for system, slot in slots.items():
        print(f"-- {system}: cold drain of {args.events:,} events ({_load()})", flush=True)
        topic = f"{ctx.prefix(system)}.{COLD}"
        t0 = time.time()
        reader = start(ctx, system, slot, f"{system}-cold")
        try:
            topics.wait(topic, args.events, reader, args.timeout)
            cpu, rss = tree_cpu(reader.pid), peak_rss_mb(reader.pid)
        finally:
            reader.stop()
        stamps = [ms for _, ms in topics.appends(topic)]
        out[system] = debezium_report.cold_result(t0, args.events, stamps, cpu) | {
            "peak_rss_mb": rss,
            "load": _load(),
        }
        with psycopg.connect(ctx.dsn, autocommit=True) as conn:
            drop_slot(conn, slot)
    return out


def running(ctx: Context, topics: Topics, system: str, args: argparse.Namespace) -> dict[str, Any]:
    """One process of ``system`` over the emptied table: warm-up, idle, the warm burst, then
    the latency phases."""
    slot = f"dbz_run_{system}"
    with emptied_with_slot(ctx.dsn, slot):  # each system's table starts empty
        reader = start(ctx, system, slot, f"{system}-run")
        try:
            return _phases(ctx, topics, system, reader, args)
        finally:
            reader.stop()


def _phases(
    ctx: Context, topics: Topics, system: str, reader: Reader, args: argparse.Namespace
) -> dict[str, Any]:
    """:func:`running`'s phases, with ``system``'s ``reader`` started."""
    prefix = ctx.prefix(system)
    out: dict[str, Any] = {"load": [_load()]}
    burst(ctx.dsn, IDLE, args.warmup_events, args.txn_size)
    topics.wait(f"{prefix}.{IDLE}", args.warmup_events, reader, args.timeout)
    time.sleep(args.idle_seconds)  # idle, by definition of the phase
    print(f"-- {system}: warm drain of {args.events:,} events ({_load()})", flush=True)
    # Paused while the burst commits, so that the commits' pace (which follows the load
    # of the machine) does not bound the figure: resumed, it finds every event committed.
    _proc.signal_group(reader.pid, signal.SIGSTOP)
    try:
        burst(ctx.dsn, WARM, args.events, args.txn_size)
    finally:
        cpu0, resumed = tree_cpu(reader.pid), time.time()
        _proc.signal_group(reader.pid, signal.SIGCONT)
    topics.wait(f"{prefix}.{WARM}", args.events, reader, args.timeout)
    cpu = tree_cpu(reader.pid) - cpu0
    appends = topics.appends(f"{prefix}.{WARM}")
    out["warm"] = debezium_report.warm_result(
        commit_ms(ctx.dsn, WARM), appends, cpu, resumed * 1000
    )
    for name, (rate, size) in LATENCIES.items():
        print(f"-- {system}: {name} ({_load()})", flush=True)
        out[name] = latency(ctx, topics, reader, prefix, name, rate, size, args)
        out["load"].append(_load())
    out["peak_rss_mb"] = peak_rss_mb(reader.pid)
    return out


def latency(
    ctx: Context,
    topics: Topics,
    reader: Reader,
    prefix: str,
    name: str,
    rate_txn: float,
    size: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Paced writers at ``rate_txn`` transactions/s of ``size`` rows: warm-up, then measured."""
    agg = name.replace("latency_", "lat")
    cols = ctx.settings("cdc_outbox", "unused").column_names()

    def spec(seconds: float, aggregate_type: str) -> workload.WorkloadSpec:
        return _paced(rate_txn, size, seconds, aggregate_type, args.writers)

    if args.latency_warmup_seconds > 0:
        warm = spec(args.latency_warmup_seconds, agg + "w")
        workload.write_orders(ctx.dsn, warm, table=TABLE, columns=cols)
        topics.wait(f"{prefix}.{agg}w", warm.events, reader, args.timeout)
    measured = spec(args.latency_seconds, agg + "m")
    cpu0, t0 = tree_cpu(reader.pid), time.perf_counter()
    workload.write_orders(ctx.dsn, measured, table=TABLE, columns=cols)
    offered_s = time.perf_counter() - t0
    topics.wait(f"{prefix}.{agg}m", measured.events, reader, args.timeout)
    elapsed = time.perf_counter() - t0
    cpu = tree_cpu(reader.pid) - cpu0
    result = debezium_report.latencies(
        commit_ms(ctx.dsn, agg + "m"), topics.appends(f"{prefix}.{agg}m")
    )
    result |= {
        "offered_txns_per_s": round(measured.events / size / offered_s, 1),
        "cpu_s": round(cpu, 2),
        "cores_used": round(cpu / elapsed, 3),
    }
    return result


def _paced(
    rate_txn: float, size: int, seconds: float, aggregate_type: str, writers: int
) -> workload.WorkloadSpec:
    """``seconds`` of ``rate_txn`` transactions/s of ``size`` rows from ``writers`` threads."""
    return workload.WorkloadSpec(
        events=int(rate_txn * size * seconds),
        writers=writers,
        txn_sizes=(size,),
        rate=rate_txn * size,
        aggregate_type=aggregate_type,
    )


def floor(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    """PostgreSQL alone at 20 x 100 (:mod:`benchmarks.debezium_floor`), on the emptied table."""
    print(f"-- floor (PostgreSQL alone, a raw drain): latency_20x100 ({_load()})", flush=True)
    slot = "dbz_floor"
    rate_txn, size = LATENCIES["latency_20x100"]
    warm_s = args.latency_warmup_seconds
    with emptied_with_slot(ctx.dsn, slot):
        return debezium_floor.measure(
            ctx.dsn,
            slot,
            PUBLICATION,
            table=TABLE,
            columns=ctx.settings("cdc_outbox", "unused").column_names(),
            spec=_paced(rate_txn, size, args.latency_seconds, "floorm", args.writers),
            warmup=_paced(rate_txn, size, warm_s, "floorw", args.writers) if warm_s > 0 else None,
            txn_size=size,
            timeout=args.timeout,
        ) | {"load": _load()}


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


@contextlib.contextmanager
def servers(dsn: str | None, bootstrap: str | None) -> Iterator[tuple[str, str]]:
    """The given servers, or local throw-away ones (PostgreSQL with commit timestamps)."""
    with contextlib.ExitStack() as stack:
        if dsn is None:
            room = {"track_commit_timestamp": "on", "max_slot_wal_keep_size": "-1"}
            dsn = stack.enter_context(LocalPostgres(settings=room)).dsn
        if bootstrap is None:
            bootstrap = stack.enter_context(LocalKafka()).bootstrap_servers
        yield dsn, bootstrap


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The whole comparison; the result JSON (before :func:`debezium_report.summarize`)."""
    from cdc_outbox_dev.sandbox.kafka_connect import ensure_connect

    ensure_connect()  # fetched before anything is timed
    with servers(args.dsn, args.bootstrap_servers) as (dsn, bootstrap):
        ctx = Context(dsn, bootstrap, workdir, str(int(time.time())))
        prepare(ctx)
        topics = Topics(bootstrap)
        try:
            topics.create([f"{ctx.prefix(s)}.{COLD}" for s in SYSTEMS])
            result: dict[str, Any] = {
                "machine": debezium_report.machine(dsn),
                "cold": cold(ctx, topics, args),
                "rounds": [],
                "floors": [],
            }
            for n in range(args.rounds):
                # topics of its own per round; the first system rotates
                rctx = dataclasses.replace(ctx, stamp=f"{ctx.stamp}r{n}")
                aggs = (IDLE, WARM, *(f"{lat}{s}" for lat in _LAT for s in "wm"))
                topics.create([f"{rctx.prefix(s)}.{agg}" for s in SYSTEMS for agg in aggs])
                order = SYSTEMS[n % len(SYSTEMS) :] + SYSTEMS[: n % len(SYSTEMS)]
                done = {s: running(rctx, topics, s, args) for s in order}
                result["rounds"].append({s: done[s] for s in SYSTEMS})
                result["floors"].append(floor(rctx, args))
            result["running"] = debezium_report.median_tree(result["rounds"])
            result["floor"] = debezium_report.median_tree(result["floors"])
        finally:
            topics.close()
    return result


def main(argv: list[str]) -> int:
    """``python -m benchmarks debezium [options]``."""
    parser = output.parser("debezium", debezium_report.DESCRIPTION)
    parser.add_argument("--events", type=int, default=100_000, help="cold and warm drains")
    parser.add_argument("--txn-size", type=int, default=100, help="rows per drained transaction")
    parser.add_argument("--warmup-events", type=int, default=20_000)
    parser.add_argument("--idle-seconds", type=float, default=2.0)
    parser.add_argument("--latency-seconds", type=float, default=30.0)
    parser.add_argument("--latency-warmup-seconds", type=float, default=5.0)
    parser.add_argument("--writers", type=int, default=8, help="paced writer threads")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of the running phases (warm drain, latencies) of every system, the first"
        " system rotating; each figure is the median of the rounds",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="per wait, seconds")
    parser.add_argument("--dsn", help="PostgreSQL (track_commit_timestamp = on); default: local")
    parser.add_argument("--bootstrap-servers", help="Kafka (default: start a local broker)")
    args = parser.parse_args(argv)
    if min(args.events, args.txn_size, args.warmup_events, args.latency_seconds, args.rounds) <= 0:
        parser.error(
            "--events, --txn-size, --warmup-events, --latency-seconds, --rounds must be positive"
        )
    with tempfile.TemporaryDirectory(prefix="cdc-outbox-dbz-") as workdir:
        result = run(args, Path(workdir))
    result["params"] = {k: v for k, v in vars(args).items() if k not in ("json", "write_results")}
    result["settings"] = {
        "debezium_defaults": debezium_setup.DEFAULTS,
        "debezium_tuned": debezium_setup.TUNED,
    }
    result["summary"] = debezium_report.summarize(result)
    print(debezium_report.table(result))
    output.save("debezium", result, args)
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    row = debezium_report.results_row(result, head or "?")
    if args.write_results:
        debezium_report.write_results_row(output.HERE / "RESULTS.md", row)
        print(f"wrote its row of {output.HERE / 'RESULTS.md'}")
    else:
        print(row)
    return 0
