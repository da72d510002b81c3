"""The cache-invalidation example end to end: orders written with the outbox writer, the
relay (a real process) publishing them, ``cdc-outbox consume`` refreshing Redis, readers
going through the cache-aside read path - with the relay and the consumer killed mid-burst."""

from __future__ import annotations

import random
import threading

import psycopg
import redis

from cdc_outbox_dev.sandbox.kafka import LocalKafka
from examples.cache_invalidation.cache import OrderCache
from examples.cache_invalidation.orders import ORDERS_DDL, create_order, load_order, update_order
from tests.support.consumer import ConsumerProcess, count_rows, wait_processed
from tests.support.helpers import create_topic, wait_until
from tests.support.relay import init_outbox, relay_settings
from tests.support.relay_process import RelayProcess

ORDERS = 40
UPDATES = 1_500


def _orders(dsn: str) -> dict[str, dict[str, object]]:
    with psycopg.connect(dsn) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM orders")]
        return {i: row for i in ids if (row := load_order(conn, i)) is not None}


def test_cache_equals_database_after_burst_with_relay_and_consumer_kills(
    pg_dsn: str, kafka_broker: LocalKafka, redis_url: str, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    settings = relay_settings(pg_dsn, bootstrap, kafka_topic_prefix)
    init_outbox(settings)
    # Created up front, as a deployment would: a ^regex subscription only notices a topic
    # created later at its next metadata refresh (topic.metadata.refresh.interval.ms, 10 s).
    create_topic(bootstrap, f"{kafka_topic_prefix}.event.order", partitions=3)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(ORDERS_DDL)
    rng = random.Random()
    order_ids = [f"o-{i}" for i in range(ORDERS)]
    relay = RelayProcess(settings, f"cache-relay-{kafka_topic_prefix}")
    consumer = ConsumerProcess(
        f"cache-consumer-{kafka_topic_prefix}", pg_dsn, bootstrap,
        "--handler", "examples.cache_invalidation.consumer:handle", "--group", "order-cache",
        "--kafka-config", "group.instance.id=order-cache-1",
        "--kafka-config", "session.timeout.ms=6000",
        # The default subscription follows the relay's topic_template.
        env={"ORDERS_REDIS_URL": redis_url,
             "CDC_OUTBOX_TOPIC_TEMPLATE": settings.topic_template},
    )  # fmt: skip
    stop_readers = threading.Event()
    reads = [0]

    def reader() -> None:  # cache-aside reads racing the writers and the consumer
        with psycopg.connect(pg_dsn) as conn, redis.Redis.from_url(redis_url) as client:
            cache = OrderCache(client)
            while not stop_readers.is_set():
                cache.get(conn, rng.choice(order_ids))
                if rng.random() < 0.1:  # evictions make readers fill the cache again
                    client.delete(f"order:{rng.choice(order_ids)}")
                reads[0] += 1

    readers = [threading.Thread(target=reader, daemon=True) for _ in range(2)]
    try:
        relay.start()
        consumer.start()
        with psycopg.connect(pg_dsn) as conn:
            for oid in order_ids:
                create_order(conn, oid, f"customer-{oid}", 1_000)
                conn.commit()
            for t in readers:
                t.start()
            for i in range(UPDATES):
                oid = rng.choice(order_ids)
                status = rng.choice(["NEW", "PAID", "PACKED", "SHIPPED"])
                update_order(conn, oid, status=status, total_cents=rng.randrange(100, 100_000))
                conn.commit()
                if i == UPDATES // 3:
                    relay.kill()
                    relay.start()
                if i == 2 * UPDATES // 3:
                    wait_until(lambda: count_rows(pg_dsn, "processed_events") > 0, timeout=60,
                               message=consumer.log_tail)  # fmt: skip
                    consumer.kill()
                    consumer.start()
        # Readers stop with the writers: what they cached during the burst is mostly older
        # than the last updates; from here on only the consumer can bring the cache up to date.
        stop_readers.set()
        for t in readers:
            t.join(30)
        events = ORDERS + UPDATES
        wait_processed(
            pg_dsn,
            events,
            120,
            lambda: f"\nrelay: {relay.log_tail(1500)}\nconsumer: {consumer.log_tail(1500)}",
        )
        assert consumer.terminate() == 0, consumer.log_tail()
    finally:
        stop_readers.set()
        consumer.stop_quietly()
        relay.stop_quietly()

    assert count_rows(pg_dsn, "processed_events") == ORDERS + UPDATES
    assert reads[0] > 100  # the readers really raced the consumer
    database = _orders(pg_dsn)
    with redis.Redis.from_url(redis_url) as client, psycopg.connect(pg_dsn) as conn:
        cache = OrderCache(client)
        cached = {oid: cache.cached(oid) for oid in order_ids}
        wrong = {o: (c, database[o]) for o, c in cached.items() if c not in (None, database[o])}
        assert wrong == {}
        assert sum(c is not None for c in cached.values()) > 0
        stale_reads = [o for o in order_ids for _ in range(3) if cache.get(conn, o) != database[o]]
    assert stale_reads == []
