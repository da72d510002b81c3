"""A handler that fails for one event: retried, dead-lettered with the reason, the rest flow,
and later events of the same key are dead-lettered as ``blocked_by`` (also after a restart:
the parked key is persisted in PostgreSQL)."""

from __future__ import annotations

import itertools
import time
import uuid
from collections import defaultdict
from typing import Any

import psycopg
from prometheus_client import generate_latest
from psycopg_pool import ConnectionPool

from cdc_outbox.consumer import ConsumerSettings, Event, IdempotentConsumer
from cdc_outbox_dev.sandbox.kafka import LocalKafka
from tests.support.consumer import OutboxEvent, applied_rows, counter_topics, produce_events
from tests.support.consumer_handlers import count_but_fail_poison
from tests.support.helpers import consume_all, wait_until
from tests.support.relay import running


def _events(keys: list[str], ns: range, poison: set[tuple[str, int]]) -> list[OutboxEvent]:
    return [
        OutboxEvent(uuid.uuid4(), k, n, {"poison": True} if (k, n) in poison else None)
        for n in ns
        for k in keys
    ]


class _TimedPoison:
    """:func:`count_but_fail_poison`, noting when each call for a poison event came."""

    def __init__(self) -> None:
        self.poison_calls: list[float] = []

    def __call__(self, conn: psycopg.Connection[Any], event: Event) -> None:
        if event.payload.get("poison"):
            self.poison_calls.append(time.monotonic())
        count_but_fail_poison(conn, event)


def test_failing_event_is_retried_then_dead_lettered_and_its_key_stays_blocked(
    pg_dsn: str, kafka_broker: LocalKafka, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic, dlq = counter_topics(pg_dsn, bootstrap, kafka_topic_prefix, 2)
    first = _events(["a", "b", "c"], range(1, 6), poison={("b", 2)})
    produce_events(bootstrap, topic, first)
    settings = ConsumerSettings(
        consumer_name="dlq-test", group_id=f"{kafka_topic_prefix}-g", topics=(topic,),
        bootstrap_servers=bootstrap, dead_letter_topic=dlq, max_attempts=3,
        retry_backoff_s=0.05,
    )  # fmt: skip
    with ConnectionPool(pg_dsn, min_size=1, max_size=2) as pool:
        timed = _TimedPoison()
        consumer = IdempotentConsumer(settings, pool, timed)
        with running(consumer):
            wait_until(lambda: consumer.metrics.counts["dead_lettered"] == 4, timeout=60)
            wait_until(lambda: consumer.metrics.counts["processed"] == 11, timeout=30)
        # max_attempts calls in all (the batch's is the first), the gaps at least the
        # doubling delays 0.05 s, 0.1 s (before: 4 calls, the first two back to back).
        gaps = [b - a for a, b in itertools.pairwise(timed.poison_calls)]
        assert len(timed.poison_calls) == 3, gaps
        assert gaps[0] >= 0.05 and gaps[1] >= 0.1, gaps
        assert consumer.metrics.counts == {
            "processed": 11, "duplicate": 0, "dead_lettered": 4, "retried": 2,
        }  # fmt: skip
        scraped = generate_latest(consumer.metrics.registry).decode()
        for line in [
            'cdc_outbox_consumer_processed_total{consumer="dlq-test"} 11.0',
            'cdc_outbox_consumer_retries_total{consumer="dlq-test"} 2.0',
            'cdc_outbox_consumer_dead_lettered_total{consumer="dlq-test",reason="failed"} 1.0',
            'cdc_outbox_consumer_dead_lettered_total{consumer="dlq-test",reason="blocked"} 3.0',
        ]:
            assert line in scraped

        # A restart: the parked key is read back from PostgreSQL.
        second = _events(["a", "b"], range(6, 7), poison=set())
        produce_events(bootstrap, topic, second)
        again = IdempotentConsumer(settings, pool, count_but_fail_poison)
        with running(again):
            wait_until(
                lambda: (
                    again.metrics.counts["processed"] + again.metrics.counts["dead_lettered"] == 2
                ),
                timeout=60,
            )
        assert again.metrics.counts["dead_lettered"] == 1

    applied: dict[str, list[int]] = defaultdict(list)
    for _seq, _eid, agg, n in applied_rows(pg_dsn):
        applied[agg].append(n)
    assert dict(applied) == {"a": [1, 2, 3, 4, 5, 6], "b": [1], "c": [1, 2, 3, 4, 5]}

    poison_id = str(next(e.event_id for e in first if e.extra))
    letters = consume_all(bootstrap, [dlq], expected_count=5)
    got = [(m.key, dict(m.headers)["id"], dict(m.headers)["cdc_outbox.error"]) for m in letters]
    b_ids = [str(e.event_id).encode() for e in first + second if e.aggregate_id == "b"]
    assert [k for k, _i, _r in got] == [b"b"] * 5
    assert [i for _k, i, _r in got] == b_ids[1:]  # n = 2..6, in order
    assert got[0][2] == (
        b"handler failed after 3 attempt(s): RuntimeError: cannot apply poison event n=2"
    )
    assert {r for _k, _i, r in got[1:]} == {f"blocked_by {poison_id}".encode()}
    headers = dict(letters[0].headers)
    assert headers["cdc_outbox.consumer"] == b"dlq-test"
    assert headers["cdc_outbox.original_topic"] == topic.encode()
    with psycopg.connect(pg_dsn) as conn:
        parked = conn.execute("SELECT topic, key, event_id FROM consumer_parked_keys").fetchall()
        done = conn.execute("SELECT count(*) FROM processed_events").fetchone()
    assert [(t, k, str(e)) for t, k, e in parked] == [(topic, "b", poison_id)]
    assert done == (17,)  # every event is finished: applied or dead-lettered
