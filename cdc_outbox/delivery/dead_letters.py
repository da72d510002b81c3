"""Dead-letter records: what goes to the dead-letter topic for an event that cannot be
published (pure, no I/O).

A dead-letter record keeps the event's key and headers, adds ``cdc_outbox.error`` (why) and
``cdc_outbox.original_topic`` (where it was headed), and keeps the value unless the value is
the problem (too large), in which case ``cdc_outbox.value_omitted: true`` says so. The outbox
row itself stays in the table, so nothing is lost: it can be re-driven once fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc_outbox.kafka.delivery_failure import DeliveryFailure, Headers
from cdc_outbox.records import DeadLetter, OutboxRecord

_VALUE_IS_THE_PROBLEM = frozenset({"MSG_SIZE_TOO_LARGE", "INVALID_MSG_SIZE"})


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    key: bytes | None
    value: bytes | None
    headers: Headers
    intended_topic: str


def dead_letter_record(problem: DeadLetter | DeliveryFailure) -> DeadLetterRecord:
    """The record to send to the dead-letter topic for ``problem``."""
    if isinstance(problem, DeadLetter):
        topic = problem.intended_topic or ""
        headers = [*problem.headers, *_error_headers(problem.reason, topic)]
        return DeadLetterRecord(problem.key, problem.value, headers, topic)
    reason = f"{problem.name}: {problem.reason}"
    headers = [*problem.headers, *_error_headers(reason, problem.topic)]
    value = problem.value
    if problem.name in _VALUE_IS_THE_PROBLEM:
        value = None
        headers.append(("cdc_outbox.value_omitted", b"true"))
    return DeadLetterRecord(problem.key, value, headers, problem.topic)


def _error_headers(reason: str, topic: str) -> Headers:
    return [
        ("cdc_outbox.error", reason.encode()),
        ("cdc_outbox.original_topic", topic.encode()),
    ]


def dead_letter_of(record: OutboxRecord, reason: str) -> DeadLetter:
    """The dead letter of ``record`` as mapped (JSON value, plain key)."""
    return DeadLetter(
        reason, record.event_id, record.key, record.value, record.headers, record.topic
    )


def event_id_of(headers: Headers) -> str | None:
    """The event id a record carries in its ``id`` header (None if it has none)."""
    for name, value in headers:
        if name == "id":
            return value.decode(errors="replace")
    return None
