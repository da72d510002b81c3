"""Dead-letter records keep what is known about the event and say why."""

from __future__ import annotations

from cdc_outbox.delivery.dead_letters import dead_letter_record
from cdc_outbox.errors import FailureClass
from cdc_outbox.kafka.delivery_failure import DeliveryFailure
from cdc_outbox.records import DeadLetter


def test_mapping_problem_keeps_key_value_headers_and_names_the_reason() -> None:
    problem = DeadLetter(
        reason="column 'payload' is null",
        event_id="e-1",
        key=b"agg-1",
        value=None,
        headers=[("id", b"e-1")],
        intended_topic="outbox.event.order",
    )
    record = dead_letter_record(problem)
    assert record.key == b"agg-1"
    assert record.value is None
    assert record.intended_topic == "outbox.event.order"
    assert record.headers == [
        ("id", b"e-1"),
        ("cdc_outbox.error", b"column 'payload' is null"),
        ("cdc_outbox.original_topic", b"outbox.event.order"),
    ]


def test_too_large_value_is_omitted_and_flagged() -> None:
    failure = DeliveryFailure(
        code=10,
        name="MSG_SIZE_TOO_LARGE",
        reason="Broker: Message size too large",
        kind=FailureClass.DEAD_LETTER,
        alert=None,
        topic="outbox.event.order",
        key=b"agg-2",
        value=b"x" * 2_000_000,
        headers=[("id", b"e-2")],
    )
    record = dead_letter_record(failure)
    assert record.value is None
    assert ("cdc_outbox.value_omitted", b"true") in record.headers
    assert (
        "cdc_outbox.error",
        b"MSG_SIZE_TOO_LARGE: Broker: Message size too large",
    ) in record.headers
    assert record.key == b"agg-2"


def test_other_permanent_failure_keeps_the_value() -> None:
    failure = DeliveryFailure(
        code=87,
        name="INVALID_RECORD",
        reason="Broker: Invalid record",
        kind=FailureClass.DEAD_LETTER,
        alert=None,
        topic="secret.topic",
        key=b"k",
        value=b'{"a": 1}',
        headers=[],
    )
    record = dead_letter_record(failure)
    assert record.value == b'{"a": 1}'
    assert record.intended_topic == "secret.topic"
    assert not any(name == "cdc_outbox.value_omitted" for name, _ in record.headers)
