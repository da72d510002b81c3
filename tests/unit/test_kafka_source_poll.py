"""``KafkaSource.poll`` hands over the records already fetched at once (issue 38 item 5).

librdkafka's ``consume(n, timeout)`` returns once it has ``n`` records *or* the timeout has
passed: with fewer than ``n`` records fetched it waits out the whole timeout. The consumer
loop polls with 0.5 s and ``poll_batch`` (500) records, so at 2,000 events/s each batch
waited for its 500th record, ~250 ms: end to end (writer commit -> applied by
``cdc-outbox consume``) p50 205 ms against the relay's 44 ms commit -> visible in the same
``compare --only eos-latency`` run (2026-12-04). The fake below models that contract: a call
that would wait for records that are not there is recorded.
"""

from __future__ import annotations

from typing import Any

from cdc_outbox.kafka.consumer import KafkaSource


class _Message:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"{}"

    def headers(self) -> list[tuple[str, bytes]]:
        return [("id", b"1")]


class _Consumer:
    """librdkafka's contract for what is fetched now: ``consume(n, timeout)`` with fewer than
    ``n`` fetched waits the whole timeout (recorded in ``waited``); ``poll`` returns the first
    fetched record at once, or waits the timeout for one."""

    def __init__(self, fetched: int) -> None:
        self.fetched = [_Message(i) for i in range(fetched)]
        self.waited: list[float] = []

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        if len(self.fetched) < num_messages and timeout > 0:
            self.waited.append(timeout)
        got, self.fetched = self.fetched[:num_messages], self.fetched[num_messages:]
        return got

    def poll(self, timeout: float) -> _Message | None:
        if not self.fetched:
            self.waited.append(timeout)
            return None
        return self.fetched.pop(0)


def _source(consumer: Any) -> KafkaSource:
    source = KafkaSource.__new__(KafkaSource)
    source._consumer = consumer
    return source


def test_records_already_fetched_are_returned_without_waiting_for_a_full_batch() -> None:
    consumer = _Consumer(fetched=3)
    records = _source(consumer).poll(0.5, 500)
    assert [r.offset for r in records] == [0, 1, 2]
    assert consumer.waited == []


def test_a_batch_is_capped_at_max_records_and_nothing_fetched_waits_the_timeout() -> None:
    consumer = _Consumer(fetched=7)
    source = _source(consumer)
    assert [r.offset for r in source.poll(0.5, 5)] == [0, 1, 2, 3, 4]
    assert [r.offset for r in source.poll(0.5, 5)] == [5, 6]
    assert consumer.waited == []
    assert source.poll(0.5, 5) == []
    assert consumer.waited == [0.5]
