"""The checkpoint read against another producer's open transaction on the shared checkpoint
partition (issue 37 item 4): a read_committed consumer stops at the last stable offset, the
first offset of the oldest open transaction, so the relay's own later checkpoints are past it."""

from __future__ import annotations

import pytest

from cdc_outbox.kafka import checkpoints
from cdc_outbox.kafka.delivery_failure import DeliveryFailure, Headers
from cdc_outbox.kafka.publisher import KafkaPublisher


class _Count:
    def __init__(self) -> None:
        self.ok = 0
        self.failed: list[DeliveryFailure] = []

    def delivered(self, topic: str, headers: Headers) -> None:
        self.ok += 1

    def failed(self, failure: DeliveryFailure) -> None:
        self.failed.append(failure)


def _checkpoint(publisher: KafkaPublisher, topic: str, end_lsn: int, count: _Count) -> None:
    record = checkpoints.Checkpoint("slot", "42", "db", end_lsn, producer="a")
    publisher.produce(topic, record.key, record.encode(), [], count)


def test_another_producers_open_transaction_never_hides_our_latest_checkpoint(
    kafka_broker, kafka_topic_prefix: str
) -> None:
    """Relay A commits checkpoints; producer B (another relay) opens a transaction on the same
    partition and leaves it open; A commits more and aborts one. A's reader never answers with
    a checkpoint older than its latest committed one: while the other transaction is open it
    waits, raising TimeoutError at its deadline (the relay retries), and once it ended it finds
    the latest committed one (not the aborted one). Our checkpoints all before the open
    transaction are found at once."""
    config = {"bootstrap.servers": kafka_broker.bootstrap_servers}
    topic = f"{kafka_topic_prefix}.ckpt"
    checkpoints.ensure_topic(config, topic)
    key = checkpoints.checkpoint_key("42", "db", "slot")
    count = _Count()
    a = KafkaPublisher(config, transactional_id=f"{kafka_topic_prefix}-a")
    a.init_transactions(30)
    _checkpoint(a, topic, 100, count)
    a.commit(30)

    b = KafkaPublisher(config, transactional_id=f"{kafka_topic_prefix}-b")
    b.init_transactions(30)
    other = checkpoints.Checkpoint("other", "42", "db", 7, producer="b")
    b.produce(topic, other.key, other.encode(), [], count)
    assert b.flush(30) == 0  # on the broker: the partition's LSO stays at this record

    # Nothing of ours past the open transaction: found at once, no wait.
    last = checkpoints.read_last(config, topic, key, timeout=10)
    assert last is not None and last.end_lsn == 100

    for lsn in (200, 300):
        _checkpoint(a, topic, lsn, count)
        a.commit(30)
    _checkpoint(a, topic, 400, count)
    assert a.flush(30) == 0
    a.abort(30)  # an aborted checkpoint past the LSO too: never taken
    assert count.ok == 5 and not count.failed

    # B is still open: the read waits for it and gives up at its deadline (the relay then
    # retries the session); the code before answered at once with 100.
    with pytest.raises(TimeoutError, match="open transaction"):
        checkpoints.read_last(config, topic, key, timeout=3)

    b.abort(30)
    last = checkpoints.read_last(config, topic, key, timeout=30)
    assert last is not None and last.end_lsn == 300, last
    a.close()
    b.close()


def test_waiting_for_the_other_transaction_is_bounded_by_the_read_timeout(
    kafka_broker, kafka_topic_prefix: str
) -> None:
    """While the other transaction stays open, the read gives up with TimeoutError at its
    deadline (the relay retries the session), never with the checkpoint before it."""
    config = {"bootstrap.servers": kafka_broker.bootstrap_servers}
    topic = f"{kafka_topic_prefix}.ckpt"
    checkpoints.ensure_topic(config, topic)
    key = checkpoints.checkpoint_key("42", "db", "slot")
    count = _Count()
    a = KafkaPublisher(config, transactional_id=f"{kafka_topic_prefix}-a")
    a.init_transactions(30)
    _checkpoint(a, topic, 100, count)
    a.commit(30)
    b = KafkaPublisher(config, transactional_id=f"{kafka_topic_prefix}-b")
    b.init_transactions(30)
    other = checkpoints.Checkpoint("other", "42", "db", 7, producer="b")
    b.produce(topic, other.key, other.encode(), [], count)
    assert b.flush(30) == 0
    _checkpoint(a, topic, 200, count)
    a.commit(30)
    with pytest.raises(TimeoutError, match="open transaction"):
        checkpoints.read_last(config, topic, key, timeout=2)
    b.commit(30)
    last = checkpoints.read_last(config, topic, key, timeout=30)
    assert last is not None and last.end_lsn == 200
    a.close()
    b.close()
