"""The record types every stage shares: an outbox event mapped for Kafka, or its dead letter.

Plain data, no project imports (the bottom layer). ``headers`` start with ``("id", event id)``
as the mapper writes them; :attr:`OutboxRecord.event_id` is that id, carried separately so no
stage re-reads it from the headers.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DeadLetter", "OutboxRecord"]


@dataclass(slots=True)
class OutboxRecord:
    topic: str
    key: bytes
    value: bytes | None  # None: a tombstone (only from a mapper with tombstones=True)
    headers: list[tuple[str, bytes]]
    event_id: str


@dataclass(slots=True)
class DeadLetter:
    reason: str
    event_id: str | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    intended_topic: str | None
