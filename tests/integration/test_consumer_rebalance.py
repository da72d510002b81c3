"""Rebalances: a second member joins mid-stream, then the first stops (SIGTERM path). What a
member finished is committed before its partitions are revoked, so the next owner starts
right after it: no event is applied twice and none is even read twice, order per key kept."""

from __future__ import annotations

import uuid
from collections import defaultdict

import psycopg
from psycopg_pool import ConnectionPool

from cdc_outbox.consumer import ConsumerSettings, IdempotentConsumer
from cdc_outbox_dev.sandbox.kafka import LocalKafka
from tests.support.consumer import (
    APPLIED_DDL,
    OutboxEvent,
    applied_rows,
    count_rows,
    produce_events,
)
from tests.support.consumer_handlers import count
from tests.support.helpers import create_topic, wait_until
from tests.support.relay import running

EVENTS = 6_000
KEYS = 120


def test_rebalances_commit_finished_work_before_partitions_move(
    pg_dsn: str, kafka_broker: LocalKafka, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"{kafka_topic_prefix}.event.counter"
    create_topic(bootstrap, topic, partitions=6)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(APPLIED_DDL)
    next_n: dict[str, int] = defaultdict(int)
    events = []
    for i in range(EVENTS):
        key = f"k-{i % KEYS}"
        next_n[key] += 1
        events.append(OutboxEvent(uuid.uuid4(), key, next_n[key]))
    phases = [events[:3_000], events[3_000:5_000], events[5_000:]]

    def settings() -> ConsumerSettings:
        # A long commit interval: the periodic commit happens once, at start; only the
        # commits on revocation and on close can explain a hand-over without re-reads.
        return ConsumerSettings(
            consumer_name="rebalance", group_id=f"{kafka_topic_prefix}-g", topics=(topic,),
            bootstrap_servers=bootstrap, poll_batch=50, commit_interval_s=60,
        )  # fmt: skip

    def applied(n: int) -> bool:
        return count_rows(pg_dsn, "applied") >= n

    with ConnectionPool(pg_dsn, min_size=1, max_size=4) as pool:
        first = IdempotentConsumer(settings(), pool, count)
        second = IdempotentConsumer(settings(), pool, count)
        with running(first):
            produce_events(bootstrap, topic, phases[0])
            wait_until(lambda: applied(3_000), timeout=60, interval=0.1)
            with running(second):  # joins: first's 6 partitions are split
                wait_until(lambda: len(first.assignment) == len(second.assignment) == 3,
                           timeout=60)  # fmt: skip
                produce_events(bootstrap, topic, phases[1])
                wait_until(lambda: applied(5_000), timeout=60, interval=0.1)
                first.request_stop()  # leaves the group: second takes every partition
                wait_until(lambda: len(second.assignment) == 6, timeout=60)
                produce_events(bootstrap, topic, phases[2])
                wait_until(lambda: applied(EVENTS), timeout=60, interval=0.1)

                def lags() -> list[float | None]:
                    registry = second.metrics.registry
                    return [
                        registry.get_sample_value(
                            "cdc_outbox_consumer_lag",
                            {"consumer": "rebalance", "topic": topic, "partition": str(p)},
                        )
                        for p in range(6)
                    ]

                # The lag gauge (sampled every 5 s) covers every partition and reaches 0.
                wait_until(lambda: lags() == [0.0] * 6, timeout=20, message=lambda: str(lags()))
    a, b = first.metrics.counts, second.metrics.counts
    assert a["processed"] > 3_000 and b["processed"] > 1_000
    assert a["processed"] + b["processed"] == EVENTS
    assert a["duplicate"] + b["duplicate"] == 0  # nothing was even read twice
    rows = applied_rows(pg_dsn)
    assert len(rows) == EVENTS == len({eid for _s, eid, _a, _n in rows})
    order: dict[str, list[int]] = defaultdict(list)
    for _seq, _eid, key, n in rows:
        order[key].append(n)
    assert all(ns == list(range(1, len(ns) + 1)) for ns in order.values())
