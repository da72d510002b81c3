"""The transactional publisher and the checkpoint topic against a real broker."""

from __future__ import annotations

import pytest

from cdc_outbox.kafka import checkpoints
from cdc_outbox.kafka.delivery_failure import DeliveryFailure, Headers
from cdc_outbox.kafka.publisher import KafkaPublisher, TransactionFailed
from cdc_outbox_dev.readback import read_topics


class _Count:
    def __init__(self) -> None:
        self.ok = 0
        self.failed: list[DeliveryFailure] = []

    def delivered(self, topic: str, headers: Headers) -> None:
        self.ok += 1

    def failed(self, failure: DeliveryFailure) -> None:
        self.failed.append(failure)


def test_checkpoint_read_committed_sees_only_committed_and_newer_instance_fences(
    kafka_broker, kafka_topic_prefix: str
) -> None:
    config = {"bootstrap.servers": kafka_broker.bootstrap_servers}
    topic = f"{kafka_topic_prefix}.ckpt"
    data = f"{kafka_topic_prefix}.event.x"
    checkpoints.ensure_topic(config, topic)
    checkpoints.ensure_topic(config, topic)  # idempotent
    key = checkpoints.checkpoint_key("42", "db", "slot")
    assert checkpoints.read_last(config, topic, key, timeout=30) is None

    first = KafkaPublisher(config, transactional_id=f"{kafka_topic_prefix}-txn")
    first.init_transactions(30)
    count = _Count()
    for lsn in (100, 200):
        first.produce(data, b"k", str(lsn).encode(), [("id", b"x")], count)
        ckpt = checkpoints.Checkpoint("slot", "42", "db", lsn)
        first.produce(topic, ckpt.key, ckpt.encode(), [], count)
        first.commit(30)
    # A third transaction is flushed to the broker but never committed.
    first.produce(data, b"k", b"300", [("id", b"x")], count)
    ckpt = checkpoints.Checkpoint("slot", "42", "db", 300)
    first.produce(topic, ckpt.key, ckpt.encode(), [], count)
    assert first.flush(30) == 0
    assert count.ok == 6 and not count.failed

    # A new instance with the same transactional.id fences the first and aborts its open txn.
    second = KafkaPublisher(config, transactional_id=f"{kafka_topic_prefix}-txn")
    second.init_transactions(60)
    last = checkpoints.read_last(config, topic, key, timeout=30)
    assert last is not None and last.end_lsn == 200
    with pytest.raises(TransactionFailed) as failed:
        first.commit(10)
    assert failed.value.fatal

    # Checkpoints of other slots after ours: found by reading backwards in growing windows.
    for n in range(7):
        other = checkpoints.Checkpoint(f"other{n}", "42", "db", 999)
        second.produce(topic, other.key, other.encode(), [], count)
    second.commit(30)
    for window in (2, 1000):
        found = checkpoints.read_last(config, topic, key, timeout=30, window=window)
        assert found is not None and found.end_lsn == 200, window
    assert checkpoints.read_last(config, topic, b"nobody", timeout=30, window=8) is None

    committed = read_topics(
        kafka_broker.bootstrap_servers, data, extra_config={"isolation.level": "read_committed"}
    )
    uncommitted = read_topics(
        kafka_broker.bootstrap_servers, data, extra_config={"isolation.level": "read_uncommitted"}
    )
    assert sorted(r.value for r in committed) == [b"100", b"200"]
    assert sorted(r.value for r in uncommitted) == [b"100", b"200", b"300"]
    second.close()


def test_deferred_records_go_into_the_next_transaction_in_order_or_nowhere(
    kafka_broker, kafka_topic_prefix: str
) -> None:
    """While a transaction closes, produce() holds records back: none of them is in the
    committed transaction, release() produces them in order into the next one, abort() drops
    them, and a release interrupted midway keeps the rest ahead of later records."""
    from cdc_outbox.kafka.publisher import ProduceInterrupted

    config = {"bootstrap.servers": kafka_broker.bootstrap_servers}
    data = f"{kafka_topic_prefix}.event.d"
    publisher = KafkaPublisher(config, transactional_id=f"{kafka_topic_prefix}-defer")
    publisher.init_transactions(30)
    count = _Count()
    publisher.produce(data, b"k", b"1", [], count)
    publisher.defer()
    for value in (b"2", b"3"):
        publisher.produce(data, b"k", value, [], count)
    assert publisher.deferring and len(publisher) == publisher.unacknowledged + 2
    assert publisher.flush(30) == 0 and len(publisher) == 2  # only the held-back ones left
    assert publisher.unacknowledged == 0 and count.ok == 1
    publisher.commit(30)  # holds "1" only
    publisher.release()
    assert not publisher.deferring
    publisher.produce(data, b"k", b"4", [], count)
    publisher.commit(30)  # "2", "3", "4"

    publisher.defer()
    publisher.produce(data, b"k", b"dropped", [], count)
    publisher.abort(30)
    assert not publisher.deferring and len(publisher) == 0

    publisher.commit(30)  # empty
    publisher.close()

    # A queue of 2 records: a release interrupted while the queue is full keeps the rest
    # held back, ahead of what is produced later.
    small = KafkaPublisher(
        {**config, "queue.buffering.max.messages": "2"},
        transactional_id=f"{kafka_topic_prefix}-defer",
    )
    small.init_transactions(30)
    small.defer()
    for value in (b"5", b"6", b"7", b"8", b"9"):
        small.produce(data, b"k", value, [], count)
    with pytest.raises(ProduceInterrupted):
        small.release(interrupted=lambda: "stop")
    assert small.deferring
    small.produce(data, b"k", b"10", [], count)
    small.release()
    small.commit(30)
    assert not count.failed

    committed = read_topics(
        kafka_broker.bootstrap_servers, data, extra_config={"isolation.level": "read_committed"}
    )
    assert [r.value for r in committed] == [str(n).encode() for n in range(1, 11)]
    small.close()


def test_a_fenced_producer_with_records_in_flight_aborts_and_closes_without_raising(
    kafka_broker, kafka_topic_prefix: str
) -> None:
    """A zombie woken after a takeover: its next produce is refused as fenced; the abort says
    so as a fatal TransactionFailed, and nothing (poll, purge, close) raises librdkafka's
    KafkaException, which would end the process instead of the zombie standing by."""
    config = {"bootstrap.servers": kafka_broker.bootstrap_servers}
    data = f"{kafka_topic_prefix}.event.x"
    zombie = KafkaPublisher(config, transactional_id=f"{kafka_topic_prefix}-zombie")
    zombie.init_transactions(30)
    count = _Count()
    zombie.produce(data, b"k", b"1", [("id", b"1")], count)
    assert zombie.flush(30) == 0
    leader = KafkaPublisher(config, transactional_id=f"{kafka_topic_prefix}-zombie")
    leader.init_transactions(60)
    for n in range(5):
        zombie.produce(data, b"k", str(n).encode(), [("id", b"2")], count)
    zombie.flush(10)  # the broker refuses them: fenced
    zombie.poll(0)
    with pytest.raises(TransactionFailed) as failed:
        zombie.abort(10)
    assert failed.value.fatal and zombie.fatal_error is not None
    zombie.purge()
    zombie.close(1)
    leader.close()
