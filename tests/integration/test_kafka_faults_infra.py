"""The strict session broker really causes the two Kafka faults the relay must classify, with an
idempotent producer configured like the relay's (acks=all, message.timeout.ms=0).

Missing topic (``auto.create.topics.enable=false``): ``produce()`` queues the record; librdkafka
waits ``topic.metadata.propagation.max.ms`` (default 30 s, counted from when the producer first
saw the topic, not per record) for the topic to appear, then fails every queued record with
UNKNOWN_TOPIC_OR_PART (3) in the delivery report (not _UNKNOWN_TOPIC; retriable() and fatal()
both False, partition unassigned). From then on ``produce()`` raises _UNKNOWN_TOPIC (-188) until
the producer's next topic scan (~1 s) after the topic is created. A topic created within the
wait gets the queued records delivered, in order.

Write denied (DENY WRITE ACL for User:ANONYMOUS): in-flight records fail in the delivery report
and new ``produce()`` calls raise, both with TOPIC_AUTHORIZATION_FAILED (29), which is neither
retriable nor fatal: the idempotent producer bumps its epoch and carries on. Once the ACL is
deleted, produce succeeds again within ~0.5 s; the denied records were never written.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from cdc_outbox.kafka.producer_config import DEFAULT_CONFIG, REQUIRED_CONFIG
from cdc_outbox_dev.sandbox.kafka import LocalKafka
from tests.support.helpers import (
    allow_topic_writes,
    consume_all,
    create_topic,
    deny_topic_writes,
    wait_until,
)


class Outcome:
    """What became of one record: ``error`` is None once delivered; ``raised`` tells whether
    ``produce()`` itself rejected it (else the delivery report decided)."""

    def __init__(self) -> None:
        self.done = False
        self.raised = False
        self.error: KafkaError | None = None

    def report(self, err: KafkaError | None, _msg: Any) -> None:
        self.done, self.error = True, err


@pytest.fixture
def producer(kafka_strict_broker: LocalKafka) -> Iterator[Producer]:
    """A producer configured like the relay's, reporting fatal errors as test failures."""
    fatal: list[str] = []
    config = {
        **DEFAULT_CONFIG,
        **REQUIRED_CONFIG,
        "bootstrap.servers": kafka_strict_broker.bootstrap_servers,
        "error_cb": lambda err: fatal.append(err.str()) if err.fatal() else None,
    }
    made = Producer(config)
    yield made
    made.purge()
    made.flush(5)
    assert not fatal, f"fatal producer errors: {fatal}"


def produce(producer: Producer, topic: str, value: bytes) -> Outcome:
    """Produce one record; a rejection by ``produce()`` itself is recorded, not raised."""
    outcome = Outcome()
    try:
        producer.produce(topic, value, key=value, on_delivery=outcome.report)
    except KafkaException as exc:
        outcome.done, outcome.raised, outcome.error = True, True, exc.args[0]
    return outcome


def settle(producer: Producer, outcome: Outcome, timeout: float = 15.0) -> Outcome:
    """Serve delivery reports until ``outcome`` is known."""
    wait_until(lambda: producer.poll(0.05) >= 0 and outcome.done, timeout, message="no report")
    return outcome


def produce_until_accepted(producer: Producer, topic: str, value: bytes) -> Outcome:
    """Produce, retrying while ``produce()`` rejects the record with the producer's stale
    view of the topic (it refreshes within about a second); return the settled outcome."""
    outcome = wait_until(
        lambda: (o := produce(producer, topic, value)).raised is False and o,
        timeout=10,
        message=f"produce() to {topic} kept raising",
    )
    return settle(producer, outcome)


def topic_exists(bootstrap: str, topic: str) -> bool:
    return topic in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics


def assert_error(outcome: Outcome, code: int) -> None:
    assert outcome.error is not None, "the record was delivered"
    assert outcome.error.code() == code, outcome.error
    assert not outcome.error.fatal() and not outcome.error.retriable(), outcome.error


# -- missing topic -------------------------------------------------------------------------


def test_missing_topic_fails_delivery_then_produce_until_created(
    kafka_strict_broker: LocalKafka, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_strict_broker.bootstrap_servers
    topic = f"{kafka_topic_prefix}.missing"
    # The relay's config, but give up on a missing topic after 1 s instead of 30 s.
    quick = Producer(
        {
            **DEFAULT_CONFIG,
            **REQUIRED_CONFIG,
            "bootstrap.servers": bootstrap,
            "topic.metadata.propagation.max.ms": 1000,
        }
    )
    began = time.monotonic()
    first = produce(quick, topic, b"queued")
    assert not first.raised  # an unknown topic is first waited for, not rejected
    settle(quick, first)
    waited = time.monotonic() - began
    assert_error(first, KafkaError.UNKNOWN_TOPIC_OR_PART)
    assert 0.9 <= waited < 10, f"delivery failed after {waited:.2f}s"
    assert not topic_exists(bootstrap, topic)  # the broker did not auto-create it

    known_missing = produce(quick, topic, b"rejected")
    assert known_missing.raised
    assert_error(known_missing, KafkaError._UNKNOWN_TOPIC)

    create_topic(bootstrap, topic)
    delivered = produce_until_accepted(quick, topic, b"after-create")
    assert delivered.error is None, delivered.error
    assert quick.flush(10) == 0
    records = consume_all(bootstrap, [topic], expected_count=1, timeout=15)
    assert [r.value for r in records] == [b"after-create"]


def test_records_queued_for_a_missing_topic_are_delivered_once_it_is_created(
    kafka_strict_broker: LocalKafka, kafka_topic_prefix: str, producer: Producer
) -> None:
    bootstrap = kafka_strict_broker.bootstrap_servers
    topic = f"{kafka_topic_prefix}.late"
    outcomes = [produce(producer, topic, b"k%d" % i) for i in range(3)]
    missing = producer.list_topics(topic, timeout=10).topics[topic].error
    assert missing is not None and missing.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    producer.poll(0.5)
    assert not any(o.done for o in outcomes)  # held, neither delivered nor failed
    assert not topic_exists(bootstrap, topic)

    create_topic(bootstrap, topic, partitions=1)
    assert producer.flush(15) == 0
    assert [o.error for o in outcomes] == [None, None, None]
    records = consume_all(bootstrap, [topic], expected_count=3, timeout=15)
    assert [r.value for r in records] == [b"k0", b"k1", b"k2"]


# -- topic authorization -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefixed", "readable"),
    [(False, True), (True, True), (False, False)],
    ids=["literal", "prefixed", "literal-unreadable"],
)
def test_denied_topic_writes_fail_with_authorization_error_until_allowed(
    kafka_strict_broker: LocalKafka,
    kafka_topic_prefix: str,
    producer: Producer,
    prefixed: bool,
    readable: bool,
) -> None:
    bootstrap = kafka_strict_broker.bootstrap_servers
    topic, bystander = f"{kafka_topic_prefix}.denied", f"other-{kafka_topic_prefix}"
    create_topic(bootstrap, topic)
    create_topic(bootstrap, bystander)
    assert settle(producer, produce(producer, topic, b"before")).error is None

    deny_topic_writes(
        bootstrap, kafka_topic_prefix if prefixed else topic, prefixed=prefixed, readable=readable
    )
    denied = settle(producer, produce(producer, topic, b"denied"))
    assert_error(denied, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert settle(producer, produce(producer, bystander, b"unaffected")).error is None
    visible = producer.list_topics(topic, timeout=10).topics[topic].error
    if readable:
        assert visible is None
    else:
        assert visible is not None and visible.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    allow_topic_writes(bootstrap, kafka_topic_prefix if prefixed else topic, prefixed=prefixed)
    after = produce_until_accepted(producer, topic, b"after")
    assert after.error is None, after.error
    records = consume_all(bootstrap, [topic], until_idle_s=0.5, timeout=15)
    assert sorted(r.value or b"" for r in records) == [b"after", b"before"]  # denied: never written


def test_acls_left_by_a_test(kafka_strict_broker: LocalKafka) -> None:
    deny_topic_writes(kafka_strict_broker.bootstrap_servers, "*")  # the fixture must delete it


def test_strict_broker_was_healed(
    kafka_strict_broker: LocalKafka, kafka_topic_prefix: str, producer: Producer
) -> None:
    topic = f"{kafka_topic_prefix}.healed"
    create_topic(kafka_strict_broker.bootstrap_servers, topic)
    assert settle(producer, produce(producer, topic, b"v")).error is None
