"""Issue 37: a handler that raises ``SystemExit`` (any ``BaseException`` that is not a stop
request) stops ``cdc-outbox consume`` with a non-zero exit code and one line naming the
event; neither its ``processed_events`` row nor its offset is committed, so the next run
applies it (before: the process exited 0)."""

from __future__ import annotations

import uuid

import psycopg
from confluent_kafka import Consumer, TopicPartition

from cdc_outbox_dev.sandbox.kafka import LocalKafka
from tests.support.consumer import (
    ConsumerProcess,
    OutboxEvent,
    applied_rows,
    count_rows,
    counter_topics,
    produce_events,
    wait_processed,
)
from tests.support.helpers import wait_until


def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        return int(tp.offset)
    finally:
        consumer.close()


def test_a_handler_raising_system_exit_stops_non_zero_and_commits_nothing_of_its_event(
    pg_dsn: str, kafka_broker: LocalKafka, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic, dlq = counter_topics(pg_dsn, bootstrap, kafka_topic_prefix, 1)
    group = f"{kafka_topic_prefix}-g"
    events = [OutboxEvent(uuid.uuid4(), "a", n, {"exit": n == 6}) for n in range(1, 11)]
    args = ("--topic", topic, "--group", group, "--dead-letter-topic", dlq,
            "--kafka-config", "group.instance.id=exit-test-1")  # fmt: skip
    consumer = ConsumerProcess(
        f"consumer-exit-{kafka_topic_prefix}", pg_dsn, bootstrap,
        "--handler", "tests.support.consumer_handlers:count_but_exit", *args,
    )  # fmt: skip
    again = ConsumerProcess(
        f"consumer-exit-again-{kafka_topic_prefix}", pg_dsn, bootstrap,
        "--handler", "tests.support.consumer_handlers:count", *args,
    )  # fmt: skip
    try:
        produce_events(bootstrap, topic, events[:5])
        consumer.start()
        wait_until(lambda: count_rows(pg_dsn, "applied") == 5, 60, message=consumer.log_tail)
        produce_events(bootstrap, topic, events[5:])  # offset 5: the handler exits on it
        assert consumer.proc is not None
        code = consumer.proc.wait(60)
        log = consumer.log_tail()
        assert code == 1, log  # HandlerAborted's exit code (before: 0)
        assert "SystemExit" in log and str(events[5].event_id) in log, log
        with psycopg.connect(pg_dsn) as conn:
            done = {r[0] for r in conn.execute("SELECT event_id FROM processed_events")}
        assert done == {e.event_id for e in events[:5]}
        assert _committed(bootstrap, group, topic) == 5  # not past the event that exited

        again.start()  # the event is read again and applied, and the rest after it
        wait_processed(pg_dsn, 10, 60, again.log_tail)
        assert again.terminate() == 0, again.log_tail()
    finally:
        consumer.stop_quietly()
        again.stop_quietly()
    assert [(agg, n) for _s, _e, agg, n in applied_rows(pg_dsn)] == [("a", n) for n in range(1, 11)]
