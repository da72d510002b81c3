"""Errors the consumer's own transaction meets (issue 23): a COMMIT that fails (a deferred
constraint the handler violated) is handled like a failing handler, and a connection the
server terminates mid-batch loses only that transaction: no handler runs again for an event
after the one being handled when the connection went, and none runs three times."""

from __future__ import annotations

import collections
import threading
import uuid
from collections import defaultdict
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from cdc_outbox.consumer import ConsumerSettings, Event, IdempotentConsumer
from cdc_outbox_dev.sandbox.kafka import LocalKafka
from tests.support.consumer import OutboxEvent, applied_rows, counter_topics, produce_events
from tests.support.consumer_handlers import count
from tests.support.helpers import consume_all, wait_until
from tests.support.relay import running

#: A constraint checked only at COMMIT: a dangling row makes the COMMIT fail, not the INSERT.
DEFERRED_DDL = """
CREATE TABLE parent (id int PRIMARY KEY);
CREATE TABLE child (
    parent_id int NOT NULL REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED
)
"""


def _count_or_dangle(conn: psycopg.Connection[Any], event: Event) -> None:
    """Applies the event; a ``"dangle"`` event also leaves a row the deferred FK refuses."""
    count(conn, event)
    if event.payload.get("dangle"):
        conn.execute("INSERT INTO child (parent_id) VALUES (42)")


def test_a_commit_that_fails_is_retried_then_dead_lettered_and_the_key_parked(
    pg_dsn: str, kafka_broker: LocalKafka, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic, dlq = counter_topics(pg_dsn, bootstrap, kafka_topic_prefix, 2, DEFERRED_DDL)
    events = [
        OutboxEvent(uuid.uuid4(), k, n, {"dangle": True} if (k, n) == ("b", 2) else None)
        for n in range(1, 6)
        for k in ("a", "b", "c")
    ]
    produce_events(bootstrap, topic, events)
    settings = ConsumerSettings(
        consumer_name="commit-errors", group_id=f"{kafka_topic_prefix}-g", topics=(topic,),
        bootstrap_servers=bootstrap, dead_letter_topic=dlq, max_attempts=3,
        retry_backoff_s=0.05,
    )  # fmt: skip
    with ConnectionPool(pg_dsn, min_size=1, max_size=2) as pool:
        consumer = IdempotentConsumer(settings, pool, _count_or_dangle)
        with running(consumer):  # re-raises what run() raised: before the fix, the error
            wait_until(
                lambda: (
                    consumer.metrics.counts["processed"] == 11
                    and consumer.metrics.counts["dead_lettered"] == 4
                ),
                timeout=60,
                message=lambda: str(consumer.metrics.counts),
            )
    assert consumer.metrics.counts == {
        "processed": 11, "duplicate": 0, "dead_lettered": 4, "retried": 2,
    }  # fmt: skip
    applied: dict[str, list[int]] = defaultdict(list)
    for _seq, _eid, agg, n in applied_rows(pg_dsn):
        applied[agg].append(n)
    assert dict(applied) == {"a": [1, 2, 3, 4, 5], "b": [1], "c": [1, 2, 3, 4, 5]}
    letters = consume_all(bootstrap, [dlq], expected_count=4)
    reasons = [(dict(m.headers)["cdc_outbox.error"] or b"").decode() for m in letters]
    assert reasons[0].startswith("commit failed after 3 attempt(s): ForeignKeyViolation: "), (
        reasons[0]
    )
    poison = next(e.event_id for e in events if e.extra)
    assert set(reasons[1:]) == {f"blocked_by {poison}"}
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM child").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM processed_events").fetchone() == (15,)
        parked = conn.execute("SELECT key, event_id FROM consumer_parked_keys").fetchall()
    assert parked == [("b", poison)]


class _TerminatesItsConnection:
    """Counts every call (the handler's "external side effect"); when it handles event
    ``victim`` the first time, it has the server terminate the consumer's own connection and
    waits until that backend is gone."""

    def __init__(self, dsn: str, victim: uuid.UUID) -> None:
        self.dsn = dsn
        self.victim = victim
        self.calls: collections.Counter[uuid.UUID] = collections.Counter()
        self.order: list[uuid.UUID] = []
        self.killed = threading.Event()

    def __call__(self, conn: psycopg.Connection[Any], event: Event) -> None:
        self.calls[event.event_id] += 1
        self.order.append(event.event_id)
        count(conn, event)
        if event.event_id == self.victim and not self.killed.is_set():
            pid = conn.info.backend_pid
            with psycopg.connect(self.dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                wait_until(
                    lambda: admin.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
                    ).fetchone() == (0,),
                    timeout=30,
                )  # fmt: skip
            self.killed.set()


def test_a_connection_lost_mid_batch_redoes_only_what_its_transaction_had_handled(
    pg_dsn: str, kafka_broker: LocalKafka, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic, _dlq = counter_topics(pg_dsn, bootstrap, kafka_topic_prefix, 1)
    events = [OutboxEvent(uuid.uuid4(), f"k-{i % 7}", i // 7 + 1) for i in range(300)]
    produce_events(bootstrap, topic, events)  # all there before the consumer polls
    victim = events[100].event_id
    handler = _TerminatesItsConnection(pg_dsn, victim)
    settings = ConsumerSettings(
        consumer_name="lost-connection", group_id=f"{kafka_topic_prefix}-g", topics=(topic,),
        bootstrap_servers=bootstrap, retry_backoff_s=0.05,
    )  # fmt: skip
    with ConnectionPool(pg_dsn, min_size=1, max_size=2) as pool:
        consumer = IdempotentConsumer(settings, pool, handler)
        with running(consumer):
            wait_until(
                lambda: consumer.metrics.counts["processed"] == len(events),
                timeout=60,
                message=lambda: str(consumer.metrics.counts),
            )
    assert handler.killed.is_set()
    ids = [e.event_id for e in events]
    twice = {i for i, n in handler.calls.items() if n == 2}
    assert max(handler.calls.values()) == 2
    assert victim in twice
    # Seen twice: a run of events ending with the victim (its lost transaction); nothing
    # after it ran in that transaction, so nothing after it ran twice.
    at = ids.index(victim)
    first_twice = min(ids.index(i) for i in twice)
    assert twice == set(ids[first_twice : at + 1]), sorted(ids.index(i) for i in twice)
    assert handler.order[: at + 1] == ids[: at + 1]
    assert handler.order[at + 1] == ids[first_twice], "the redo starts at the lost transaction"
    rows = applied_rows(pg_dsn)
    assert [eid for _s, eid, _a, _n in rows] == [str(i) for i in ids]  # once each, in order
