"""``cdc-outbox consume`` (the idempotent consumer, a real process) against the three-node
cluster: a partition leader killed mid-stream, and a rolling restart of all three nodes,
with events produced (acks=all) before and during each fault. Every event must be applied
exactly once, in order per key, and the consumer must still run."""

from __future__ import annotations

import uuid
from collections import defaultdict

import psycopg

from cdc_outbox_dev.sandbox.kafka_cluster import LocalKafkaCluster
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

BATCH = 1_500  # events produced before the consumer starts and at each step of a fault
AGGREGATES = 60


def _events(count: int) -> list[OutboxEvent]:
    """``count`` events over ``AGGREGATES`` keys, numbered 1, 2, ... per key in order."""
    next_n: dict[str, int] = defaultdict(int)
    events = []
    for i in range(count):
        agg = f"agg-{i % AGGREGATES}"
        next_n[agg] += 1
        events.append(OutboxEvent(uuid.uuid4(), agg, next_n[agg]))
    return events


class _Feed:
    """The topic, the events still to produce and the consumer process of one test."""

    def __init__(self, dsn: str, cluster: LocalKafkaCluster, prefix: str, batches: int) -> None:
        self.dsn, self.cluster = dsn, cluster
        self.topic = f"{prefix}.event.counter"
        create_topic(cluster.bootstrap_servers, self.topic, partitions=3, replication=3)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(APPLIED_DDL)
        self.events = _events(BATCH * batches)
        self.produced = 0
        self.consumer = ConsumerProcess(
            f"consumer-cluster-{prefix}", dsn, cluster.bootstrap_servers,
            "--handler", "tests.support.consumer_handlers:count", "--topic", self.topic,
            "--group", f"{prefix}-g",
        )  # fmt: skip

    def produce_batch(self) -> None:
        batch = self.events[self.produced : self.produced + BATCH]
        produce_events(self.cluster.bootstrap_servers, self.topic, batch)
        self.produced += len(batch)

    def wait_applied(self, count: int) -> None:
        wait_until(lambda: count_rows(self.dsn, "applied") >= count, timeout=180, interval=0.2,
                   message=self.consumer.log_tail)  # fmt: skip

    def check(self) -> None:
        """Everything produced applied once, in order per key; the consumer still runs."""
        wait_processed(self.dsn, len(self.events), 180, self.consumer.log_tail)
        assert self.consumer.alive, self.consumer.log_tail()
        assert self.consumer.terminate() == 0, self.consumer.log_tail()
        rows = applied_rows(self.dsn)
        applied = [eid for _seq, eid, _agg, _n in rows]
        missing = {str(e.event_id) for e in self.events} - set(applied)
        print(f"{len(self.events)} events: applied {len(applied)}, missing {len(missing)},"
              f" twice {len(applied) - len(set(applied))}")  # fmt: skip
        assert (len(missing), len(applied) - len(set(applied))) == (0, 0)
        order: dict[str, list[int]] = defaultdict(list)
        for _seq, _eid, agg, n in rows:
            order[agg].append(n)
        assert [a for a, ns in order.items() if ns != list(range(1, len(ns) + 1))] == []


def test_consumer_through_a_partition_leader_kill(
    pg_dsn: str, kafka_cluster: LocalKafkaCluster, kafka_topic_prefix: str
) -> None:
    feed = _Feed(pg_dsn, kafka_cluster, kafka_topic_prefix, batches=3)
    feed.produce_batch()
    try:
        feed.consumer.start()
        feed.wait_applied(BATCH // 3)
        leader = kafka_cluster.leader_of(feed.topic, 0)
        kafka_cluster.kill(leader)
        feed.produce_batch()  # to the new leaders
        feed.wait_applied(feed.produced)
        kafka_cluster.start_node(leader)
        feed.produce_batch()
        feed.check()
    finally:
        feed.consumer.stop_quietly()


def test_consumer_through_a_rolling_restart(
    pg_dsn: str, kafka_cluster: LocalKafkaCluster, kafka_topic_prefix: str
) -> None:
    feed = _Feed(pg_dsn, kafka_cluster, kafka_topic_prefix, batches=4)
    feed.produce_batch()
    try:
        feed.consumer.start()
        feed.wait_applied(BATCH // 3)
        for node in sorted(kafka_cluster.nodes):
            kafka_cluster.stop_node(node)
            feed.produce_batch()
            feed.wait_applied(feed.produced)
            kafka_cluster.start_node(node)
            wait_until(kafka_cluster.fully_replicated, timeout=120, interval=0.2)
        feed.check()
    finally:
        feed.consumer.stop_quietly()
