"""The idempotent consumer as a real process, killed with SIGKILL at random points and stopped
once with SIGTERM mid-stream, fed with re-produced (duplicate) records: every event is applied
exactly once, in order per key."""

from __future__ import annotations

import random
import uuid
from collections import defaultdict

import psycopg
import pytest

from cdc_outbox_dev.sandbox.kafka import LocalKafka
from tests.support.consumer import (
    APPLIED_DDL,
    ConsumerProcess,
    OutboxEvent,
    applied_rows,
    count_rows,
    produce_events,
    wait_processed,
)
from tests.support.helpers import create_topic, wait_until

EVENTS = 20_000
DUPLICATES = 3_000
AGGREGATES = 250
KILLS = 3
#: A restarted consumer rejoins at once: static membership (same group.instance.id).
FAST_REJOIN = ("--kafka-config", "group.instance.id=crash-test-1",
               "--kafka-config", "session.timeout.ms=6000")  # fmt: skip


def _workload(rng: random.Random) -> tuple[list[OutboxEvent], list[OutboxEvent]]:
    """(the distinct events in commit order, what goes into the topic: with duplicates, each
    re-produced at a random later position than its original)."""
    next_n: dict[str, int] = defaultdict(int)
    events = []
    for _ in range(EVENTS):
        agg = f"agg-{rng.randrange(AGGREGATES)}"
        next_n[agg] += 1
        events.append(OutboxEvent(uuid.uuid4(), agg, next_n[agg]))
    stream: list[OutboxEvent | None] = list(events)
    for index in sorted(rng.sample(range(EVENTS), DUPLICATES), reverse=True):
        stream.insert(rng.randrange(index + 1, len(stream) + 1), events[index])
    return events, [e for e in stream if e is not None]


@pytest.mark.slow
def test_kill9_and_duplicates_apply_every_event_once_in_key_order(
    pg_dsn: str, kafka_broker: LocalKafka, kafka_topic_prefix: str
) -> None:
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    topic = f"{kafka_topic_prefix}.event.counter"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=3)
    events, stream = _workload(rng)
    assert len(stream) == EVENTS + DUPLICATES
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(APPLIED_DDL)
    produce_events(kafka_broker.bootstrap_servers, topic, stream)

    consumer = ConsumerProcess(
        f"consumer-crash-{kafka_topic_prefix}", pg_dsn, kafka_broker.bootstrap_servers,
        "--handler", "tests.support.consumer_handlers:count", "--topic", topic,
        "--group", f"{kafka_topic_prefix}-g", *FAST_REJOIN,
    )  # fmt: skip
    kill_points = sorted(rng.sample(range(1_000, EVENTS - 6_000), KILLS))
    try:
        consumer.start()
        for point in kill_points:
            wait_until(
                lambda p=point: count_rows(pg_dsn, "applied") >= p,  # type: ignore[misc]
                timeout=120,
                interval=0.2,
                message=lambda: f"seed {seed}: {consumer.log_tail()}",
            )
            consumer.kill()
            consumer.start()
        # And one graceful stop mid-stream: SIGTERM finishes the batch, commits, exits 0.
        started_at = count_rows(pg_dsn, "applied")
        wait_until(lambda: count_rows(pg_dsn, "applied") > started_at, timeout=60, interval=0.1)
        assert consumer.terminate() == 0, consumer.log_tail()
        assert count_rows(pg_dsn, "applied") < EVENTS  # it really stopped mid-stream
        consumer.start()
        wait_processed(pg_dsn, EVENTS, 180, lambda: f"seed {seed}: {consumer.log_tail()}")
        assert consumer.terminate() == 0, consumer.log_tail()
    finally:
        consumer.stop_quietly()

    rows = applied_rows(pg_dsn)
    applied_ids = [eid for _seq, eid, _agg, _n in rows]
    twice = len(applied_ids) - len(set(applied_ids))
    missing = {str(e.event_id) for e in events} - set(applied_ids)
    assert (len(missing), twice) == (0, 0), f"seed {seed}: missing/applied twice"
    assert len(rows) == EVENTS
    order: dict[str, list[int]] = defaultdict(list)
    for _seq, _eid, agg, n in rows:
        order[agg].append(n)
    out_of_order = [agg for agg, ns in order.items() if ns != list(range(1, len(ns) + 1))]
    assert out_of_order == [], f"seed {seed}: applied out of order for {out_of_order[:5]}"
    assert count_rows(pg_dsn, "processed_events") == EVENTS
    assert count_rows(pg_dsn, "consumer_parked_keys") == 0
