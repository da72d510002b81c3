"""``cdc-outbox consume`` with JSON logs while its broker is down (issue 27): every line it
writes is a JSON log record (librdkafka's own lines go through ``logging``), repeated lines
are throttled, and a user setting it overrides is named once."""

from __future__ import annotations

import json
import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from cdc_outbox_dev.sandbox.kafka import LocalKafka
from tests.support.consumer import (
    ConsumerProcess,
    OutboxEvent,
    count_rows,
    counter_topics,
    produce_events,
)
from tests.support.helpers import wait_until

#: Lines allowed while the broker is down: a few distinct ones, each at most once per 30 s.
#: Before the throttle: about 40 lines per second, half of them raw ``%3|...`` lines.
DOWN_LINES_MAX = 15


def _lines(consumer: ConsumerProcess) -> list[str]:
    return [line for line in consumer.log_path.read_text(errors="replace").splitlines() if line]


def _committed(bootstrap: str, group: str, topic: str) -> int:
    client = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = client.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        client.close()


def test_broker_down_logs_few_json_lines_and_an_override_is_named_once(
    pg_dsn: str, kafka_broker: LocalKafka, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic, _dlq = counter_topics(pg_dsn, bootstrap, kafka_topic_prefix, 1)
    produce_events(bootstrap, topic, [OutboxEvent(uuid.uuid4(), "k", 1)])
    consumer = ConsumerProcess(
        f"consumer-kafka-down-{kafka_topic_prefix}", pg_dsn, bootstrap,
        "--handler", "tests.support.consumer_handlers:count", "--topic", topic,
        "--group", f"{kafka_topic_prefix}-g", "--kafka-config", "enable.auto.commit=true",
        env={"CDC_OUTBOX_LOG_FORMAT": "json"},
    )  # fmt: skip
    try:
        consumer.start()
        wait_until(lambda: count_rows(pg_dsn, "applied") == 1, timeout=90,
                   message=consumer.log_tail)  # fmt: skip
        # The offset is committed first: a synchronous commit the broker's exit cuts off
        # waits for its request to time out, and logs are written as the loop goes on.
        wait_until(lambda: _committed(bootstrap, f"{kafka_topic_prefix}-g", topic) == 1,
                   timeout=60)  # fmt: skip
        before = len(_lines(consumer))
        kafka_broker.stop()
        down_at = time.monotonic()
        # librdkafka notices at once and retries every second or so (reconnect.backoff):
        # give it 8 s of retries; the bound below does not depend on how many there were.
        wait_until(lambda: time.monotonic() - down_at > 8, timeout=30)
        assert consumer.alive, consumer.log_tail()
        lines = _lines(consumer)
    finally:
        consumer.stop_quietly()
        if not kafka_broker.is_running():
            kafka_broker.start()
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"not a JSON log line: {line!r}") from None
    down = records[before:]
    assert 1 <= len(down) <= DOWN_LINES_MAX, "\n".join(lines[before:])
    assert any(r["logger"].startswith("cdc_outbox.") for r in down)
    overrides = [
        r for r in records if "enable.auto.commit=true overridden to false" in r["message"]
    ]
    assert len(overrides) == 1, lines
