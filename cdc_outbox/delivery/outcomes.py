"""The two interfaces through which delivery reports outcomes (no project imports).

- :class:`EventHandle`: given with each submitted event; told whether it was published,
  durably dead-lettered, or must be retried.
- :class:`PublishListener`: given to :class:`~cdc_outbox.delivery.engine.Delivery` at
  construction; told the id of every event Kafka acknowledged (exactly-once: only after the
  Kafka commit). Marking rows PUBLISHED (:mod:`cdc_outbox.cdc.published_marker`) is one such
  listener: delivery never imports the modes.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["EventHandle", "PublishListener"]


class EventHandle(Protocol):
    """How a mode learns the outcome of one submitted event."""

    def published(self, topic: str) -> None: ...

    def dead_lettered(self) -> None: ...

    def retry(self, reason: str) -> None: ...


class PublishListener(Protocol):
    """Told each acknowledged event id (the ``id`` header's bytes); must not block."""

    def add(self, event_id: bytes) -> None: ...
