"""The idempotent consumer: apply each outbox event once, in order per key (docs/consumers.md).

``IdempotentConsumer(settings, pool, handler).run()``; ``handler(conn, event)`` runs in the
transaction that records the event in ``processed_events``. Names are imported lazily so
that importing :mod:`cdc_outbox.consumer.settings` does not load the Kafka client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdc_outbox.consumer.event_types import Event
    from cdc_outbox.consumer.events import json_value
    from cdc_outbox.consumer.loop import Handler, IdempotentConsumer
    from cdc_outbox.consumer.settings import ConsumerSettings

__all__ = ["ConsumerSettings", "Event", "Handler", "IdempotentConsumer", "json_value"]

_HOME = {
    "Event": "cdc_outbox.consumer.event_types",
    "json_value": "cdc_outbox.consumer.events",
    "Handler": "cdc_outbox.consumer.loop",
    "IdempotentConsumer": "cdc_outbox.consumer.loop",
    "ConsumerSettings": "cdc_outbox.consumer.settings",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(name)
