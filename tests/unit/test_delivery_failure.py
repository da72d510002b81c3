"""Delivery reports reach their listener: a ReportingListener is its record's callback itself
(no wrapper), any other listener is wrapped; both get the record's headers back."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError

from cdc_outbox.errors import FailureClass
from cdc_outbox.kafka.delivery_failure import DeliveryFailure, Headers, ReportingListener
from cdc_outbox.kafka.publisher import KafkaPublisher


class _Message:
    def __init__(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        self._topic, self._key, self._value = topic, key, value

    def topic(self) -> str:
        return self._topic

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value


class _Client:
    """Keeps each callback; ``poll`` reports every record, failing those on ``bad`` topics."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.pending: list[tuple[Any, _Message]] = []

    def produce(
        self, topic: str, value: bytes | None, key: bytes | None, *, headers: Any, on_delivery: Any
    ) -> None:
        self.pending.append((on_delivery, _Message(topic, key, value)))

    def poll(self, timeout: float) -> int:
        pending, self.pending = self.pending, []
        for callback, msg in pending:
            err = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if msg.topic() == "bad" else None
            callback(err, msg)
        return len(pending)

    def __len__(self) -> int:
        return len(self.pending)


class _Outcomes:
    def __init__(self) -> None:
        self.delivered: list[tuple[str, Headers]] = []
        self.failed: list[DeliveryFailure] = []


class _Plain:
    """A listener the publisher wraps (a :class:`DeliveryListener` only)."""

    def __init__(self, outcomes: _Outcomes) -> None:
        self.outcomes = outcomes

    def delivered(self, topic: str, headers: Headers) -> None:
        self.outcomes.delivered.append((topic, headers))

    def failed(self, failure: DeliveryFailure) -> None:
        self.outcomes.failed.append(failure)


class _Reporting(_Plain, ReportingListener):
    """The same outcomes from a listener that is its own delivery callback."""


def _publisher() -> tuple[KafkaPublisher, _Client]:
    clients: list[_Client] = []

    def factory(config: dict[str, Any]) -> _Client:
        clients.append(_Client(config))
        return clients[0]

    publisher = KafkaPublisher({"bootstrap.servers": "none:9092"}, client=factory)
    return publisher, clients[0]


def test_a_reporting_listener_is_its_own_callback() -> None:
    publisher, client = _publisher()
    outcomes = _Outcomes()
    listener = _Reporting(outcomes)
    publisher.produce("good", b"k", b"v", [("id", b"1")], listener)
    assert client.pending[0][0] is listener
    publisher.produce("bad", b"k2", b"v2", [("id", b"2")], _Reporting(outcomes))
    assert publisher.poll(0) == 2
    assert outcomes.delivered == [("good", [("id", b"1")])]
    [failure] = outcomes.failed
    assert (failure.kind, failure.topic, failure.key, failure.value) == (
        FailureClass.DEAD_LETTER,
        "bad",
        b"k2",
        b"v2",
    )
    assert failure.headers == [("id", b"2")]


def test_any_other_listener_is_wrapped_and_told_the_same() -> None:
    publisher, client = _publisher()
    outcomes = _Outcomes()
    listener = _Plain(outcomes)
    publisher.produce("good", b"k", b"v", [("id", b"1")], listener)
    assert client.pending[0][0] is not listener
    publisher.produce("bad", b"k2", b"v2", [("id", b"2")], _Plain(outcomes))
    publisher.poll(0)
    assert outcomes.delivered == [("good", [("id", b"1")])]
    [failure] = outcomes.failed
    assert (failure.kind, failure.topic, failure.headers) == (
        FailureClass.DEAD_LETTER,
        "bad",
        [("id", b"2")],
    )
