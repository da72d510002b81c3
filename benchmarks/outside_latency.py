"""Latency measured from outside the relay (issue 38 items 4 and 5), per event:

- from the writer's commit: the commit timestamp of the event's business row (the workload
  writes ``demo_orders.id`` = the event id in the same transaction; that row is never updated,
  so its ``xmin`` is the writer's transaction: ``pg_xact_commit_timestamp``, which needs
  ``track_commit_timestamp = on``, as :func:`benchmarks.relay_bench.services` starts the
  server);
- to visible: when a ``read_committed`` consumer of the relay's topics received the record
  (:class:`benchmarks.relay_process.VisibleCounter` with ``keep_ids``);
- or to applied: the commit timestamp of the event's ``processed_events`` row, written by
  ``cdc-outbox consume`` (its own process, de-duplication on) in the transaction that ran the
  handler (:func:`consumer`).

The floor (:mod:`benchmarks.latency_floor`) starts from the same commit timestamp.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.costs import percentile
from benchmarks.relay_process import RelayProcess, settings_values
from cdc_outbox.config.settings import Settings
from cdc_outbox.store.processed_events import PROCESSED_EVENTS_TABLE
from cdc_outbox_dev.workload import BUSINESS_TABLE

#: The PostgreSQL setting the commit timestamps need.
SERVER_SETTINGS = {"track_commit_timestamp": "on"}


def commit_times(dsn: str, ids: list[str]) -> dict[str, float]:
    """The writer's commit time (Unix seconds) of each event id's transaction."""
    query = sql.SQL(
        "SELECT id::text, extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8"
        " FROM {} WHERE id = ANY(%s::uuid[])"
    ).format(sql.Identifier(BUSINESS_TABLE))
    with psycopg.connect(dsn) as conn:
        return {str(i): float(t) for i, t in conn.execute(query, (ids,)) if t is not None}


def applied_times(dsn: str, consumer_name: str) -> dict[str, float]:
    """When ``consumer_name`` committed each event it applied (Unix seconds)."""
    query = sql.SQL(
        "SELECT event_id::text, extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8"
        " FROM {} WHERE consumer_name = %s"
    ).format(sql.Identifier(PROCESSED_EVENTS_TABLE))
    with psycopg.connect(dsn) as conn:
        return {str(i): float(t) for i, t in conn.execute(query, (consumer_name,))}


def applied_count(dsn: str, consumer_name: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {} WHERE consumer_name = %s").format(
        sql.Identifier(PROCESSED_EVENTS_TABLE)
    )
    try:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(query, (consumer_name,)).fetchone()
    except psycopg.errors.UndefinedTable:  # the consumer has not created it yet
        return 0
    return int(row[0]) if row else 0


def quantiles(start: Mapping[str, float], end: Mapping[str, float], since: float) -> dict[str, Any]:
    """Per event committed at ``since`` or later and seen at both ends: p50/p95/p99/max of
    ``end - start`` in ms, and how many events that is."""
    ms = [((end[i] - t) * 1000.0, 1) for i, t in start.items() if t >= since and i in end]
    if not ms:
        raise RuntimeError("no event was seen at both ends")
    return {
        "p50": round(percentile(ms, 0.50), 1),
        "p95": round(percentile(ms, 0.95), 1),
        "p99": round(percentile(ms, 0.99), 1),
        "max": round(max(v for v, _ in ms), 1),
        "events": len(ms),
    }


def create_empty_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> None:
    """Create ``topic`` (the broker's default partitions) with no record in it, for a phase
    whose consumer reads from the beginning; wait until every partition has a leader."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic)])[topic].result(timeout)
    deadline = time.monotonic() + timeout
    while True:
        meta = admin.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta and meta.partitions and all(p.leader >= 0 for p in meta.partitions.values()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic}: no leader after {timeout}s")
        time.sleep(0.05)


def consumer(settings: Settings, topics: list[str], name: str, log: Path) -> RelayProcess:
    """``cdc-outbox consume`` of ``topics`` (from their beginning: a new group), de-duplication
    on, the no-op handler, as group and consumer ``name`` (not started)."""
    command = ["consume", "--handler", "benchmarks.relay_process:noop_handler"]
    for topic in topics:
        command += ["--topic", topic]
    command += ["--group", name, "--consumer-name", name]
    return RelayProcess(settings_values(settings), log, command=tuple(command))
