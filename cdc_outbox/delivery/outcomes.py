"""The two interfaces through which delivery reports outcomes (no project imports).

- :class:`EventHandle`: given with each submitted event; told whether it was published,
  durably dead-lettered, or must be retried.
- :class:`PublishListener`: given to :class:`~cdc_outbox.delivery.engine.Delivery` at
  construction; told the id of every event Kafka acknowledged (exactly-once: only after the
  Kafka commit), with the outbox it came from. Marking rows PUBLISHED
  (:mod:`cdc_outbox.cdc.published_marker`) is one such listener: delivery never imports the
  modes.

An event's *outbox* is the index of its outbox table in ``Settings.outbox_settings()`` (0: the
first, the only one of a single-table configuration), or :data:`TABLELESS` for a table-less
event (``message_prefix``): it has no row to mark, and its aggregates are those of the first
outbox (it is mapped like the first outbox's rows).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["TABLELESS", "EventHandle", "PublishListener"]

#: The outbox of a table-less event (no row: never marked; parked with the first outbox's).
TABLELESS = -1


class EventHandle(Protocol):
    """How a mode learns the outcome of one submitted event."""

    def published(self, topic: str) -> None: ...

    def dead_lettered(self) -> None: ...

    def retry(self, reason: str) -> None: ...


class PublishListener(Protocol):
    """Told each acknowledged event id (the ``id`` header's bytes) and its outbox (see the
    module doc); must not block."""

    def add(self, event_id: bytes, outbox: int = 0) -> None: ...
