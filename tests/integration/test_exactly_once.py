"""Exactly-once delivery (issue 9): real PostgreSQL + Kafka, kill -9, restarts, zombies."""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from cdc_outbox.kafka import checkpoints
from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import read_topics
from tests.helpers import wait_until
from tests.relay_support import (
    RelayProcess,
    current_wal_lsn,
    init_outbox,
    relay_settings,
    relay_thread,
    slot_position,
)

COMMITTED = {"isolation.level": "read_committed"}
UNCOMMITTED = {"isolation.level": "read_uncommitted"}


def eos_settings(pg_dsn: str, kafka_broker: Any, prefix: str, **overrides: Any) -> Any:
    return relay_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        prefix,
        delivery="exactly_once",
        eos={"checkpoint_topic": f"{prefix}.checkpoints"},
        **overrides,
    )


def _writer(dsn: str, settings: Any, spec: workload.WorkloadSpec) -> threading.Thread:
    thread = threading.Thread(
        target=workload.write_orders,
        args=(dsn, spec),
        kwargs={"columns": settings.column_names()},
        name="writers",
    )
    thread.start()
    return thread


def _tally(dsn: str, settings: Any, bootstrap: str, prefix: str, config: dict[str, str]) -> Any:
    expected = workload.stored_events(dsn, columns=settings.column_names())
    records = read_topics(bootstrap, f"{prefix}.event.", timeout=120, extra_config=config)
    verdict = workload.tally(expected, records)
    print(f"{config['isolation.level']}: {verdict.summary()}")
    return verdict


def _wait_relayed(dsn: str, settings: Any, relay: RelayProcess | None, timeout: float) -> None:
    done = current_wal_lsn(dsn)
    wait_until(
        lambda: slot_position(dsn, settings.slot_name)[0] >= done,
        timeout=timeout,
        interval=0.2,
        message=lambda: relay.log_tail() if relay else "",
    )


def test_streaming_in_kafka_transactions_with_checkpoints(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """The basic path: events committed in Kafka transactions, checkpoint = slot position."""
    settings = eos_settings(pg_dsn, kafka_broker, kafka_topic_prefix)
    init_outbox(settings)
    spec = workload.WorkloadSpec(events=2_000, writers=2, aggregates=40, txn_sizes=(1, 10, 100))
    with relay_thread(settings) as relay:
        _writer(pg_dsn, settings, spec).join()
        _wait_relayed(pg_dsn, settings, None, 60)
        assert relay.stats.eos_commits > 0
        assert relay.stats.delivery_guarantee == "exactly_once"
        assert relay.eos is not None
        key = checkpoints.checkpoint_key(
            relay.eos.system_id, relay.eos.database, settings.slot_name
        )
    config = settings.kafka_config()
    last = checkpoints.read_last(config, settings.eos.checkpoint_topic, key)
    assert last is not None and last.end_lsn >= 1
    confirmed, _ = slot_position(pg_dsn, settings.slot_name)
    assert int(confirmed) >= last.end_lsn  # the slot is confirmed up to the Kafka commit
    bootstrap = kafka_broker.bootstrap_servers
    verdict = _tally(pg_dsn, settings, bootstrap, kafka_topic_prefix, COMMITTED)
    assert verdict.ok and verdict.duplicates == 0 and verdict.expected == 2_000


def test_kill_9_at_random_points_and_in_commit_exactly_once(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """kill -9 at 10 random points under a 4-writer load (mixed transaction sizes), plus named
    crash points in the Kafka commit (records written, commit not sent) and between the Kafka
    commit and the slot confirmation: read_committed sees every event exactly once, in
    per-aggregate order; read_uncommitted sees the aborted records too."""
    settings = eos_settings(pg_dsn, kafka_broker, kafka_topic_prefix, mode="cdc")
    init_outbox(settings)
    spec = workload.WorkloadSpec(
        events=20_000, writers=4, aggregates=200, txn_sizes=(1, 5, 50, 200), rate=1_200
    )
    rng = random.Random(9)
    writers = _writer(pg_dsn, settings, spec)
    plan: list[str | float] = [rng.uniform(0.3, 2.5) for _ in range(10)]
    plan.insert(3, "eos.in_kafka_commit")
    plan.insert(7, "eos.after_kafka_commit")
    relay: RelayProcess | None = None
    crashed: list[str] = []
    try:
        for i, step in enumerate(plan):
            if isinstance(step, str):
                relay = RelayProcess(settings, f"eos-kill-{i}", CDC_OUTBOX_CRASH_AT=step)
                relay.start()
                assert relay.wait(90) == -signal.SIGKILL, relay.log_tail()
                assert f"crash point {step}" in relay.log_tail(20_000)
                crashed.append(step)
            else:
                relay = RelayProcess(settings, f"eos-kill-{i}")
                relay.start()
                time.sleep(step)  # a random point: starting, catching up or streaming
                relay.kill()
        writers.join()
        relay = RelayProcess(settings, "eos-kill-final")
        relay.start()
        _wait_relayed(pg_dsn, settings, relay, 180)
    finally:
        if relay is not None:
            relay.stop_quietly()
    assert crashed == ["eos.in_kafka_commit", "eos.after_kafka_commit"]
    bootstrap = kafka_broker.bootstrap_servers
    committed = _tally(pg_dsn, settings, bootstrap, kafka_topic_prefix, COMMITTED)
    assert committed.ok, committed.summary()
    assert committed.expected == 20_000
    assert committed.duplicates == 0 and committed.received == 20_000
    uncommitted = _tally(pg_dsn, settings, bootstrap, kafka_topic_prefix, UNCOMMITTED)
    assert not uncommitted.missing
    assert uncommitted.received > committed.received  # aborted records are in the log
